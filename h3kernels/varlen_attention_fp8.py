"""minimax_h3_varlen_attention_fp8: packed-varlen FP8 attention (contract.md, Attention details).

One call: validate every argument (nothing is launched before), take the segment plan (host,
cached; no device sync when cu_seqlens_host is given), then on the caller's stream the Numba
quantization passes (varlen_attention_fp8_quant) into the workspace and the CUDA kernel
(cuda_src/varlen_attention_fp8.cu) into `out`.

Workspace: one grow-only buffer per (device, stream) holding q8, k8, v8t, s_q, s_k, mu and s_v,
plus that stream's uploaded plans. Everything a call touches is therefore used only in the order
of one stream: two streams never share a buffer, a buffer outgrown on its stream is returned to
CuPy's pool, which hands it out again only to allocations on that same stream, and a plan is
uploaded on the stream that reads it. Each buffer also keeps an event recorded after its last
use, which the next call waits on: a CUDA stream handle can be reused by a new stream once the
old one is destroyed, possibly with work still pending.
"""
import collections
import threading

import numpy as np

from h3kernels._runtime import arrays as dispatch
from h3kernels._validate import varlen_attention_fp8 as checks
from h3kernels._launch import varlen_attention_fp8_plan as plan
from h3kernels.constants import HEAD_DIM

# As the #defines of cuda_src/varlen_attention_fp8.cu (tests/test_varlen_attention_fp8.py checks).
Q_TILE = plan.Q_TILE  # BQ
K_BLOCK = plan.K_BLOCK  # KSB
BKV = 64
STAGES = 4
THREADS = 256
TILE_INTS = plan.TILE_COLS
SMEM_BYTES = Q_TILE * HEAD_DIM + STAGES * 2 * BKV * HEAD_DIM
# H3_ATTN_EXACT_MAX: False (the default) is the contract's one-pass online softmax: P rounds
# against each block's running max, about 0.025 rel L2 from the reference on segments of
# thousands of random keys (the .cu's header comment; docs/perf.md), while its error against
# float64 attention stays the reference's own. True runs two passes over the keys (the row max
# first, then P against it, as the reference does: 2e-4 from it) for 1.5x the mma work. The .cu's
# default is this value, so compile_check checks what runs.
EXACT_MAX = False

LOG2E = 1.4426950408889634
_ALIGN = 256
_PLANS_PER_STREAM = 16


def minimax_h3_varlen_attention_fp8(q, k, v, cu_seqlens, out=None, *, cu_seqlens_host=None, softmax_scale=None):
    """Non-causal FP8 attention over the segments [cu_seqlens[i], cu_seqlens[i + 1]) of packed
    q, k, v (bf16 [tokens, heads, 128], torch CUDA tensors or CuPy arrays). Returns `out` (bf16
    [tokens, heads, 128], allocated when None) of the caller's kind. Work runs on the caller's
    current stream; with `cu_seqlens_host` (a host copy of cu_seqlens) there is no device sync,
    without it one device-to-host copy of cu_seqlens. `out` may alias q, k or v: the kernel reads
    only the quantized copies."""
    tokens, heads, scale, cu_host = check_call(None, q, k, v, cu_seqlens, out, cu_seqlens_host, softmax_scale)
    call = dispatch.Call(dict(q=q, k=k, v=v, cu_seqlens=cu_seqlens, out=out))  # kind and device, after
    if cu_host is None:
        cu_host = host_seqlens(call, cu_seqlens, None, tokens)
    res = out if out is not None else call.empty((tokens, heads, HEAD_DIM), dispatch.BF16)
    if tokens == 0:
        return res
    _run(call, q, k, v, cu_seqlens, cu_host, heads, scale, res)
    return res


minimax_h3_sm120_varlen_attention_fp8 = minimax_h3_varlen_attention_fp8


def check_call(call, q, k, v, cu_seqlens, out, cu_seqlens_host, softmax_scale, fp8_mma_form=-1):
    """Every argument check but the devices (h3kernels._validate.varlen_attention_fp8), before
    anything is launched: (tokens, heads, softmax scale, cu_seqlens as a tuple). Without
    cu_seqlens_host, cu_seqlens is read back through `call`; with `call` None it is left to
    host_seqlens once the call is open (kind and device checked), and the tuple is None."""
    tokens, heads = check_args(q, k, v, cu_seqlens, out)
    scale = checks.softmax_scale(softmax_scale)
    checks.fp8_mma_form(fp8_mma_form)
    if cu_seqlens_host is None and call is None:
        return tokens, heads, scale, None
    return tokens, heads, scale, host_seqlens(call, cu_seqlens, cu_seqlens_host, tokens)


