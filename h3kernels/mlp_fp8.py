"""minimax_h3_mlp_fp8: the fused W8A8 MLP block (contract.md): the weight preparation, the row
stage (Numba: RMSNorm + indexed AdaLN + per-token e4m3 quantization), and the FC1 + SwiGLU and
FC2 + requantization + gated residual GEMMs of cuda_src/mlp_fp8.cu."""
from h3kernels import reference
from h3kernels import _validate as validate
from h3kernels._runtime import arrays as dispatch
from h3kernels._validate import mlp_fp8 as checks
from h3kernels.constants import FC1_OUT, FFN, HIDDEN, fc2_flag_count

# The preparation runs on the weight's own device: CPU or CUDA torch tensors, or CuPy arrays.
_PREPARE_ARRAYS = validate.Accepted(("torch", "cupy"), "a torch tensor or a CuPy array")


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

    checks.weight(name, w, shape, _PREPARE_ARRAYS)
    if dispatch.kind_of(w) == "torch":
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
    return q8.view(dispatch.cupy_dtype(dispatch.E4M3)), cupy.from_dlpack(s)


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
    call = dispatch.Call(named)  # kind and device, once dtypes and shapes are known good
    m = x.shape[0]
    a_q = workspace_a_q if workspace_a_q is not None else call.empty((m, HIDDEN), dispatch.E4M3)
    a_scale = workspace_a_scale if workspace_a_scale is not None else call.empty((m,), dispatch.F32)
    from h3kernels._launch.numba import mlp_fp8_row

    with call.numba_device():
        args = row_stage_launch_args(call, x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps, a_q, a_scale)
        mlp_fp8_row.launch(*args, stream=call.numba_stream())
    return a_q, a_scale


def row_stage_launch_args(call, x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps, a_q, a_scale):
    """The row kernel's arguments: raw-bit quad views (validation guarantees their alignment)."""
    nb, quads = call.numba, "uint64"
    return (nb(x, quads), nb(x_norm_weight, quads), call.numba_span(adaln_scale, quads),
            call.numba_span(adaln_shift, quads), dispatch.strides_elems(adaln_scale)[0] // 4,
            adaln_scale.shape[0], nb(adaln_index), eps, nb(a_q, "uint32"), nb(a_scale))


# --- the GEMMs (cuda_src/mlp_fp8.cu) ----------------------------------------------------------

FC1_TILE = (128, 128, 128)  # BM, BN, BK (bytes of K), as the #defines of cuda_src/mlp_fp8.cu
FC1_STAGES = 3
FC1_THREADS = 256  # GEMM warps; FC2 adds FC2_PRODUCERS threads that quantize y
FC2_PRODUCERS = 64
FC1_SMEM_BYTES = FC1_STAGES * (FC1_TILE[0] + FC1_TILE[1]) * FC1_TILE[2]


def mma_form(device_id, requested=-1):
    """The FP8 mma form for `fp8_mma_form` (contract.md): -1 the board's, 0 legacy, 2 mxf8f6f4."""
    from h3kernels._runtime import compiler as jit

    arch = jit.arch_for(jit.device_cc(device_id))
    if isinstance(requested, bool) or requested not in (-1, 0, 2):
        validate.fail("fp8_mma_form", repr(requested), "-1, 0 or 2", ValueError)
    if requested == 2 and arch != "sm_120a":
        validate.fail("fp8_mma_form", 2, f"-1 or 0 on this {arch} board (form 2 needs sm_120a)", ValueError)
    if requested == -1:
        return 2 if arch == "sm_120a" and "GeForce" in jit.device_properties(device_id)["name"] else 0
    return requested


