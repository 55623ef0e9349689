"""minimax_h3_mlp_fp8: the fused W8A8 MLP block (contract.md): the weight preparation, the row
stage (Numba: RMSNorm + indexed AdaLN + per-token e4m3 quantization), and the FC1 + SwiGLU and
FC2 + requantization + gated residual GEMMs of cuda_src/mlp_fp8.cu."""
from h3kernels import reference
from h3kernels._launch import mlp_fp8 as launch
from h3kernels._runtime import arrays, targets, validate
from h3kernels.constants import FC1_OUT, FFN, HIDDEN, MAX_M, fc2_flag_count

dispatch = arrays  # the name the argument checks below use (they move to h3kernels/_validate/)
mma_form = targets.mlp_mma_form  # fp8_mma_form -> the form that runs (-1: the board's; 3 on sm_90)

_WEIGHT_DTYPES = ("bfloat16", "float16", "float32")


def prepare_minimax_h3_fc1_weight_fp8(w1):
    """w1 [28672, 5376] float (rows 0..14335 gate, then up) -> (e4m3 q [28672, 5376], f32 scale
    [28672]) in the kernel's prepacked row order (see minimax_h3_fc1_row_order), per contract.md.
    Torch tensors (CPU or CUDA) or CuPy arrays; the result is of the same kind and device."""
    return _prepare("w1", w1, (FC1_OUT, HIDDEN), reference.prepare_minimax_h3_fc1_weight_fp8)


def prepare_minimax_h3_fc2_weight_fp8(w2):
    """w2 [5376, 14336] float -> (e4m3 q [5376, 14336], f32 scale [5376]), logical row order."""
    return _prepare("w2", w2, (HIDDEN, FFN), reference.prepare_minimax_h3_fc2_weight_fp8)


def _prepare(name, w, shape, quantize):
    """Runs the reference quantization with torch on w's own device: every step (amax, an IEEE
    division by a tensor, RNE e4m3 with saturation) is exact or correctly rounded there, so the
    result is bitwise the reference's. CuPy arrays go through DLPack on CuPy's current stream."""
    import torch

    kind = arrays.kind_of(w)
    if kind is None:
        validate.fail(name, type(w).__name__, "a torch tensor or a CuPy array", TypeError)
    if kind == "torch":
        if str(w.dtype).replace("torch.", "") not in _WEIGHT_DTYPES:
            validate.fail(name, w.dtype, "bfloat16, float16 or float32", TypeError)
    elif w.dtype.name not in _WEIGHT_DTYPES + ("uint16",):
        validate.fail(name, w.dtype, "bfloat16 (or its uint16 bits), float16 or float32", TypeError)
    if tuple(w.shape) != shape:
        validate.fail(name, f"shape {tuple(w.shape)}", f"shape {shape}")
    if kind == "torch":
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
    if dispatch.logical_dtype(x) != dispatch.BF16:
        validate.fail("x", x.dtype, dispatch.BF16, TypeError)
    if x.ndim != 2 or x.shape[1] != HIDDEN:
        validate.fail("x", f"shape {tuple(x.shape)}", f"shape (M, {HIDDEN})")
    m = x.shape[0]
    if not 1 <= m <= MAX_M:
        validate.fail("x", f"M = {m} rows", f"1 <= M <= {MAX_M} (M * 14336 must stay below 2**31)")
    if not validate.is_contiguous(x):
        validate.fail("x", f"strides {dispatch.strides_elems(x)}", "a contiguous array")
    validate.aligned("x", x, 8)  # read as quads of bf16
    validate.array("x_norm_weight", x_norm_weight, dispatch.BF16, (HIDDEN,))
    validate.aligned("x_norm_weight", x_norm_weight, 8)
    validate.table("adaln_scale", adaln_scale, HIDDEN)
    validate.table("adaln_shift", adaln_shift, HIDDEN)
    if adaln_shift.shape[0] != adaln_scale.shape[0]:
        validate.fail("adaln_shift", f"{adaln_shift.shape[0]} rows", f"{adaln_scale.shape[0]} rows, as adaln_scale")
    if dispatch.strides_elems(adaln_shift)[0] != dispatch.strides_elems(adaln_scale)[0]:
        validate.fail("adaln_shift", f"row stride {dispatch.strides_elems(adaln_shift)[0]}",
                      f"adaln_scale's row stride {dispatch.strides_elems(adaln_scale)[0]}")
    validate.array("adaln_index", adaln_index, dispatch.I64, (m,))
    if workspace_a_q is not None:
        validate.array("workspace_a_q", workspace_a_q, dispatch.E4M3, (m, HIDDEN))
        validate.aligned("workspace_a_q", workspace_a_q, 4)  # written as quads of e4m3
    if workspace_a_scale is not None:
        validate.array("workspace_a_scale", workspace_a_scale, dispatch.F32, (m,))
    return validate.positive_finite("eps", eps)


