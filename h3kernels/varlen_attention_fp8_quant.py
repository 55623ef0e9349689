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
from numba import cuda, float32, uint8, uint32, uint64  # module level: the simulator swaps this global for its fake

from .shapes import E4M3_MAX, HEAD_DIM, K_BLOCK

Q_ROWS_PER_CTA = 8
Q_THREADS = 32 * Q_ROWS_PER_CTA
V_TILE_COLS = HEAD_DIM + 1  # +1: column reads hit distinct banks. A global: Numba needs a literal shape
_lock = threading.Lock()
_kernels = None


def _build():
    from .fp8_bits import primitives

    p = primitives()
    f32_from_bf16, e4m3, e4m3x2, div_rn = p.f32_from_bf16, p.e4m3_from_f32, p.e4m3x2_from_f32, p.div_rn
    lo, hi = p.f32_from_bf16_lo, p.f32_from_bf16_hi

    @cuda.jit
    def q_kernel(q, q8, s_q):
        """q: uint64 [rows, 32] (bf16 quads; rows = tokens * heads); q8: uint32 [rows, 32] (e4m3
        quads); s_q: f32 [rows]. A warp per row: its 32 lanes read the row's 256 bytes at once."""
        t = cuda.threadIdx.x
        lane, r = t % 32, t // 32
        row = cuda.blockIdx.x * Q_ROWS_PER_CTA + r
        red = cuda.shared.array(Q_THREADS, float32)
        live = row < q.shape[0]
        w0 = uint32(0)
        w1 = uint32(0)
        if live:
            quad = q[row, lane]
            w0 = uint32(quad & uint64(0xFFFFFFFF))
            w1 = uint32(quad >> uint64(32))
        red[t] = max(max(abs(lo(w0)), abs(hi(w0))), max(abs(lo(w1)), abs(hi(w1))))
        cuda.syncthreads()
        width = 16
        while width > 0:  # shared-memory tree per row: the simulator has no warp shuffles
            if lane < width:
                red[t] = max(red[t], red[t + width])
            cuda.syncthreads()
            width //= 2
        s = div_rn(red[r * 32], float32(E4M3_MAX))
        if live:
            out = uint32(0)
            if s > float32(0.0):
                out = uint32(e4m3x2(div_rn(lo(w0), s), div_rn(hi(w0), s))
                             | (e4m3x2(div_rn(lo(w1), s), div_rn(hi(w1), s)) << 16))
            q8[row, lane] = out
            if lane == 0:
                s_q[row] = s

    @cuda.jit
    def kv_block_kernel(k, v, blocks, partials):
        """Per 128-key block: partials[0] = its keys of k added in token order, partials[1] =
        amax |v| over them (f32 [2, n, heads, 128]). Grid (n, heads), one thread per channel: the
        work of a long segment spreads over its blocks instead of one CTA per (segment, head)."""
        blk, h, c = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
        first, count = blocks[blk, 1], blocks[blk, 2]
        total = float32(0.0)
        amax = float32(0.0)
        for t in range(first, first + count):
            total = float32(total + f32_from_bf16(k[t, h, c]))
            amax = max(amax, abs(f32_from_bf16(v[t, h, c])))
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
        Grid (n, heads), one thread per channel."""
        blk, h, c = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
        red = cuda.shared.array(HEAD_DIM, float32)
        seg, first, count = blocks[blk, 0], blocks[blk, 1], blocks[blk, 2]
        m = mu[seg, h, c]
        amax = float32(0.0)
        for t in range(first, first + count):
            amax = max(amax, abs(float32(f32_from_bf16(k[t, h, c]) - m)))
        red[c] = amax
        cuda.syncthreads()
        half = HEAD_DIM // 2
        while half > 0:
            if c < half:
                red[c] = max(red[c], red[c + half])
            cuda.syncthreads()
            half //= 2
        s = div_rn(red[0], float32(E4M3_MAX))
        for t in range(first, first + count):
            code = 0
            if s > float32(0.0):
                code = e4m3(div_rn(float32(f32_from_bf16(k[t, h, c]) - m), s))
            k8[t, h, c] = code
        if c == 0:
            s_k[blk, h] = s

    @cuda.jit
    def v_quant_kernel(v, s_v, blocks, v8t):
        """v8t: uint8 [heads, 128, n * 128] (the module docstring's layout). Grid (n, heads).
        Thread x first quantizes channel x of the block's keys into shared memory, then writes
        column x (key v_key_at(x)) of every channel row, so that global writes are coalesced."""
        blk, h, x = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
        tile = cuda.shared.array((K_BLOCK, V_TILE_COLS), uint8)
        seg, first, count = blocks[blk, 0], blocks[blk, 1], blocks[blk, 2]
        s = s_v[seg, h, x]
        for i in range(K_BLOCK):
            code = 0
            if i < count and s > float32(0.0):
                code = e4m3(div_rn(f32_from_bf16(v[first + i, h, x]), s))
            tile[i, x] = code
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
    tokens, heads, _ = q.shape
    segments = cu.shape[0] - 1
    qk, kv_block, kv_segment, kq, vq = kernels()
    cfg = (lambda grid, block: (grid, block) if stream is None else (grid, block, stream))
    if tokens:
        rows = tokens * heads
        qk[cfg(-(-rows // Q_ROWS_PER_CTA), Q_THREADS)](q.reshape(rows, HEAD_DIM).view(np.uint64),
                                                        q8.reshape(rows, HEAD_DIM).view(np.uint32), s_q.reshape(rows))
    if blocks.shape[0]:
        kv_block[cfg((blocks.shape[0], heads), HEAD_DIM)](k, v, blocks, partials)
    if segments and tokens:
        kv_segment[cfg((segments, heads), HEAD_DIM)](cu, block_offset, partials, mu, s_v)
    if blocks.shape[0]:
        kq[cfg((blocks.shape[0], heads), HEAD_DIM)](k, mu, blocks, k8, s_k)
        vq[cfg((blocks.shape[0], heads), HEAD_DIM)](v, s_v, blocks, v8t)