def _launch_gemm(call, kernel, form, tiles, threads, args):
    """One persistent GEMM launch (min(tiles, SMs) CTAs) on the call's stream."""
    import cupy
    import numpy as np

    from h3kernels._runtime import compiler as jit

    f = jit.get_function("mlp_fp8", kernel, call.device_id, {"H3_MMA_FORM": form}, dynamic_smem=FC1_SMEM_BYTES)
    sms = jit.device_properties(call.device_id)["multiProcessorCount"]
    args = tuple(np.uint64(dispatch.data_ptr(a)) if dispatch.kind_of(a) else a for a in args)
    with cupy.cuda.Device(call.device_id):
        f((min(tiles, sms),), (threads,), args, shared_mem=FC1_SMEM_BYTES,
          stream=dispatch.cupy_stream(call.stream_ptr, call.device_id))


def _launch_fc1(call, a_q, a_scale, w1_q, w1_scale, y, m, form):
    """y <- SwiGLU(FC1(a_q)) on the call's stream. Arrays validated by the caller: a_q and w1_q
    16-byte aligned (cp.async), y 4-byte aligned."""
    import numpy as np

    tiles = -(-m // FC1_TILE[0]) * (FC1_OUT // FC1_TILE[1])
    _launch_gemm(call, "h3_mlp_fc1", form, tiles, FC1_THREADS, (a_q, a_scale, w1_q, w1_scale, y, np.int32(m)))


def _launch_fc2(call, y, y_q, y_scale, w2_q, w2_scale, gate, adaln_index, residual, out, flags, m, form):
    """out <- residual + gate * FC2(quantize(y)) on the call's stream; flags must be zero. Arrays
    validated by the caller: y, y_q and w2_q 16-byte aligned, residual and out 4-byte aligned."""
    import numpy as np

    tiles = -(-m // FC1_TILE[0]) * (HIDDEN // FC1_TILE[1])
    gate_stride = np.int64(dispatch.strides_elems(gate)[0])
    _launch_gemm(call, "h3_mlp_fc2", form, tiles, FC1_THREADS + FC2_PRODUCERS,
                 (y, y_q, y_scale, w2_q, w2_scale, gate, gate_stride, np.int64(gate.shape[0]), adaln_index,
                  residual, out, flags, np.int32(m)))


def _zero(call, a):
    """Stream-ordered memset of a's bytes (the FC2 flags)."""
    import cupy

    nbytes = int(a.numel() * a.element_size()) if call.kind == "torch" else int(a.nbytes)
    with cupy.cuda.Device(call.device_id):
        cupy.cuda.runtime.memsetAsync(dispatch.data_ptr(a), 0, nbytes, call.stream_ptr)


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
    eps = checks.mlp_args(**inputs, **given, eps=eps, fp8_mma_form=fp8_mma_form)
    call = dispatch.Call({**inputs, **given})  # kind and device, once dtypes and shapes are known good
    form = mma_form(call.device_id, fp8_mma_form)
    m = x.shape[0]

    a_q = workspace_a_q if workspace_a_q is not None else call.empty((m, HIDDEN), dispatch.E4M3)
    a_scale = workspace_a_scale if workspace_a_scale is not None else call.empty((m,), dispatch.F32)
    y = workspace_y if workspace_y is not None else call.empty((m, FFN), dispatch.BF16)
    y_q = workspace_y_q if workspace_y_q is not None else call.empty((m, FFN), dispatch.E4M3)
    y_scale = workspace_y_scale if workspace_y_scale is not None else call.empty((m,), dispatch.F32)
    flags = workspace_flags if workspace_flags is not None else call.empty((fc2_flag_count(m),), dispatch.I32)
    out = out if out is not None else call.empty((m, HIDDEN), dispatch.BF16)

    from h3kernels._launch.numba import mlp_fp8_row

    with call.numba_device():
        args = row_stage_launch_args(call, x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps, a_q, a_scale)
        mlp_fp8_row.launch(*args, stream=call.numba_stream())
    _zero(call, flags)
    _launch_fc1(call, a_q, a_scale, fc1_weight_q, fc1_weight_scale, y, m, form)
    _launch_fc2(call, y, y_q, y_scale, fc2_weight_q, fc2_weight_scale, gate, adaln_index, residual, out, flags,
                m, form)
    return out
