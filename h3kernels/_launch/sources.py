"""What each cuda_src/*.cu is built with: the builds that ship, per arch. The launch modules own
them (each exposes SOURCE, ARCHS and shipped_builds(arch): build values with defines(),
dynamic_smem(kernel) and the tuple `kernels`); this is where python -m h3kernels compile_check
reads them, so it checks exactly what runs. A source no launch module owns (a test kernel) is
built with its mma form alone where it issues an mma, else as it is."""
import dataclasses

from h3kernels._launch import mlp_fp8, mlp_fp8_sm90a, varlen_attention_fp8, varlen_attention_fp8_sm90a, wgmma_ceiling
from h3kernels._runtime import compiler, targets

_MODULES = {m.SOURCE: m for m in (mlp_fp8, mlp_fp8_sm90a, varlen_attention_fp8, varlen_attention_fp8_sm90a,
                                  wgmma_ceiling)}


def archs_for(source, default):
    """The archs cuda_src/<source>.cu is built for: its launch module's ARCHS within `default`'s
    families (a source of sm_90a instructions builds for sm_90a where sm_90 is asked), else
    `default`."""
    module = _MODULES.get(source)
    if module is None:  # a test kernel: the mma.sync archs asked for
        return tuple(a for a in default if a in targets.MMA_FORMS)
    return tuple(a for a in module.ARCHS if a in default or a.rstrip("a") in default)


def every_arch():
    """Every arch a source is built for, so every arch compile_check's table can show: the
    mma.sync archs (targets.MMA_FORMS) and those of the launch modules (sm_90a)."""
    return tuple(dict.fromkeys([*targets.MMA_FORMS, *(a for m in _MODULES.values() for a in m.ARCHS)]))


def builds_for(source, arch, uses_mma):
    """The builds of cuda_src/<source>.cu that ship for `arch` (build values; see the module
    docstring). uses_mma: whether the source issues an mma (for sources without a launch module:
    one build per mma form of the arch)."""
    module = _MODULES.get(source)
    if module is not None:
        return tuple(module.shipped_builds(arch))
    forms = targets.MMA_FORMS.get(arch, (0,)) if uses_mma else (None,)
    return tuple(compiler.PlainBuild(() if f is None else (("H3_MMA_FORM", f),)) for f in forms)


def label(build):
    """A build's short name in compile_check's table: its fields (or constants) that differ from
    their defaults, else 'shipped'. A field without a default (the arch) has its own column."""
    if isinstance(build, compiler.PlainBuild):
        return ",".join(f"{k}={v}" for k, v in build.constants) or "plain"
    fields = [f for f in dataclasses.fields(build)
              if f.default is not dataclasses.MISSING and getattr(build, f.name) != f.default]
    return ",".join(f"{f.name}={getattr(build, f.name)}" for f in fields) or "shipped"
