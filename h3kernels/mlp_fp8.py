"""minimax_h3_mlp_fp8: the fused W8A8 MLP block (docs/spec.md): the weight preparation, the row
stage (Numba: RMSNorm + indexed AdaLN + per-token e4m3 quantization), and the FC1 + SwiGLU and
FC2 + requantization + gated residual GEMMs of cuda_src/mlp_fp8.cu."""
from h3kernels import _validate as validate
from h3kernels import quantize
from h3kernels._launch import mlp_fp8 as launch
from h3kernels._launch import mlp_fp8_sm90a
from h3kernels._runtime import arrays, targets, workspace
from h3kernels._validate import mlp_fp8 as checks
from h3kernels.constants import FC1_OUT, FFN, HIDDEN

# The preparation runs on the weight's own device: CPU or CUDA torch tensors, or CuPy arrays.
_PREPARE_ARRAYS = validate.Accepted(("torch", "cupy"), "a torch tensor or a CuPy array")


def prepare_minimax_h3_fc1_weight_fp8(w1):
    """w1 [28672, 5376] float (rows 0..14335 gate, then up) -> (e4m3 q [28672, 5376], f32 scale
    [28672]) in the kernel's prepacked row order (see minimax_h3_fc1_row_order), per docs/spec.md.
    Torch tensors (CPU or CUDA) or CuPy arrays; the result is of the same kind and device."""
    return _prepare("w1", w1, (FC1_OUT, HIDDEN), quantize.fc1_weight)


def prepare_minimax_h3_fc2_weight_fp8(w2):
    """w2 [5376, 14336] float -> (e4m3 q [5376, 14336], f32 scale [5376]), logical row order."""
    return _prepare("w2", w2, (HIDDEN, FFN), quantize.fc2_weight)


def _prepare(name, w, shape, quantize):
    """Runs the contract's quantization (h3kernels.quantize) with torch on w's own device: every
    step (amax, an IEEE division by a tensor, RNE e4m3 with saturation) is exact or correctly
    rounded there, so the result is bitwise the reference's. CuPy arrays go through DLPack on CuPy's current stream."""
    import torch

    checks.weight(name, w, shape, _PREPARE_ARRAYS)
    if arrays.kind_of(w) == "torch":
        return quantize(w)
    import cupy

    bf16_bits = w.dtype.name in ("bfloat16", "uint16")
    t = torch.from_dlpack(w.view(cupy.int16) if bf16_bits else w)
    if bf16_bits:
        t = t.view(torch.bfloat16)
    with cupy.cuda.Device(w.device.id):
        ptr = cupy.cuda.get_current_stream().ptr
    # CuPy's null stream is torch's default stream; any other is wrapped as it is.
    stream = torch.cuda.default_stream(t.device) if ptr == 0 else torch.cuda.ExternalStream(ptr, device=t.device)
    with torch.cuda.stream(stream):
        q, s = quantize(t)
        q8 = cupy.from_dlpack(q.view(torch.uint8))
    return q8.view(arrays.cupy_dtype(arrays.E4M3)), cupy.from_dlpack(s)


def check_row_stage_args(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps,
                         workspace_a_q=None, workspace_a_scale=None):
    """Kinds, dtypes, shapes and layout (h3kernels._validate.mlp_fp8); returns eps as a float."""
    return checks.row_stage_args(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps,
                                 workspace_a_q, workspace_a_scale)


def minimax_h3_mlp_fp8_row_stage(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, *,
                                 workspace_a_q=None, workspace_a_scale=None, eps=1e-5):
    """The MLP's first stage alone: RMSNorm + indexed AdaLN + per-token e4m3 quantization.

    Returns (a_q e4m3 [M, 5376], a_scale f32 [M]) of the caller's kind, written into the
    workspaces when given. Bitwise equal to h3kernels.reference.
    """
    eps = check_row_stage_args(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps,
                               workspace_a_q, workspace_a_scale)
    named = dict(x=x, x_norm_weight=x_norm_weight, adaln_scale=adaln_scale, adaln_shift=adaln_shift,
                 adaln_index=adaln_index, workspace_a_q=workspace_a_q, workspace_a_scale=workspace_a_scale)
    call = arrays.Call(named)  # kind and device, once dtypes and shapes are known good
    m = x.shape[0]
    a_q = workspace_a_q if workspace_a_q is not None else call.empty((m, HIDDEN), arrays.E4M3)
    a_scale = workspace_a_scale if workspace_a_scale is not None else call.empty((m,), arrays.F32)
    previous = call.make_current()
    try:
        launch.launch_row(call, x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps, arrays.data_ptr(a_q),
                          arrays.data_ptr(a_scale))
    finally:
        arrays.restore(previous)
    return a_q, a_scale


