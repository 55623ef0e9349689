"""The quantization passes of minimax_h3_varlen_attention_fp8 (Numba, raw bits).

contract.md, Attention details:
- Q per (token, head): s_q = RN(amax / 448) over the 128 channels, q8 = e4m3(RN(q / s_q)).
- K per (segment, head, channel): FP32 mean mu over the segment's keys (the keys of each
  128-key block added in token order, the block sums added in block order, then RN(sum / L));
  k' = RN(k - mu); per (128-key block from the segment's start, head):
  s_k = RN(amax |k'| / 448), k8 = e4m3(RN(k' / s_k)).
- V per (segment, head, channel): s_v = RN(amax / 448) over the segment's keys,
  v8 = e4m3(RN(v / s_v)).
Zero scales give zero codes. Like the MLP row kernel, these kernels keep bf16 as uint16 and e4m3
as uint8 and reduce through shared memory, so they run unchanged in the CUDA simulator.

V is written transposed for the attention kernel's PV product, as v8t [heads, 128, n * 128]
(n = key blocks, key_blocks' numbering): channel rows with keys contiguous, so the kernel loads
it with cp.async as a K-major B operand. Key block b (segment seg, first key f, `count` keys)
fills columns 128 * b .. 128 * b + 127: a segment starts 16-byte aligned at column
128 * block_offset[seg], and the columns past its last key are zero, so the kernel's key blocks
read finite bytes that meet P = 0. Inside every 16-key group the keys are permuted
(v_key_at): the kernel packs P into the PV mma's A fragment straight from its S accumulators,
which puts keys {2t, 2t+1, 8+2t, 9+2t} in the A k-columns 4t..4t+3 (see
cuda_src/varlen_attention_fp8.cu), and B's k-rows must hold the same keys.
"""
import threading

import numpy as np
from numba import cuda, float32, uint8, uint16, uint32, uint64  # module level: the simulator swaps this global for its fake

from .shapes import E4M3_MAX, HEAD_DIM, K_BLOCK

Q_WARPS = 8
Q_ROWS_PER_WARP = 8  # the loads of a warp's rows are all in flight before the first reduction
Q_ROWS_PER_CTA = Q_WARPS * Q_ROWS_PER_WARP
Q_THREADS = 32 * Q_WARPS
Q_WORDS = 2 * Q_ROWS_PER_WARP  # a global: Numba needs a literal shape
BATCH = 16  # keys whose loads a K or V thread has in flight at once (one per channel thread)
V_TILE_COLS = HEAD_DIM + 1  # +1: column reads hit distinct banks. A global: Numba needs a literal shape
_lock = threading.Lock()
_kernels = None