def minimax_h3_mlp_fp8_row_stage(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, *,
                                 workspace_a_q=None, workspace_a_scale=None, eps=1e-5):
    """The MLP's first stage alone: RMSNorm + indexed AdaLN + per-token e4m3 quantization.

    Returns (a_q e4m3 [M, 5376], a_scale f32 [M]) of the caller's kind, written into the
    workspaces when given. Bitwise equal to h3kernels.reference.
    """
    named = dict(x=x, x_norm_weight=x_norm_weight, adaln_scale=adaln_scale, adaln_shift=adaln_shift,
                 adaln_index=adaln_index, workspace_a_q=workspace_a_q, workspace_a_scale=workspace_a_scale)
    call = arrays.Call(named)
    eps = check_row_stage_args(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps,
                               workspace_a_q, workspace_a_scale)
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


def _span(a):
    """[first byte, one past the last byte) of the memory a's elements occupy."""
    itemsize = a.element_size() if arrays.kind_of(a) == "torch" else a.itemsize
    lo = arrays.data_ptr(a)
    return lo, lo + itemsize * (1 + sum((n - 1) * s for n, s in zip(a.shape, arrays.strides_elems(a))))


def _check_no_overlap(written, read, may_alias=()):
    """Every array the operator writes must not share memory with another array of the call,
    except `out`, which may be exactly one of `may_alias` (the epilogue reads a residual element
    before it writes that element)."""
    everything = {**written, **read}
    for wn, w in written.items():
        wlo, whi = _span(w)
        for other, o in everything.items():
            if other == wn:
                continue
            olo, ohi = _span(o)
            if wlo < ohi and olo < whi:
                if (wn, other) in may_alias and (wlo, whi) == (olo, ohi) and tuple(w.shape) == tuple(o.shape):
                    continue
                validate.fail(wn, f"memory that overlaps {other}",
                              "its own memory" + (" (out may be residual or x)" if wn == "out" else ""))