def minimax_h3_mlp_fp8(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, gate, residual,
                      fc1_weight_q, fc1_weight_scale, fc2_weight_q, fc2_weight_scale, *, out=None,
                      workspace_a_q=None, workspace_a_scale=None, workspace_y=None, workspace_y_q=None,
                      workspace_y_scale=None, workspace_flags=None, eps=1e-5, fp8_mma_form=-1):
    """The fused W8A8 MLP block of MiniMax-H3 (docs/spec.md): returns out, bf16 [M, 5376], of the
    caller's kind. On the caller's current stream, no host sync: three launches (fp8_mma_form 0
    and 2) or four (form 3); the first, the row kernel, also zeroes FC2's flags or the split
    counters of the GEMMs.
    Workspaces, when given, receive a_q, a_scale, y, y_q and y_scale (h3kernels.reference
    fills the same ones); out may be residual or x."""
    inputs = dict(x=x, x_norm_weight=x_norm_weight, adaln_scale=adaln_scale, adaln_shift=adaln_shift,
                  adaln_index=adaln_index, gate=gate, residual=residual, fc1_weight_q=fc1_weight_q,
                  fc1_weight_scale=fc1_weight_scale, fc2_weight_q=fc2_weight_q, fc2_weight_scale=fc2_weight_scale)
    given = dict(out=out, workspace_a_q=workspace_a_q, workspace_a_scale=workspace_a_scale,
                 workspace_y=workspace_y, workspace_y_q=workspace_y_q, workspace_y_scale=workspace_y_scale,
                 workspace_flags=workspace_flags)
    eps, facts = checks.checked_mlp_args(inputs, given, eps, fp8_mma_form)
    call = arrays.Call({**inputs, **given})  # kind and device, once dtypes and shapes are known good
    form = targets.operator_form(call.device_id, fp8_mma_form)
    m = x.shape[0]
    address = {name: f[3] for name, f in facts.items()}  # read once, by the checks

    # form 3's split workspace: the last wave's tiles split over K (mlp_fp8_sm90a.plan); it
    # has no flags
    wgmma = targets.form_family(form) == targets.WGMMA
    plan = mlp_fp8_sm90a.plan(call.device_id, m) if wgmma else None
    # the buffers between the launches: the caller's workspaces, else one scratch allocation,
    # held until the launches are queued
    ptr = {name: address.get(argument) for name, argument in _WORKSPACES}
    missing = tuple(name for name, p in ptr.items() if p is None and not (wgmma and name == "flags"))
    size, at = launch.scratch_layout(m, missing, plan.workspace_bytes if wgmma else 0)
    if size:
        scratch = workspace.scratch(call, size)
        base = arrays.data_ptr(scratch)
        for name, offset in at.items():
            ptr[name] = base + offset
    split = ptr.get("split")
    if out is None:
        out = call.empty((m, HIDDEN), arrays.BF16)
        out_ptr = arrays.data_ptr(out)
    else:
        out_ptr = address["out"]
    # the row kernel also clears what the GEMMs need zeroed: the FC2 flags, or the split counters
    zero = launch.gemm_zero_words(form, m, ptr["flags"], split, plan.counter_bytes if wgmma else 0)
    row = launch.row_values_at(m, address["x"], address["x_norm_weight"], address["adaln_scale"],
                               address["adaln_shift"], arrays.strides_elems(adaln_scale)[0], adaln_scale.shape[0],
                               address["adaln_index"], eps, ptr["a_q"], ptr["a_scale"], *zero)
    previous = call.make_current()
    try:
        launch.launch_row_at(call, m, row)
        launch.launch_fc1(call, form, m, ptr["a_q"], ptr["a_scale"], address["fc1_weight_q"],
                          address["fc1_weight_scale"], ptr["y"], split)
        launch.launch_fc2(call, form, m, ptr["y"], ptr["y_q"], ptr["y_scale"], address["fc2_weight_q"],
                          address["fc2_weight_scale"], gate, address["adaln_index"], address["residual"], out_ptr,
                          ptr["flags"], split)
    finally:
        arrays.restore(previous)
    return out  # the scratch goes back to the caller's allocator, stream-ordered behind the launches


# the buffers between the launches and the workspace arguments that may hold them
_WORKSPACES = (("a_q", "workspace_a_q"), ("a_scale", "workspace_a_scale"), ("y", "workspace_y"),
               ("y_q", "workspace_y_q"), ("y_scale", "workspace_y_scale"), ("flags", "workspace_flags"))