def _build():
    from .fp8_bits import MIN_FAST_SCALE, make_quotient, primitives

    p = primitives()
    f32_from_bf16, e4m3, e4m3x2, div_rn = p.f32_from_bf16, p.e4m3_from_f32, p.e4m3x2_from_f32, p.div_rn
    lo, hi = p.f32_from_bf16_lo, p.f32_from_bf16_hi
    quotient = make_quotient(p.fma_rn)  # Q and V divide bf16 values by their own amax / 448

    @cuda.jit(device=True)
    def quotient_or_div(a, s, inv):
        """RN(a / s), up to its e4m3 code, for bf16 a with |a| <= amax, s = RN(amax / 448) > 0 and
        inv = RN(1 / s). Tiny scales divide (make_quotient's range); the branch is per row or
        channel, so a warp's Q row never diverges on it."""
        if s < float32(MIN_FAST_SCALE):
            return div_rn(a, s)
        return quotient(a, s, inv)

    @cuda.jit
    def q_kernel(q, q8, s_q):
        """q: uint64 [rows, 32] (bf16 quads; rows = tokens * heads); q8: uint32 [rows, 32] (e4m3
        quads); s_q: f32 [rows]. A warp per row, Q_ROWS_PER_WARP rows per warp: its 32 lanes read
        a row's 256 bytes at once."""
        t = cuda.threadIdx.x
        lane, w = t % 32, t // 32
        base = cuda.blockIdx.x * Q_ROWS_PER_CTA + w * Q_ROWS_PER_WARP
        red = cuda.shared.array((Q_ROWS_PER_CTA, 32), float32)
        words = cuda.local.array(Q_WORDS, uint32)
        for i in range(Q_ROWS_PER_WARP):
            quad = uint64(0)
            if base + i < q.shape[0]:
                quad = q[base + i, lane]
            words[2 * i] = uint32(quad & uint64(0xFFFFFFFF))
            words[2 * i + 1] = uint32(quad >> uint64(32))
        for i in range(Q_ROWS_PER_WARP):
            w0, w1 = words[2 * i], words[2 * i + 1]
            red[w * Q_ROWS_PER_WARP + i, lane] = max(max(abs(lo(w0)), abs(hi(w0))), max(abs(lo(w1)), abs(hi(w1))))
        cuda.syncthreads()
        width = 16
        while width > 0:  # shared-memory trees per row: the simulator has no warp shuffles
            if lane < width:
                for i in range(Q_ROWS_PER_WARP):
                    r = w * Q_ROWS_PER_WARP + i
                    red[r, lane] = max(red[r, lane], red[r, lane + width])
            cuda.syncthreads()
            width //= 2
        for i in range(Q_ROWS_PER_WARP):
            row = base + i
            if row < q.shape[0]:
                s = div_rn(red[w * Q_ROWS_PER_WARP + i, 0], float32(E4M3_MAX))
                out = uint32(0)
                if s > float32(0.0):
                    inv = div_rn(float32(1.0), s)
                    w0, w1 = words[2 * i], words[2 * i + 1]
                    out = uint32(e4m3x2(quotient_or_div(lo(w0), s, inv), quotient_or_div(hi(w0), s, inv))
                                 | (e4m3x2(quotient_or_div(lo(w1), s, inv), quotient_or_div(hi(w1), s, inv)) << 16))
                q8[row, lane] = out
                if lane == 0:
                    s_q[row] = s

    @cuda.jit
    def kv_block_kernel(k, v, blocks, partials):
        """Per 128-key block: partials[0] = its keys of k added in token order, partials[1] =
        amax |v| over them (f32 [2, n, heads, 128]). Grid n * heads (a 1-D grid has room for any
        n), one thread per channel: the work of a long segment spreads over its blocks instead of
        one CTA per (segment, head), and the CTAs in flight (heads fastest) read whole token rows,
        not 256-byte pieces 14 KB apart."""
        h, blk, c = cuda.blockIdx.x % k.shape[1], cuda.blockIdx.x // k.shape[1], cuda.threadIdx.x
        first, count = blocks[blk, 1], blocks[blk, 2]
        kk = cuda.local.array(BATCH, float32)
        vv = cuda.local.array(BATCH, float32)
        total = float32(0.0)
        amax = float32(0.0)
        for t0 in range(0, count, BATCH):
            for i in range(BATCH):  # loads first, so BATCH of them are in flight
                kk[i] = float32(0.0)
                vv[i] = float32(0.0)
                if t0 + i < count:
                    kk[i] = f32_from_bf16(k[first + t0 + i, h, c])
                    vv[i] = abs(f32_from_bf16(v[first + t0 + i, h, c]))
            for i in range(BATCH):
                if t0 + i < count:
                    total = float32(total + kk[i])
                amax = max(amax, vv[i])
        partials[0, blk, h, c] = total
        partials[1, blk, h, c] = amax

    @cuda.jit
    def kv_segment_kernel(cu, block_offset, partials, mu, s_v):
        """mu = RN(the segment's block sums added in block order / L) and s_v = RN(amax / 448),
        f32 [segments, heads, 128] each. Grid (segments, heads), one thread per channel."""
        seg, h, c = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
        a, b = cu[seg], cu[seg + 1]
        total = float32(0.0)
        amax = float32(0.0)
        for blk in range(block_offset[seg], block_offset[seg + 1]):
            total = float32(total + partials[0, blk, h, c])
            amax = max(amax, partials[1, blk, h, c])
        mean = float32(0.0)
        if b > a:
            mean = div_rn(total, float32(b - a))
        mu[seg, h, c] = mean
        s_v[seg, h, c] = div_rn(amax, float32(E4M3_MAX))

    @cuda.jit
    def k_quant_kernel(k, mu, blocks, k8, s_k):
        """blocks: int64 [n, 3] (segment, first key, keys); s_k: f32 [n, heads]; k8: uint8 like k.
        Grid n * heads (heads fastest), one thread per channel; the block's keys are read once,
        into shared memory."""
        h, blk, c = cuda.blockIdx.x % k.shape[1], cuda.blockIdx.x // k.shape[1], cuda.threadIdx.x
        red = cuda.shared.array(HEAD_DIM, float32)
        tile = cuda.shared.array((K_BLOCK, HEAD_DIM), uint16)
        kk = cuda.local.array(BATCH, uint16)
        seg, first, count = blocks[blk, 0], blocks[blk, 1], blocks[blk, 2]
        m = mu[seg, h, c]
        amax = float32(0.0)
        for t0 in range(0, count, BATCH):
            for i in range(BATCH):
                kk[i] = uint16(0)
                if t0 + i < count:
                    kk[i] = k[first + t0 + i, h, c]
            for i in range(BATCH):
                if t0 + i < count:
                    tile[t0 + i, c] = kk[i]
                    amax = max(amax, abs(float32(f32_from_bf16(kk[i]) - m)))
        red[c] = amax
        cuda.syncthreads()
        half = HEAD_DIM // 2
        while half > 0:
            if c < half:
                red[c] = max(red[c], red[c + half])
            cuda.syncthreads()
            half //= 2
        s = div_rn(red[0], float32(E4M3_MAX))
        for t in range(count):
            code = 0
            if s > float32(0.0):  # k' is no bf16 value: an exact division
                code = e4m3(div_rn(float32(f32_from_bf16(tile[t, c]) - m), s))
            k8[first + t, h, c] = code
        if c == 0:
            s_k[blk, h] = s

    @cuda.jit
    def v_quant_kernel(v, s_v, blocks, v8t):
        """v8t: uint8 [heads, 128, n * 128] (the module docstring's layout). Grid n * heads
        (heads fastest). Thread x first quantizes channel x of the block's keys into shared
        memory, then writes column x (key v_key_at(x)) of every channel row, so that global writes
        are coalesced."""
        h, blk, x = cuda.blockIdx.x % v.shape[1], cuda.blockIdx.x // v.shape[1], cuda.threadIdx.x
        tile = cuda.shared.array((K_BLOCK, V_TILE_COLS), uint8)
        vv = cuda.local.array(BATCH, uint16)
        seg, first, count = blocks[blk, 0], blocks[blk, 1], blocks[blk, 2]
        s = s_v[seg, h, x]
        inv = float32(0.0)
        if s > float32(0.0):
            inv = div_rn(float32(1.0), s)
        for t0 in range(0, K_BLOCK, BATCH):
            for i in range(BATCH):
                vv[i] = uint16(0)
                if t0 + i < count:
                    vv[i] = v[first + t0 + i, h, x]
            for i in range(BATCH):
                code = 0
                if t0 + i < count and s > float32(0.0):
                    code = e4m3(quotient_or_div(f32_from_bf16(vv[i]), s, inv))
                tile[t0 + i, x] = code
        cuda.syncthreads()
        key = (x & ~15) | (((x >> 2) & 3) << 1) | (x & 1) | (((x >> 1) & 1) << 3)  # v_key_at(x)
        col = blk * K_BLOCK + x
        for c in range(HEAD_DIM):
            v8t[h, c, col] = tile[key, c]

    return q_kernel, kv_block_kernel, kv_segment_kernel, k_quant_kernel, v_quant_kernel


