"""What each cuda_src/*.cu is built with: its -D constants per (arch, mma form) and the dynamic
shared memory each of its kernels is launched with. The launch modules own the values; this
is where python -m h3kernels.compile_check reads them, so it checks exactly what runs."""
from h3kernels._launch import mlp_fp8, mlp_fp8_sm90a, varlen_attention_fp8, varlen_attention_fp8_sm90a, wgmma_ceiling

_OPS = {"mlp_fp8": mlp_fp8, "mlp_fp8_sm90a": mlp_fp8_sm90a, "varlen_attention_fp8": varlen_attention_fp8,
        "varlen_attention_fp8_sm90a": varlen_attention_fp8_sm90a, "wgmma_ceiling": wgmma_ceiling}
_FORM_ONLY = ("mma_ceiling",)  # the mma peer: only the form


def defines_for(source, arch, form=0):
    """The -D constants of cuda_src/<source>.cu for `arch` (e.g. 'sm_120a') and mma form `form`."""
    if source in _OPS:
        return _OPS[source].defines(arch, form)
    if source in _FORM_ONLY:
        return {"H3_MMA_FORM": form}
    return {}


def dynamic_smem(source):
    """{kernel: dynamic shared memory bytes per CTA} of cuda_src/<source>.cu ({} for none)."""
    op = _OPS.get(source)
    return dict(op.DYNAMIC_SMEM) if op else {}


def archs_for(source, default):
    """The archs cuda_src/<source>.cu is built for: its launch module's ARCHS (a source of
    arch-specific instructions, e.g. wgmma on sm_90a), else `default`."""
    op = _OPS.get(source)
    return tuple(getattr(op, "ARCHS", default))


def forms_for(source, arch, uses_mma, mma_forms):
    """The fp8_mma_form values cuda_src/<source>.cu is built for on `arch`: a family of its own
    (FORM of its launch module, e.g. 3 for the wgmma kernels), else the arch's mma.sync forms
    `mma_forms` where the source issues an mma, else one build (0)."""
    op = _OPS.get(source)
    if hasattr(op, "FORM"):
        return (op.FORM,)
    return tuple(mma_forms) if uses_mma else (0,)