def check_args(q, k, v, cu_seqlens, out):
    """Kinds, dtypes, shapes and layout; returns (tokens, heads). Devices are dispatch.Call's."""
    return checks.check_args(q, k, v, cu_seqlens, out)


def host_seqlens(call, cu_seqlens, cu_seqlens_host, tokens):
    """cu_seqlens as a tuple of ints, checked: from cu_seqlens_host when given (compared with
    cu_seqlens only by length: reading it back would sync), else one device-to-host copy."""

    def read_back():
        if call.capturing:
            raise RuntimeError("minimax_h3_varlen_attention_fp8: cu_seqlens_host is needed while a CUDA graph is "
                               "being captured (reading cu_seqlens back would synchronize)")
        if call.kind == "torch":
            return cu_seqlens.cpu().tolist()  # on torch's current stream, which is ours
        with call.active():
            return cu_seqlens.get().tolist()  # synchronous, on the caller's stream

    return checks.host_seqlens(cu_seqlens, cu_seqlens_host, tokens, read_back)


# --- workspace ---------------------------------------------------------------------------

class _Workspace:
    """One stream's buffers: `mem` (CuPy memory, grow-only), its uploaded plans, its last-use event,
    and `captured`: the buffers a CUDA graph captured on this stream points at, kept alive for the
    life of the process so that a later growth or plan eviction cannot hand them to someone else."""

    def __init__(self):
        self.mem = None
        self.nbytes = 0
        self.plans = collections.OrderedDict()
        self.event = None
        self.lock = threading.Lock()
        self.captured = {}


_lock = threading.Lock()
_workspaces = {}  # (device id, stream handle) -> _Workspace


def _workspace(device_id, stream_ptr):
    with _lock:
        return _workspaces.setdefault((device_id, stream_ptr), _Workspace())


def workspace_bytes(device=None):
    """Bytes now held by the attention's quantized-operand buffers on `device` (an int, 'cuda:N',
    a torch.device or a CuPy Device; None: the current device), summed over its streams."""
    checks.device(device)  # a bad argument is refused even while nothing is held
    with _lock:
        if not _workspaces:
            return 0
        items = list(_workspaces.items())
    dev = _device_id(device)
    return sum(ws.nbytes for (d, _), ws in items if d == dev)


def _device_id(device):
    dev = checks.device(device)
    if dev is None:
        import cupy

        return cupy.cuda.runtime.getDevice()
    return dev