def kernels():
    global _kernels
    with _lock:
        if _kernels is None:
            _kernels = _build()
        return _kernels


def v_key_at(p):
    """The key (within its 128-key block) that v8t column p of the block holds."""
    return (p & ~15) | (((p >> 2) & 3) << 1) | (p & 1) | (((p >> 1) & 1) << 3)


def v_transposed(v8, cu_seqlens_host):
    """numpy: v8t (the module docstring's layout) from v8 uint8 [tokens, heads, 128]. Tests use it."""
    v8 = np.asarray(v8)
    blocks = key_blocks(cu_seqlens_host)
    out = np.zeros((v8.shape[1], HEAD_DIM, len(blocks) * K_BLOCK), np.uint8)
    key = v_key_at(np.arange(K_BLOCK))
    for b, (_, first, count) in enumerate(blocks):
        have = key < count
        out[:, :, b * K_BLOCK + np.nonzero(have)[0]] = v8[first + key[have]].transpose(1, 2, 0)
    return out


def key_blocks(cu_seqlens_host):
    """int64 [n, 3]: (segment, first key, keys) of every 128-key block, segment after segment,
    in the numbering of varlen_attention_fp8_plan's block_offset."""
    rows = []
    for seg, (a, b) in enumerate(zip(cu_seqlens_host[:-1], cu_seqlens_host[1:])):
        for first in range(a, b, K_BLOCK):
            rows.append((seg, first, min(K_BLOCK, b - first)))
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def launch(q, k, v, cu, blocks, block_offset, q8, s_q, mu, k8, s_k, v8t, s_v, partials, stream=None):
    """All passes. q, k, v: uint16 [tokens, heads, 128]; cu: int32 or int64 [segments + 1];
    blocks: from key_blocks; block_offset: int [segments + 1], each segment's first block (the
    plan's); partials: f32 [2, blocks, heads, 128] scratch; outputs as the kernels' docstrings
    say. Arrays are Numba device arrays (or numpy arrays in the simulator); work goes on `stream`."""
    for _, run in passes(q, k, v, cu, blocks, block_offset, q8, s_q, mu, k8, s_k, v8t, s_v, partials, stream):
        run()