def minimax_h3_mlp_fp8(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, gate, residual,
                      fc1_weight_q, fc1_weight_scale, fc2_weight_q, fc2_weight_scale, *, out=None,
                      workspace_a_q=None, workspace_a_scale=None, workspace_y=None, workspace_y_q=None,
                      workspace_y_scale=None, workspace_flags=None, eps=1e-5, fp8_mma_form=-1):
    """The fused W8A8 MLP block of MiniMax-H3 (contract.md): returns out, bf16 [M, 5376], of the
    caller's kind. Three launches and one memset on the caller's current stream, no host sync.
    Workspaces, when given, receive a_q, a_scale, y, y_q and y_scale (h3kernels.reference
    fills the same ones); out may be residual or x."""
    inputs = dict(x=x, x_norm_weight=x_norm_weight, adaln_scale=adaln_scale, adaln_shift=adaln_shift,
                  adaln_index=adaln_index, gate=gate, residual=residual, fc1_weight_q=fc1_weight_q,
                  fc1_weight_scale=fc1_weight_scale, fc2_weight_q=fc2_weight_q, fc2_weight_scale=fc2_weight_scale)
    given = dict(out=out, workspace_a_q=workspace_a_q, workspace_a_scale=workspace_a_scale,
                 workspace_y=workspace_y, workspace_y_q=workspace_y_q, workspace_y_scale=workspace_y_scale,
                 workspace_flags=workspace_flags)
    call = arrays.Call({**inputs, **given})
    eps = check_row_stage_args(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps,
                               workspace_a_q, workspace_a_scale)
    m = x.shape[0]
    validate.table("gate", gate, HIDDEN)
    if gate.shape[0] != adaln_scale.shape[0]:
        validate.fail("gate", f"{gate.shape[0]} rows", f"{adaln_scale.shape[0]} rows, as adaln_scale")
    validate.array("residual", residual, dispatch.BF16, (m, HIDDEN))
    validate.array("fc1_weight_q", fc1_weight_q, dispatch.E4M3, (FC1_OUT, HIDDEN))
    validate.array("fc1_weight_scale", fc1_weight_scale, dispatch.F32, (FC1_OUT,))
    validate.array("fc2_weight_q", fc2_weight_q, dispatch.E4M3, (HIDDEN, FFN))
    validate.array("fc2_weight_scale", fc2_weight_scale, dispatch.F32, (HIDDEN,))
    for name, shape, dtype in (("out", (m, HIDDEN), dispatch.BF16), ("workspace_y", (m, FFN), dispatch.BF16),
                               ("workspace_y_q", (m, FFN), dispatch.E4M3), ("workspace_y_scale", (m,), dispatch.F32),
                               ("workspace_flags", (fc2_flag_count(m),), dispatch.I32)):
        if given[name] is not None:
            validate.array(name, given[name], dtype, shape)
    for name, a, nbytes in (("residual", residual, 4), ("out", out, 4), ("fc1_weight_q", fc1_weight_q, 16),
                            ("fc2_weight_q", fc2_weight_q, 16), ("workspace_y", workspace_y, 16),
                            ("workspace_y_q", workspace_y_q, 16), ("workspace_a_q", workspace_a_q, 16)):
        if a is not None:
            validate.aligned(name, a, nbytes)
    form = targets.mlp_mma_form(call.device_id, fp8_mma_form)
    _check_no_overlap({k: v for k, v in given.items() if v is not None}, inputs,
                      may_alias={("out", "residual"), ("out", "x")})

    # the buffers between the launches: the caller's workspaces, else one scratch allocation
    offsets, total = launch.scratch_layout(m)
    scratch = None
    ptr = {}
    for name, ws in (("a_q", workspace_a_q), ("a_scale", workspace_a_scale), ("y", workspace_y),
                     ("y_q", workspace_y_q), ("y_scale", workspace_y_scale), ("flags", workspace_flags)):
        if ws is not None:
            ptr[name] = arrays.data_ptr(ws)
        else:
            if scratch is None:
                scratch = call.empty((total,), arrays.E4M3)
                base = arrays.data_ptr(scratch)
            ptr[name] = base + offsets[name]
    out = out if out is not None else call.empty((m, HIDDEN), arrays.BF16)
    previous = call.make_current()
    try:
        launch.launch_row(call, x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps, ptr["a_q"],
                          ptr["a_scale"])
        launch.zero_flags(call, m, ptr["flags"])
        data_ptr = arrays.data_ptr
        launch.launch_fc1(call, form, m, ptr["a_q"], ptr["a_scale"], data_ptr(fc1_weight_q),
                          data_ptr(fc1_weight_scale), ptr["y"])
        launch.launch_fc2(call, form, m, ptr["y"], ptr["y_q"], ptr["y_scale"], data_ptr(fc2_weight_q),
                          data_ptr(fc2_weight_scale), gate, data_ptr(adaln_index), data_ptr(residual),
                          data_ptr(out), ptr["flags"])
    finally:
        arrays.restore(previous)
    return out  # the scratch goes back to the caller's allocator, stream-ordered behind the launches
