"""minimax_h3_varlen_attention_fp8: packed-varlen FP8 attention (contract.md, Attention details).

One call: validate every argument (nothing is launched before), take the segment plan (host,
cached; no device sync when cu_seqlens_host is given), then on the caller's stream the Numba
quantization passes into the stream's workspace and the CUDA kernel of
cuda_src/varlen_attention_fp8.cu into `out` (h3kernels/_launch/varlen_attention_fp8.py).
"""
import math

from h3kernels._launch import varlen_attention_fp8 as launch
from h3kernels._runtime import arrays, targets, validate
from h3kernels._runtime.workspace import workspace_bytes  # noqa: F401 (public: h3kernels.workspace_bytes)
from h3kernels.constants import HEAD_DIM

dispatch = arrays  # the name the argument checks below use (they move to h3kernels/_validate/)
mma_form = targets.mma_form  # fp8_mma_form -> the form that runs (-1: the board's)


def minimax_h3_varlen_attention_fp8(q, k, v, cu_seqlens, out=None, *, cu_seqlens_host=None, softmax_scale=None,
                                    fp8_mma_form=-1):
    """Non-causal FP8 attention over the segments [cu_seqlens[i], cu_seqlens[i + 1]) of packed
    q, k, v (bf16 [tokens, heads, 128], torch CUDA tensors or CuPy arrays). Returns `out` (bf16
    [tokens, heads, 128], allocated when None) of the caller's kind. Work runs on the caller's
    current stream; with `cu_seqlens_host` (a host copy of cu_seqlens) there is no device sync,
    without it one device-to-host copy of cu_seqlens. `out` may alias q, k or v: the kernel reads
    only the quantized copies. fp8_mma_form: as minimax_h3_mlp_fp8's (-1 the board's form, 0 the
    legacy e4m3 mma, 2 kind::mxf8f6f4 on sm_120a); every form gives the same bits."""
    call = arrays.Call(dict(q=q, k=k, v=v, cu_seqlens=cu_seqlens, out=out))
    tokens, heads, scale, cu_host = check_call(call, q, k, v, cu_seqlens, out, cu_seqlens_host, softmax_scale)
    form = targets.mma_form(call.device_id, fp8_mma_form)
    res = out if out is not None else call.empty((tokens, heads, HEAD_DIM), arrays.BF16)
    if tokens == 0:
        return res
    previous = call.make_current()
    try:
        launch.run(call, q, k, v, cu_seqlens, cu_host, heads, scale, res, form)
    finally:
        arrays.restore(previous)
    return res


minimax_h3_sm120_varlen_attention_fp8 = minimax_h3_varlen_attention_fp8


def check_call(call, q, k, v, cu_seqlens, out, cu_seqlens_host, softmax_scale):
    """Every argument check, before anything is launched: (tokens, heads, softmax scale, cu_seqlens
    as a tuple). `call` is used only to read cu_seqlens back when cu_seqlens_host is None."""
    tokens, heads = check_args(q, k, v, cu_seqlens, out)
    if softmax_scale is None:
        scale = 1.0 / math.sqrt(HEAD_DIM)
    else:
        scale = validate.positive_finite("softmax_scale", softmax_scale)
    return tokens, heads, scale, host_seqlens(call, cu_seqlens, cu_seqlens_host, tokens)


def check_args(q, k, v, cu_seqlens, out):
    """Shapes, dtypes and layout; returns (tokens, heads). Kind and device are dispatch.Call's."""
    for name, a in (("q", q), ("k", k), ("v", v)):
        if dispatch.logical_dtype(a) != dispatch.BF16:
            validate.fail(name, a.dtype, dispatch.BF16, TypeError)
    if q.ndim != 3 or q.shape[2] != HEAD_DIM or q.shape[1] < 1:
        validate.fail("q", f"shape {tuple(q.shape)}", f"shape (tokens, heads >= 1, {HEAD_DIM})")
    for name, a in (("k", k), ("v", v)):
        if tuple(a.shape) != tuple(q.shape):
            validate.fail(name, f"shape {tuple(a.shape)}", f"q's shape {tuple(q.shape)}")
    for name, a in (("q", q), ("k", k), ("v", v)):
        if not validate.is_contiguous(a):
            validate.fail(name, f"strides {dispatch.strides_elems(a)}", "a contiguous array")
        validate.aligned(name, a, 8)  # the quantization passes read bf16 quads
    if dispatch.logical_dtype(cu_seqlens) != dispatch.I32:
        validate.fail("cu_seqlens", cu_seqlens.dtype, dispatch.I32, TypeError)
    if cu_seqlens.ndim != 1 or cu_seqlens.shape[0] < 1:
        validate.fail("cu_seqlens", f"shape {tuple(cu_seqlens.shape)}", "shape (segments + 1,)")
    if out is not None:
        validate.array("out", out, dispatch.BF16, tuple(q.shape))
        validate.aligned("out", out, 4)  # written as pairs of bf16
    return int(q.shape[0]), int(q.shape[1])


def host_seqlens(call, cu_seqlens, cu_seqlens_host, tokens):
    """cu_seqlens as a tuple of ints, checked: from cu_seqlens_host when given (compared with
    cu_seqlens only by length: reading it back would sync), else one device-to-host copy."""
    name = "cu_seqlens_host"
    if cu_seqlens_host is None:
        name = "cu_seqlens"
        if call.capturing:
            raise RuntimeError("minimax_h3_varlen_attention_fp8: cu_seqlens_host is needed while a CUDA graph is "
                               "being captured (reading cu_seqlens back would synchronize)")
        if call.kind == "torch":
            cu_seqlens_host = cu_seqlens.cpu().tolist()  # on torch's current stream, which is ours
        else:
            with call.active():
                cu_seqlens_host = cu_seqlens.get().tolist()  # synchronous, on the caller's stream
    elif dispatch.kind_of(cu_seqlens_host) == "cupy" or getattr(cu_seqlens_host, "is_cuda", False):
        validate.fail(name, f"a {dispatch.kind_of(cu_seqlens_host)} device array", "a host sequence of ints",
                      TypeError)
    elif hasattr(cu_seqlens_host, "tolist"):  # numpy array or CPU tensor
        cu_seqlens_host = cu_seqlens_host.tolist()
    try:
        cu = tuple(int(c) for c in cu_seqlens_host)
    except (TypeError, ValueError):
        validate.fail(name, type(cu_seqlens_host).__name__, "a sequence of ints", TypeError)
    if len(cu) != cu_seqlens.shape[0]:
        validate.fail(name, f"{len(cu)} entries", f"{cu_seqlens.shape[0]}, as cu_seqlens")
    if cu[0] != 0:
        validate.fail(name, f"first entry {cu[0]}", "0")
    if any(b < a for a, b in zip(cu, cu[1:])):
        i = next(i for i, (a, b) in enumerate(zip(cu, cu[1:])) if b < a)
        validate.fail(name, f"entries {cu[i]}, {cu[i + 1]} at {i}, {i + 1}", "non-decreasing entries")
    if cu[-1] != tokens:
        validate.fail(name, f"last entry {cu[-1]}", f"tokens = {tokens} (q.shape[0])")
    return cu