def layout(tokens, heads, segments, key_blocks):
    """{name: (byte offset, shape, raw dtype)} of the workspace, and its size in bytes."""
    parts = (("q8", (tokens, heads, HEAD_DIM), "uint8"), ("k8", (tokens, heads, HEAD_DIM), "uint8"),
             ("v8t", (heads, HEAD_DIM, key_blocks * K_BLOCK), "uint8"), ("s_q", (tokens, heads), "float32"),
             ("s_k", (key_blocks, heads), "float32"), ("mu", (segments, heads, HEAD_DIM), "float32"),
             ("s_v", (segments, heads, HEAD_DIM), "float32"),
             ("partials", (2, key_blocks, heads, HEAD_DIM), "float32"))
    out, off = {}, 0
    for name, shape, dt in parts:
        out[name] = (off, shape, dt)
        off += -(-int(np.prod(shape)) * np.dtype(dt).itemsize // _ALIGN) * _ALIGN
    return out, max(off, _ALIGN)


def _device_plan(ws, call, cu_host, heads, stream):
    """(tiles, block_offset, blocks) as CuPy arrays of this stream's workspace, uploaded once."""
    import cupy

    key = (cu_host, heads)
    hit = ws.plans.get(key)
    if hit is not None:
        ws.plans.move_to_end(key)
        return hit
    if call.capturing:
        raise _capture_error("upload a new segment plan")
    from h3kernels._launch.numba.varlen_attention_fp8_quant import key_blocks

    tiles, block_offset = plan.plan_host(cu_host, heads)
    blocks = key_blocks(cu_host)
    arrays = []
    with call.active():
        for host in (tiles, block_offset, blocks):
            dev = cupy.empty(host.shape, dtype=host.dtype)
            if host.size:
                # cudaMemcpyAsync on the caller's stream. From pageable memory it returns once the
                # bytes are staged (so `blocks`, a temporary, may die), and the driver may wait for
                # the stream there: a possible host wait once per new plan and stream, not per call
                dev.set(host, stream=stream)
            arrays.append(dev)
    ws.plans[key] = hit = tuple(arrays)
    while len(ws.plans) > _PLANS_PER_STREAM:
        ws.plans.popitem(last=False)  # freed to CuPy's pool for this stream: stream-ordered reuse
    return hit


# --- launch --------------------------------------------------------------------------------

_grid_cap = {}  # (device id, CUfunction) -> SMs x resident CTAs per SM


def mma_form(device_id):
    """kind::f8f6f4 (form 1) on sm_120a, the legacy e4m3 mma elsewhere."""
    from h3kernels._runtime import compiler as jit

    return 1 if jit.arch_for(jit.device_cc(device_id)) == "sm_120a" else 0


def _kernel(device_id):
    """The kernel function and its grid cap."""
    from cupy_backends.cuda.api import driver

    from h3kernels._runtime import compiler as jit

    f = jit.get_function("varlen_attention_fp8", "h3_varlen_attention_fp8", device_id,
                         {"H3_MMA_FORM": mma_form(device_id), "H3_ATTN_EXACT_MAX": int(EXACT_MAX)},
                         dynamic_smem=SMEM_BYTES)
    key = (device_id, f.ptr)
    with _lock:
        if key not in _grid_cap:
            per_sm = max(1, driver.occupancyMaxActiveBlocksPerMultiprocessor(f.ptr, THREADS, SMEM_BYTES))
            _grid_cap[key] = per_sm * jit.device_properties(device_id)["multiProcessorCount"]
        return f, _grid_cap[key]


def _run(call, q, k, v, cu_seqlens, cu_host, heads, scale, out):
    import cupy

    from h3kernels._launch.numba import varlen_attention_fp8_quant as quant  # imports Numba: on first use only

    tokens = int(q.shape[0])
    segments = len(cu_host) - 1
    stream = dispatch.cupy_stream(call.stream_ptr, call.device_id)
    with cupy.cuda.Device(call.device_id):
        f, max_ctas = _kernel(call.device_id)
    ws = _workspace(call.device_id, call.stream_ptr)
    # Under CUDA graph capture, no event may join the graph from outside it: the stream's own
    # order already serializes its calls (the event guards a stream handle that is reused).
    capturing = call.capturing
    with ws.lock:
        with call.active():
            if ws.event is not None and not capturing:
                stream.wait_event(ws.event)
            tiles, block_offset, blocks = _device_plan(ws, call, cu_host, heads, stream)
            key_blocks = int(blocks.shape[0])
            parts, nbytes = layout(tokens, heads, segments, key_blocks)
            if ws.nbytes < nbytes:
                if capturing:
                    raise _capture_error("grow the workspace")
                ws.mem, ws.nbytes = None, 0  # back to the pool (this stream's) before the bigger one is taken
                ws.mem, ws.nbytes = cupy.cuda.alloc(nbytes), nbytes
            mem = ws.mem
            if capturing:  # one entry per buffer set, however many captures use it
                ws.captured[(mem.ptr, tiles.data.ptr)] = (mem, tiles, block_offset, blocks)
            if ws.event is None:
                ws.event = cupy.cuda.Event(block=False, disable_timing=True)
        with call.numba_device():
            quant.launch(*quant_launch_args(call, q, k, v, cu_seqlens, blocks, block_offset, mem.ptr, mem, parts),
                         stream=call.numba_stream())
        ptr = lambda off: np.uint64(mem.ptr + parts[off][0])
        n_tiles = int(tiles.shape[0])
        with cupy.cuda.Device(call.device_id):
            f((min(n_tiles, max_ctas),), (THREADS,),
              (np.uint64(tiles.data.ptr), np.int32(n_tiles), np.uint64(block_offset.data.ptr), ptr("q8"), ptr("s_q"),
               ptr("k8"), ptr("s_k"), ptr("v8t"), ptr("s_v"), np.uint64(dispatch.data_ptr(out)), np.int32(heads),
               np.int64(key_blocks * K_BLOCK), np.float32(scale * LOG2E)),
              shared_mem=SMEM_BYTES, stream=stream)
            if not capturing:
                ws.event.record(stream)


def _capture_error(what):
    return RuntimeError(f"minimax_h3_varlen_attention_fp8: this stream is capturing a CUDA graph, and the call "
                        f"would {what}; call it once with the same cu_seqlens_host on this stream before the "
                        "capture")


def quant_launch_args(call, q, k, v, cu_seqlens, blocks, block_offset, base, owner, parts):
    """varlen_attention_fp8_quant.launch's arguments: the inputs, the plan's key blocks (int64)
    and block_offset (int32) as device arrays, and the workspace views at `base` (layout())."""
    views = {name: dispatch.numba_buffer(base + off, shape, dt, owner) for name, (off, shape, dt) in parts.items()}
    plan_view = lambda a, raw: dispatch.numba_buffer(dispatch.data_ptr(a), a.shape, raw, a)
    return (call.numba(q), call.numba(k), call.numba(v), call.numba(cu_seqlens), plan_view(blocks, "int64"),
            plan_view(block_offset, "int32"), views["q8"], views["s_q"], views["mu"], views["k8"], views["s_k"],
            views["v8t"], views["s_v"], views["partials"])