def passes(q, k, v, cu, blocks, block_offset, q8, s_q, mu, k8, s_k, v8t, s_v, partials, stream=None):
    """launch's passes in order, as (kernel name, thunk) pairs: bench/bench_attention.py times
    each one."""
    tokens, heads, _ = q.shape
    segments = cu.shape[0] - 1
    qk, kv_block, kv_segment, kq, vq = kernels()
    cfg = (lambda grid, block: (grid, block) if stream is None else (grid, block, stream))
    out = []
    if tokens:
        rows = tokens * heads
        out.append(("q_kernel", lambda: qk[cfg(-(-rows // Q_ROWS_PER_CTA), Q_THREADS)](
            q.reshape(rows, HEAD_DIM).view(np.uint64), q8.reshape(rows, HEAD_DIM).view(np.uint32), s_q.reshape(rows))))
    n = blocks.shape[0]
    if n:
        out.append(("kv_block_kernel", lambda: kv_block[cfg(n * heads, HEAD_DIM)](k, v, blocks, partials)))
    if segments and tokens:
        out.append(("kv_segment_kernel", lambda: kv_segment[cfg((segments, heads), HEAD_DIM)](
            cu, block_offset, partials, mu, s_v)))
    if n:
        out.append(("k_quant_kernel", lambda: kq[cfg(n * heads, HEAD_DIM)](k, mu, blocks, k8, s_k)))
        out.append(("v_quant_kernel", lambda: vq[cfg(n * heads, HEAD_DIM)](v, s_v, blocks, v8t)))
    return out
