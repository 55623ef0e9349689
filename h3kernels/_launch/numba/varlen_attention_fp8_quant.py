"""The quantization passes of minimax_h3_varlen_attention_fp8 (Numba, raw bits).

docs/spec.md, Attention:
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
(n = key blocks, numbered by varlen_attention_fp8_plan.key_blocks): channel rows with keys
contiguous, so the kernel loads it with cp.async as a K-major B operand. Key block b (segment
seg, first key f, `count` keys) fills columns 128 * b .. 128 * b + 127: a segment starts 16-byte
aligned at column 128 * block_offset[seg], and the columns past its last key are zero, so the
kernel's key blocks read finite bytes that meet P = 0. Inside every 16-key group the keys are
permuted (v_key_at): the kernel packs P into the PV mma's A fragment straight from its S
accumulators, which puts keys {2t, 2t+1, 8+2t, 9+2t} in the A k-columns 4t..4t+3 (see
cuda_src/varlen_attention_fp8.cu), and B's k-rows must hold the same keys.

Where every segment has at most SEGMENT_BLOCKS key blocks (varlen_attention_fp8_plan.one_read),
k_segment_kernel and v_segment_kernel take the place of the four K and V passes: a CTA per
(segment, head), each half the quantizer of one block, reads the segment's keys once into
registers and computes the same statistics in the same order (the block sums in token order
through a shared tile, then added in block order), then the codes.

Where other ranks hold keys of the same segments (ring sequence parallelism), their statistics
combine between the passes: kv_segment_sums_kernel gives each segment's undivided key sums and
amax |v|, k_quant_kernel (k8 empty: no codes) on blocks cut on the whole segment's 128-key grid
each block's s_k over the rank's keys (RN(amax / 448) is monotonic in the amax: the maximum over the ranks' scales is
the whole block's), and k_quant_given_kernel quantizes K with the combined scales
(segment_sum_passes, kv_quant_passes' K pass, k_given_scale_passes).
"""
import threading

import numpy as np
from numba import cuda, float32, uint32, uint64  # module level: the simulator swaps this global for its fake

from h3kernels.constants import E4M3_MAX, HEAD_DIM, K_BLOCK
from h3kernels._launch.varlen_attention_fp8_plan import key_blocks  # noqa: F401 (the one numbering)
# module globals: Numba reads them as compile-time constants
from h3kernels._launch.numba.geometry import BATCH, KEYS_PER_WARP, KV_BLOCK_THREADS, KV_WARPS  # noqa: F401
from h3kernels._launch.numba.geometry import QUANT_THREADS, QUANT_WARPS, RED_GROUPS, RED_SIZE, RED_WIDTH  # noqa: F401
from h3kernels._launch.numba.geometry import SEGMENT_BLOCKS, SEGMENT_THREADS, SEGMENT_WARPS  # noqa: F401
from h3kernels._launch.numba.geometry import Q_ROWS_PER_CTA, SEG_BATCH, SEG_THREADS  # noqa: F401
from h3kernels._launch.numba.geometry import Q_PARTS, Q_RED_COLS, Q_ROWS_PER_WARP, Q_THREADS, Q_WORDS, TILE_WORDS

_lock = threading.Lock()
_kernels = None


def _build():
    from h3kernels._launch.numba.fp8_bits import MIN_FAST_SCALE_FP32, device_function, make_quotient, make_range
    from h3kernels._launch.numba.fp8_bits import primitives

    p = primitives()
    e4m3x2, div_rn = p.e4m3x2_from_f32, p.div_rn
    mx = p.max_nan  # amaxes keep a NaN (its scale turns NaN, as the reference's), where max() drops it
    lo, hi, word = p.f32_from_bf16_lo, p.f32_from_bf16_hi, p.quad_word
    # Q and V divide bf16 values by their own amax / 448: Q tests the range once per row, V once
    # per lane for its four channels (the rare lane outside it tests every quotient); K divides
    # FP32 values (the centred keys), whose range is narrower, once per block
    quotient, quotient_or_div, in_range = make_quotient(p.fma_rn, div_rn)
    in_fp32_range = make_range(MIN_FAST_SCALE_FP32)
    key_at = device_function(v_key_at)

    @cuda.jit
    def q_kernel(q, q8, s_q, rows):
        """q: uint64 [rows * 32] (bf16 quads; rows = tokens * heads); q8: uint32 [rows * 32] (e4m3
        quads); s_q: f32 [rows]. A warp per row, Q_ROWS_PER_WARP rows per warp: its 32 lanes read
        a row's 256 bytes at once. Unsigned indices: Numba wraps every signed one."""
        t = uint64(cuda.threadIdx.x)
        lane, w = t % uint64(32), t // uint64(32)
        base = uint64(cuda.blockIdx.x) * uint64(Q_ROWS_PER_CTA) + w * uint64(Q_ROWS_PER_WARP)
        red = cuda.shared.array((Q_ROWS_PER_CTA, Q_RED_COLS), float32)
        part = cuda.shared.array((Q_ROWS_PER_CTA, Q_PARTS), float32)
        words = cuda.local.array(Q_WORDS, uint32)
        for i in range(Q_ROWS_PER_WARP):
            quad = uint64(0)
            if base + uint64(i) < rows:
                quad = q[(base + uint64(i)) * uint64(32) + lane]
            words[2 * i], words[2 * i + 1] = word(quad, 0), word(quad, 1)
        for i in range(Q_ROWS_PER_WARP):
            w0, w1 = words[2 * i], words[2 * i + 1]
            red[w * uint64(Q_ROWS_PER_WARP) + uint64(i), lane] = mx(mx(abs(lo(w0)), abs(hi(w0))),
                                                                   mx(abs(lo(w1)), abs(hi(w1))))
        cuda.syncthreads()
        # two steps per row, not a five-level tree (the simulator has no warp shuffles): lane l
        # takes the max of part l % Q_PARTS of the warp's row l // Q_PARTS (rows 33 words apart:
        # no bank conflicts), then every lane reads its rows' Q_PARTS maxima
        r = w * uint64(Q_ROWS_PER_WARP) + lane // uint64(Q_PARTS)
        c0 = (lane % uint64(Q_PARTS)) * uint64(32 // Q_PARTS)
        m = red[r, c0]
        for j in range(1, 32 // Q_PARTS):
            m = mx(m, red[r, c0 + uint64(j)])
        part[r, lane % uint64(Q_PARTS)] = m
        cuda.syncthreads()
        for i in range(Q_ROWS_PER_WARP):
            row = base + uint64(i)
            if row < rows:
                r = w * uint64(Q_ROWS_PER_WARP) + uint64(i)
                amax = part[r, uint64(0)]
                for j in range(1, Q_PARTS):
                    amax = mx(amax, part[r, uint64(j)])
                s = div_rn(amax, float32(E4M3_MAX))
                out = uint32(0)
                w0, w1 = words[2 * i], words[2 * i + 1]
                if in_range(s):  # one range test per row, then the division-free quotients
                    inv = div_rn(float32(1.0), s)
                    out = uint32(e4m3x2(quotient(lo(w0), s, inv), quotient(hi(w0), s, inv))
                                 | (e4m3x2(quotient(lo(w1), s, inv), quotient(hi(w1), s, inv)) << 16))
                elif s > float32(0.0):
                    out = uint32(e4m3x2(div_rn(lo(w0), s), div_rn(hi(w0), s))
                                 | (e4m3x2(div_rn(lo(w1), s), div_rn(hi(w1), s)) << 16))
                q8[row * uint64(32) + lane] = out
                if lane == uint64(0):
                    s_q[row] = s

    @device_function
    def kept_byte(s, shift):
        """0xFF << shift where a channel's scale is nonzero: the bytes of the V codes to keep."""
        if s > float32(0.0):
            return uint32(0xFF) << uint32(shift)
        return uint32(0)

    @device_function
    def divisor(s):
        """The scale, or 1 for a zero scale (whose codes kept_byte masks): no 0/0."""
        if s > float32(0.0):
            return s
        return float32(1.0)

    @device_function
    def load_batch(src, quads, at, step, t0, count):
        """quads[i] = the quad at `at` of key t0 + i (0 past `count`): all BATCH loads issued
        before any is used."""
        for i in range(BATCH):
            quads[i] = uint64(0)
            if t0 + uint64(i) < count:
                quads[i] = src[at + (t0 + uint64(i)) * step]

    @cuda.jit
    def kv_block_kernel(k, v, blocks, partials, heads, n):
        """Per 128-key block: partials[0] = its keys of k added in token order, partials[1] =
        amax |v| over them (f32 [2 * n * heads * 128]). k, v: uint64 [tokens * heads * 32] (bf16
        quads). CTA c: head c % heads, blocks 4 (c // heads) + w % 4; warps 0-3 add K, warps 4-7
        take V's amax (one tensor per warp: half the registers of a lane that holds both, so
        twice the warps per SM to hide the loads). Lane l holds channels 4l .. 4l + 3, whose sums
        must run in token order, so a warp walks its block's keys in order with BATCH loads in
        flight. Heads fastest: the CTAs in flight read whole token rows."""
        t = uint64(cuda.threadIdx.x)
        lane, w = t % uint64(32), t // uint64(32)
        bid = uint64(cuda.blockIdx.x)
        h = bid % heads
        blk = (bid // heads) * uint64(KV_WARPS) + w % uint64(KV_WARPS)
        if blk < n:
            first, count = uint64(blocks[blk, 1]), uint64(blocks[blk, 2])
            step = heads * uint64(32)
            at = (first * heads + h) * uint64(32) + lane
            quads = cuda.local.array(BATCH, uint64)
            r0, r1, r2, r3 = float32(0.0), float32(0.0), float32(0.0), float32(0.0)
            out = (blk * heads + h) * uint64(HEAD_DIM) + uint64(4) * lane
            if w < uint64(KV_WARPS):
                for t0 in range(uint64(0), count, uint64(BATCH)):
                    load_batch(k, quads, at, step, t0, count)
                    for i in range(BATCH):
                        if t0 + uint64(i) < count:
                            k0, k1 = word(quads[i], 0), word(quads[i], 1)
                            r0, r1 = float32(r0 + lo(k0)), float32(r1 + hi(k0))
                            r2, r3 = float32(r2 + lo(k1)), float32(r3 + hi(k1))
            else:
                for t0 in range(uint64(0), count, uint64(BATCH)):
                    load_batch(v, quads, at, step, t0, count)
                    for i in range(BATCH):  # the zero quads past `count` leave an amax as it is
                        v0, v1 = word(quads[i], 0), word(quads[i], 1)
                        r0, r1 = mx(r0, abs(lo(v0))), mx(r1, abs(hi(v0)))
                        r2, r3 = mx(r2, abs(lo(v1))), mx(r3, abs(hi(v1)))
                out += n * heads * uint64(HEAD_DIM)  # the amax plane
            partials[out], partials[out + uint64(1)] = r0, r1
            partials[out + uint64(2)], partials[out + uint64(3)] = r2, r3

    @device_function
    def segment_reduce(block_offset, partials, part, seg, h, t):
        """(plane, channel c, the reduction): thread t of a segment kernel's CTA (seg, h) reduces
        plane t // 128 of the segment's block partials (0: the K sums added in block order, 1: the
        V amaxes' maximum) for channel t % 128. part: f32 [SEG_BATCH] scratch."""
        plane, c = t // uint64(HEAD_DIM), t % uint64(HEAD_DIM)
        b0, b1 = uint64(block_offset[seg]), uint64(block_offset[seg + uint64(1)])
        acc = float32(0.0)
        for j0 in range(b0, b1, uint64(SEG_BATCH)):  # a long segment has many blocks: loads in flight
            for i in range(SEG_BATCH):
                part[i] = float32(0.0)
                if j0 + uint64(i) < b1:
                    part[i] = partials[plane, j0 + uint64(i), h, c]
            if plane == uint64(0):
                for i in range(SEG_BATCH):
                    if j0 + uint64(i) < b1:
                        acc = float32(acc + part[i])
            else:
                for i in range(SEG_BATCH):
                    acc = mx(acc, part[i])
        return plane, c, acc

    @cuda.jit
    def kv_segment_kernel(cu, block_offset, partials, mu, s_v):
        """mu = RN(the segment's block sums added in block order / L) and s_v = RN(amax / 448),
        f32 [segments, heads, 128] each. Grid (segments, heads), SEG_THREADS threads: thread t
        takes plane t // 128 of the partials (0: K sums, 1: V amaxes) for channel t % 128."""
        seg, h = uint64(cuda.blockIdx.x), uint64(cuda.blockIdx.y)
        plane, c, acc = segment_reduce(block_offset, partials, cuda.local.array(SEG_BATCH, float32), seg, h,
                                       uint64(cuda.threadIdx.x))
        if plane == uint64(0):
            a, b = cu[seg], cu[seg + uint64(1)]
            mean = float32(0.0)
            if b > a:
                mean = div_rn(acc, float32(b - a))
            mu[seg, h, c] = mean
        else:
            s_v[seg, h, c] = div_rn(acc, float32(E4M3_MAX))

    @cuda.jit
    def kv_segment_sums_kernel(block_offset, partials, sums, v_amax):
        """kv_segment_kernel's reductions undivided, for keys a segment shares with other ranks,
        whose sums and amaxes those ranks combine before the mean and the scale: sums = the
        segment's block sums of k added in block order, v_amax = amax |v| over its keys, f32
        [segments, heads, 128] each (zeros for a segment without blocks). Grid and threads as
        kv_segment_kernel's."""
        seg, h = uint64(cuda.blockIdx.x), uint64(cuda.blockIdx.y)
        plane, c, acc = segment_reduce(block_offset, partials, cuda.local.array(SEG_BATCH, float32), seg, h,
                                       uint64(cuda.threadIdx.x))
        if plane == uint64(0):
            sums[seg, h, c] = acc
        else:
            v_amax[seg, h, c] = acc

    @device_function
    def block_coords(blocks, heads, t, bid):
        """Where thread t of K/V quantizer CTA bid works: (warp w, head, key block, keys in the
        block, the quad stride between w's keys w, w + QUANT_WARPS, ..., the quad of its lane's
        four channels at key w, and the index of those channels in a [segments, heads, 128] array)."""
        lane, w = t % uint64(32), t // uint64(32)
        h, blk = bid % heads, bid // heads
        seg, first, count = uint64(blocks[blk, 0]), uint64(blocks[blk, 1]), uint64(blocks[blk, 2])
        at = ((first + w) * heads + h) * uint64(32) + lane
        channels = (seg * heads + h) * uint64(HEAD_DIM) + uint64(4) * lane
        return w, h, blk, count, heads * uint64(32 * QUANT_WARPS), at, channels

    @device_function
    def load_keys(src, quads, at, step, first, stride, count):
        """quads[i] = the lane's bf16 quad of key first + stride i of the block (0 past its end, at
        `count`; quad i at at + i step): all loads issued before any is used, and held in
        registers. The quantizers take keys w, w + 8, ... (stride QUANT_WARPS), the one-read K
        pass a run of keys (stride 1)."""
        for i in range(KEYS_PER_WARP):
            quads[i] = uint64(0)
            if first + stride * uint64(i) < count:
                quads[i] = src[at + uint64(i) * step]

    @device_function
    def k_block(k, mu, blocks, heads, t, bid, kq):
        """Thread t's part of K quantizer CTA bid's block, its keys loaded into kq: (warp w, the
        block's s_k index, keys, step and at as block_coords's, the four channels' means)."""
        w, h, blk, count, step, at, mi = block_coords(blocks, heads, t, bid)
        m0, m1, m2, m3 = mu[mi], mu[mi + uint64(1)], mu[mi + uint64(2)], mu[mi + uint64(3)]
        load_keys(k, kq, at, step, w, uint64(QUANT_WARPS), count)
        return w, blk * heads + h, count, step, at, m0, m1, m2, m3

    @device_function
    def centred(quad, m0, m1, m2, m3):
        """k' = RN(k - mu) of a quad's four channels."""
        k0, k1 = word(quad, 0), word(quad, 1)
        return float32(lo(k0) - m0), float32(hi(k0) - m1), float32(lo(k1) - m2), float32(hi(k1) - m3)

    @device_function
    def thread_amax(red, kq, t, first, stride, count, m0, m1, m2, m3):
        """Step one of the block's amax |k'|: red[t] = the thread's amax over its keys (load_keys').
        Then, each after a barrier, group_max and groups_max."""
        amax = float32(0.0)
        for i in range(KEYS_PER_WARP):
            if first + stride * uint64(i) < count:
                c0, c1, c2, c3 = centred(kq[i], m0, m1, m2, m3)
                amax = mx(mx(amax, mx(abs(c0), abs(c1))), mx(abs(c2), abs(c3)))
        red[t] = amax

    # the block's amax in two barriers: RED_GROUPS threads take RED_WIDTH values each, then every
    # thread those maxima (a max is the same in any order)
    @device_function
    def group_max(red, t):
        if t < uint64(RED_GROUPS):
            m = red[t * uint64(RED_WIDTH)]
            for j in range(1, RED_WIDTH):
                m = mx(m, red[t * uint64(RED_WIDTH) + uint64(j)])
            red[uint64(QUANT_THREADS) + t] = m

    @device_function
    def groups_max(red):
        amax = red[uint64(QUANT_THREADS)]
        for j in range(1, RED_GROUPS):
            amax = mx(amax, red[uint64(QUANT_THREADS + j)])
        return amax

    @device_function
    def k_codes(kq, k8, at, step, first, stride, count, m0, m1, m2, m3, s):
        """k8 at the thread's keys (load_keys') = e4m3(RN(k' / s)), zeros for a zero scale: the
        division-free quotient where s is in its FP32 range (the block's usual case), else exact
        divisions."""
        if in_fp32_range(s):
            inv = div_rn(float32(1.0), s)
            for i in range(KEYS_PER_WARP):
                if first + stride * uint64(i) < count:
                    c0, c1, c2, c3 = centred(kq[i], m0, m1, m2, m3)
                    k8[at + uint64(i) * step] = uint32(e4m3x2(quotient(c0, s, inv), quotient(c1, s, inv))
                                                       | (e4m3x2(quotient(c2, s, inv), quotient(c3, s, inv)) << 16))
            return
        for i in range(KEYS_PER_WARP):
            if first + stride * uint64(i) < count:
                out = uint32(0)
                if s > float32(0.0):
                    c0, c1, c2, c3 = centred(kq[i], m0, m1, m2, m3)
                    out = uint32(e4m3x2(div_rn(c0, s), div_rn(c1, s)) | (e4m3x2(div_rn(c2, s), div_rn(c3, s)) << 16))
                k8[at + uint64(i) * step] = out

    @cuda.jit
    def k_quant_kernel(k, mu, blocks, k8, s_k, heads):
        """k: uint64 [tokens * heads * 32] (bf16 quads); mu: f32 [segments * heads * 128]; blocks:
        int64 [n, 3] (segment, first key, keys); k8: uint32 [tokens * heads * 32] (e4m3 quads);
        s_k: f32 [n * heads]. CTA c: block c // heads, head c % heads; warp w holds keys
        w, w + 8, ... of the block in registers (one read), lane l channels 4l .. 4l + 3. An empty
        k8: the scales alone (the ring's statistics of blocks whose keys other ranks share)."""
        t = uint64(cuda.threadIdx.x)
        red = cuda.shared.array(RED_SIZE, float32)
        kq = cuda.local.array(KEYS_PER_WARP, uint64)
        w, sk, count, step, at, m0, m1, m2, m3 = k_block(k, mu, blocks, heads, t, uint64(cuda.blockIdx.x), kq)
        thread_amax(red, kq, t, w, uint64(QUANT_WARPS), count, m0, m1, m2, m3)
        cuda.syncthreads()
        group_max(red, t)
        cuda.syncthreads()
        s = div_rn(groups_max(red), float32(E4M3_MAX))
        if k8.shape[0] > 0:
            k_codes(kq, k8, at, step, w, uint64(QUANT_WARPS), count, m0, m1, m2, m3, s)
        if t == uint64(0):
            s_k[sk] = s

    @cuda.jit
    def k_quant_given_kernel(k, mu, blocks, k8, s_k, heads):
        """k_quant_kernel's codes with the block's scale given in s_k (read, not written): that of
        the whole segment's 128-key block, whose keys may lie partly on other ranks."""
        t = uint64(cuda.threadIdx.x)
        kq = cuda.local.array(KEYS_PER_WARP, uint64)
        w, sk, count, step, at, m0, m1, m2, m3 = k_block(k, mu, blocks, heads, t, uint64(cuda.blockIdx.x), kq)
        k_codes(kq, k8, at, step, w, uint64(QUANT_WARPS), count, m0, m1, m2, m3, s_k[sk])

    @device_function
    def v_channel_codes(s0, s1, s2, s3):
        """The lane's four channels' quantizer: (keep, the divisors, their reciprocals). Codes go
        through e4m3x2 in pairs; a zero-scale channel divides by 1 instead, and its byte is masked
        to 0 afterwards (keep)."""
        keep = kept_byte(s0, 0) | kept_byte(s1, 8) | kept_byte(s2, 16) | kept_byte(s3, 24)
        s0, s1, s2, s3 = divisor(s0), divisor(s1), divisor(s2), divisor(s3)
        one = float32(1.0)
        return keep, s0, s1, s2, s3, div_rn(one, s0), div_rn(one, s1), div_rn(one, s2), div_rn(one, s3)

    @device_function
    def v_block(vq, tile, v8t, t, count, h, blk, row_words, keep, s0, s1, s2, s3, i0, i1, i2, i3):
        """One key block's V codes from the lane's quads vq (keys w, w + 8, ... of the block, its
        `count` keys), through the shared tile, to its columns of v8t (block blk of row_words words
        a channel row). Warp w first quantizes its keys into the tile, then writes the channel rows
        of channel quads w, w + 8, ..., lane l the four columns 4l .. 4l + 3 (keys v_key_at(column))
        as one word: 128-byte coalesced rows, four from each four tile words a lane reads. Nothing
        is written where count is 0 (a segment kernel's missing block); ends on a barrier, so the
        tile may be written again."""
        lane, w = t % uint64(32), t // uint64(32)
        # No test per key: the quads past `count` are zeros (load_keys), whose codes are 0. The
        # range of the division-free quotient is tested once for the lane's four channels; the
        # rare lane outside it tests every quotient.
        if in_range(s0) and in_range(s1) and in_range(s2) and in_range(s3):
            for i in range(KEYS_PER_WARP):
                v0, v1 = word(vq[i], 0), word(vq[i], 1)
                tile[w + uint64(QUANT_WARPS * i), lane] = keep & uint32(
                    e4m3x2(quotient(lo(v0), s0, i0), quotient(hi(v0), s1, i1))
                    | (e4m3x2(quotient(lo(v1), s2, i2), quotient(hi(v1), s3, i3)) << 16))
        else:
            for i in range(KEYS_PER_WARP):
                v0, v1 = word(vq[i], 0), word(vq[i], 1)
                tile[w + uint64(QUANT_WARPS * i), lane] = keep & uint32(
                    e4m3x2(quotient_or_div(lo(v0), s0, i0), quotient_or_div(hi(v0), s1, i1))
                    | (e4m3x2(quotient_or_div(lo(v1), s2, i2), quotient_or_div(hi(v1), s3, i3)) << 16))
        cuda.syncthreads()
        # lane l's output columns 4l .. 4l + 3 hold keys key_at(4l + b); one tile word holds four
        # channels of a key, so four words give the lane's word of four channel rows
        col = uint64(4) * lane
        k0, k1, k2, k3 = key_at(col), key_at(col + uint64(1)), key_at(col + uint64(2)), key_at(col + uint64(3))
        at = h * uint64(HEAD_DIM) * row_words + blk * uint64(K_BLOCK // 4) + lane
        for r in range(HEAD_DIM // (4 * QUANT_WARPS) if count > uint64(0) else 0):  # count 0: no block
            g = w + uint64(QUANT_WARPS * r)  # channels 4g .. 4g + 3
            x0, x1, x2, x3 = tile[k0, g], tile[k1, g], tile[k2, g], tile[k3, g]
            for j in range(4):
                sh = uint32(8 * j)
                codes = (((x0 >> sh) & uint32(0xFF)) | (((x1 >> sh) & uint32(0xFF)) << uint32(8))
                         | (((x2 >> sh) & uint32(0xFF)) << uint32(16)) | (((x3 >> sh) & uint32(0xFF)) << uint32(24)))
                v8t[at + (uint64(4) * g + uint64(j)) * row_words] = codes
        cuda.syncthreads()

    @cuda.jit
    def v_quant_kernel(v, s_v, blocks, v8t, heads, n):
        """v: uint64 [tokens * heads * 32] (bf16 quads); s_v: f32 [segments * heads * 128]; v8t:
        uint32 [heads * 128 * n * 32], the module docstring's layout in 4-byte words. CTA c: block
        c // heads, head c % heads; warp w holds keys w, w + 8, ... of the block (lane l: channels
        4l .. 4l + 3), written through a shared tile (v_block)."""
        t = uint64(cuda.threadIdx.x)
        tile = cuda.shared.array((K_BLOCK, TILE_WORDS), uint32)
        vq = cuda.local.array(KEYS_PER_WARP, uint64)
        w, h, blk, count, step, at, sv = block_coords(blocks, heads, t, uint64(cuda.blockIdx.x))
        keep, s0, s1, s2, s3, i0, i1, i2, i3 = v_channel_codes(s_v[sv], s_v[sv + uint64(1)], s_v[sv + uint64(2)],
                                                               s_v[sv + uint64(3)])
        load_keys(v, vq, at, step, w, uint64(QUANT_WARPS), count)
        v_block(vq, tile, v8t, t, count, h, blk, n * uint64(K_BLOCK // 4), keep, s0, s1, s2, s3, i0, i1, i2, i3)

    @device_function
    def segment_block(src, quads, cu, seg, h, heads, t, runs):
        """Where thread t of a segment kernel's CTA works: the CTA's half t // QUANT_THREADS holds
        key block b of the segment, lane l channels 4l .. 4l + 3 of KEYS_PER_WARP keys of it,
        loaded into quads at once: warp w keys w, w + 8, ... as a quantizer CTA holds them, or with
        `runs` the run 16 w .. 16 w + 15. Returns (b, the thread's index in its half, the first of
        its keys, their stride, keys of the segment, keys of block b, the quad of the first key,
        the stride between its quads)."""
        b, tb = t // uint64(QUANT_THREADS), t % uint64(QUANT_THREADS)
        w = tb // uint64(32)
        a, e = uint64(cu[seg]), uint64(cu[seg + uint64(1)])
        count = e - a if e > a else uint64(0)
        start = uint64(K_BLOCK) * b
        keys = min(count - start, uint64(K_BLOCK)) if count > start else uint64(0)
        first, stride = (uint64(KEYS_PER_WARP) * w, uint64(1)) if runs else (w, uint64(QUANT_WARPS))
        at = ((a + start + first) * heads + h) * uint64(32) + tb % uint64(32)
        step = heads * uint64(32) * stride
        load_keys(src, quads, at, step, first, stride, keys)
        return b, tb, first, stride, count, keys, at, step

    @cuda.jit
    def k_segment_kernel(k, cu, block_offset, mu, k8, s_k, heads):
        """The K passes of a segment of at most SEGMENT_BLOCKS (2) key blocks in one read: CTA
        (segment, head) of SEGMENT_THREADS threads, each half a K quantizer CTA of one block (its
        keys in registers, warp w the run 16 w .. 16 w + 15); mu: f32 [segments * heads * 128];
        k8, s_k as k_quant_kernel's. The mean is kv_segment_kernel's: each block's sums in token
        order, as kv_block_kernel adds them (the warps of a half add their runs in turn, each
        onto the sums the one before left in shared memory), the block sums added in block order,
        over L."""
        seg, h, t = uint64(cuda.blockIdx.x), uint64(cuda.blockIdx.y), uint64(cuda.threadIdx.x)
        run = cuda.shared.array((SEGMENT_BLOCKS, HEAD_DIM), float32)
        means = cuda.shared.array(HEAD_DIM, float32)
        red = cuda.shared.array((SEGMENT_BLOCKS, RED_SIZE), float32)
        kq = cuda.local.array(KEYS_PER_WARP, uint64)
        b, tb, first, stride, count, keys, at, step = segment_block(k, kq, cu, seg, h, heads, t, True)
        w, c = tb // uint64(32), uint64(4) * (tb % uint64(32))
        # Warp w adds its run in turn w, onto what warp w - 1 left; every thread passes every
        # turn's barrier (a barrier is CTA-convergent). Block 0 has the most keys, so the turns
        # end with its last run; a warp of block 1 without keys passes the sums on unchanged. The
        # turn count is a run-time value: unrolled, the turns' copies of the body spilled.
        turns = (min(count, uint64(K_BLOCK)) + uint64(KEYS_PER_WARP - 1)) // uint64(KEYS_PER_WARP)
        for turn in range(turns):
            if w == turn:
                r0, r1, r2, r3 = float32(0.0), float32(0.0), float32(0.0), float32(0.0)
                if w > uint64(0):
                    r0, r1, r2, r3 = run[b, c], run[b, c + uint64(1)], run[b, c + uint64(2)], run[b, c + uint64(3)]
                for i in range(KEYS_PER_WARP):
                    if first + uint64(i) < keys:
                        k0, k1 = word(kq[i], 0), word(kq[i], 1)
                        r0, r1 = float32(r0 + lo(k0)), float32(r1 + hi(k0))
                        r2, r3 = float32(r2 + lo(k1)), float32(r3 + hi(k1))
                run[b, c], run[b, c + uint64(1)], run[b, c + uint64(2)], run[b, c + uint64(3)] = r0, r1, r2, r3
            cuda.syncthreads()
        if t < uint64(HEAD_DIM):
            mean = float32(0.0)
            if count > uint64(0):
                acc = float32(float32(0.0) + run[0, t])
                for bb in range(1, SEGMENT_BLOCKS):
                    if count > uint64(K_BLOCK * bb):
                        acc = float32(acc + run[bb, t])
                mean = div_rn(acc, float32(count))
            mu[(seg * heads + h) * uint64(HEAD_DIM) + t] = mean
            means[t] = mean
        cuda.syncthreads()
        m0, m1, m2, m3 = means[c], means[c + uint64(1)], means[c + uint64(2)], means[c + uint64(3)]
        # k_quant_kernel on the half's block (the barriers in both halves, a missing block's
        # amax 0 and no writes)
        thread_amax(red[b], kq, tb, first, stride, keys, m0, m1, m2, m3)
        cuda.syncthreads()
        group_max(red[b], tb)
        cuda.syncthreads()
        s = div_rn(groups_max(red[b]), float32(E4M3_MAX))
        k_codes(kq, k8, at, step, first, stride, keys, m0, m1, m2, m3, s)
        if tb == uint64(0) and keys > uint64(0):
            s_k[(uint64(block_offset[seg]) + b) * heads + h] = s

    @cuda.jit
    def v_segment_kernel(v, cu, block_offset, s_v, v8t, heads, n):
        """The V passes of a segment of at most SEGMENT_BLOCKS (2) key blocks in one read: CTA
        (segment, head) of SEGMENT_THREADS threads, each half a V quantizer CTA of one block (its
        keys in registers); s_v: f32 [segments * heads * 128]; v8t as v_quant_kernel's (n key
        blocks)."""
        seg, h, t = uint64(cuda.blockIdx.x), uint64(cuda.blockIdx.y), uint64(cuda.threadIdx.x)
        tile = cuda.shared.array((SEGMENT_BLOCKS, K_BLOCK, TILE_WORDS), uint32)
        warp_max = cuda.shared.array((SEGMENT_WARPS, HEAD_DIM), float32)
        scale = cuda.shared.array(HEAD_DIM, float32)
        vq = cuda.local.array(KEYS_PER_WARP, uint64)
        b, tb, first, stride, _, keys, at, step = segment_block(v, vq, cu, seg, h, heads, t, False)
        r0, r1, r2, r3 = float32(0.0), float32(0.0), float32(0.0), float32(0.0)
        for i in range(KEYS_PER_WARP):  # the zero quads past the end leave an amax as it is
            v0, v1 = word(vq[i], 0), word(vq[i], 1)
            r0, r1 = mx(r0, abs(lo(v0))), mx(r1, abs(hi(v0)))
            r2, r3 = mx(r2, abs(lo(v1))), mx(r3, abs(hi(v1)))
        c = uint64(4) * (t % uint64(32))
        warp = t // uint64(32)
        warp_max[warp, c], warp_max[warp, c + uint64(1)] = r0, r1
        warp_max[warp, c + uint64(2)], warp_max[warp, c + uint64(3)] = r2, r3
        cuda.syncthreads()
        if t < uint64(HEAD_DIM):  # a maximum is the same in any order
            amax = warp_max[0, t]
            for j in range(1, SEGMENT_WARPS):
                amax = mx(amax, warp_max[j, t])
            sv = div_rn(amax, float32(E4M3_MAX))
            s_v[(seg * heads + h) * uint64(HEAD_DIM) + t] = sv
            scale[t] = sv
        cuda.syncthreads()
        keep, s0, s1, s2, s3, i0, i1, i2, i3 = v_channel_codes(scale[c], scale[c + uint64(1)], scale[c + uint64(2)],
                                                               scale[c + uint64(3)])
        # the keys again, from L2 (this CTA read them a moment ago): held across the amax, they
        # spilled 120 bytes at 64 registers
        load_keys(v, vq, at, step, first, stride, keys)
        v_block(vq, tile[b], v8t, tb, keys, h, uint64(block_offset[seg]) + b, n * uint64(K_BLOCK // 4), keep, s0, s1,
                s2, s3, i0, i1, i2, i3)

    # the first five in launch order (numba_ptx indexes them), then the passes of keys shared
    # with other ranks, then the one-read passes of short segments
    return (q_kernel, kv_block_kernel, kv_segment_kernel, k_quant_kernel, v_quant_kernel, kv_segment_sums_kernel,
            k_quant_given_kernel, k_segment_kernel, v_segment_kernel)


def kernels():
    global _kernels
    with _lock:
        if _kernels is None:
            _kernels = _build()
        return _kernels


def v_key_at(p):
    """The key (within its 128-key block) that v8t column p of the block holds. p: a uint64, or
    a numpy array of them; v_quant_kernel calls this same function on the GPU, where the
    constants must be unsigned too (Numba would mix signed and unsigned into float64)."""
    u = np.uint64
    return ((p >> u(4)) << u(4)) | (((p >> u(2)) & u(3)) << u(1)) | (p & u(1)) | (((p >> u(1)) & u(1)) << u(3))


def v_transposed(v8, cu_seqlens_host):
    """numpy: v8t (the module docstring's layout) from v8 uint8 [tokens, heads, 128]. Tests use it."""
    v8 = np.asarray(v8)
    blocks = key_blocks(cu_seqlens_host)
    out = np.zeros((v8.shape[1], HEAD_DIM, len(blocks) * K_BLOCK), np.uint8)
    key = v_key_at(np.arange(K_BLOCK, dtype=np.uint64)).astype(np.int64)
    for b, (_, first, count) in enumerate(blocks):
        have = key < count
        out[:, :, b * K_BLOCK + np.nonzero(have)[0]] = v8[first + key[have]].transpose(1, 2, 0)
    return out


_NAMES = ("q_kernel", "kv_block_kernel", "kv_segment_kernel", "k_quant_kernel", "v_quant_kernel",
          "kv_segment_sums_kernel", "k_quant_given_kernel", "k_segment_kernel", "v_segment_kernel")  # kernels()' order


class _Passes(list):
    """(kernel name, thunk) pairs, each launch configured and its array views made once."""

    def __init__(self, stream):
        super().__init__()
        self.stream = stream

    def add(self, name, grid, block, *args):
        kernel = kernels()[_NAMES.index(name)]
        configured = kernel[(grid, block) if self.stream is None else (grid, block, self.stream)]
        self.append((name, lambda: configured(*args)))

    def kv_block(self, k, v, blocks, partials):
        n, heads = blocks.shape[0], k.shape[1]
        if n:
            self.add("kv_block_kernel", -(-n // KV_WARPS) * heads, KV_BLOCK_THREADS, _quads(k), _quads(v), blocks,
                     _flat(partials), np.uint64(heads), np.uint64(n))

    def k_quant(self, k, mu, blocks, k8_words, s_k, given=False):
        """The K pass: k_quant_kernel (s_k written; k8_words empty: no codes), or with `given`
        k_quant_given_kernel (s_k read)."""
        n, heads = blocks.shape[0], k.shape[1]
        if n:
            self.add("k_quant_given_kernel" if given else "k_quant_kernel", n * heads, QUANT_THREADS, _quads(k),
                     _flat(mu), blocks, k8_words, _flat(s_k), np.uint64(heads))

    def v_quant(self, v, s_v, blocks, v8t):
        n, heads = blocks.shape[0], v.shape[1]
        if n:
            self.add("v_quant_kernel", n * heads, QUANT_THREADS, _quads(v), _flat(s_v), blocks, _words(v8t),
                     np.uint64(heads), np.uint64(n))


def _flat(a):
    return a.reshape(a.size)


def _quads(a):
    """bf16 (uint16) [tokens, heads, 128] as its quads."""
    return _flat(a).view(np.uint64)


def _words(a):
    """e4m3 (uint8) codes as 4-byte words."""
    return _flat(a).view(np.uint32)


def launch(q, k, v, cu, blocks, block_offset, q8, s_q, mu, k8, s_k, v8t, s_v, partials, stream=None,
           one_read=False):
    """All passes. q, k, v: uint16 [tokens, heads, 128]; cu: int32 or int64 [segments + 1];
    blocks: from key_blocks; block_offset: int [segments + 1], each segment's first block (the
    plan's); partials: f32 [2, blocks, heads, 128] scratch; outputs as the kernels' docstrings
    say. one_read: the one-read K and V passes, for segments of at most SEGMENT_BLOCKS key blocks
    each (varlen_attention_fp8_plan.one_read). Arrays are Numba device arrays (or numpy arrays in
    the simulator); work goes on `stream`."""
    for _, run in passes(q, k, v, cu, blocks, block_offset, q8, s_q, mu, k8, s_k, v8t, s_v, partials, stream,
                         one_read):
        run()


def passes(q, k, v, cu, blocks, block_offset, q8, s_q, mu, k8, s_k, v8t, s_v, partials, stream=None,
           one_read=False):
    """launch's passes in order, as (kernel name, thunk) pairs, each launch configured and its
    array views made once: bench/bench_attention.py times each one."""
    tokens, heads, _ = q.shape
    segments = cu.shape[0] - 1
    rows = tokens * heads
    out = _Passes(stream)
    if tokens:
        out.add("q_kernel", -(-rows // Q_ROWS_PER_CTA), Q_THREADS, _quads(q), _words(q8), _flat(s_q), np.uint64(rows))
    if one_read:
        if segments and tokens:
            out.add("k_segment_kernel", (segments, heads), SEGMENT_THREADS, _quads(k), cu, block_offset, _flat(mu),
                    _words(k8), _flat(s_k), np.uint64(heads))
            out.add("v_segment_kernel", (segments, heads), SEGMENT_THREADS, _quads(v), cu, block_offset, _flat(s_v),
                    _words(v8t), np.uint64(heads), np.uint64(blocks.shape[0]))
        return list(out)
    out.kv_block(k, v, blocks, partials)
    if segments and tokens:
        out.add("kv_segment_kernel", (segments, heads), SEG_THREADS, cu, block_offset, partials, mu, s_v)
    return list(out) + kv_quant_passes(k, v, mu, s_v, blocks, k8, s_k, v8t, stream)


def k_scale_passes(k, mu, blocks, s_k, stream=None):
    """s_k alone (k_quant_kernel with an empty k8); mu: f32 [segments, heads, 128]."""
    out = _Passes(stream)
    out.k_quant(k, mu, blocks, _flat(s_k)[:0].view(np.uint32), s_k)  # k8 on s_k's side: a host array would be copied
    return list(out)


def kv_quant_passes(k, v, mu, s_v, blocks, k8, s_k, v8t, stream=None):
    """The K and V passes (k_quant_kernel, v_quant_kernel) with mu and s_v (f32 [segments, heads,
    128]) given; arrays and return value as passes'."""
    out = _Passes(stream)
    out.k_quant(k, mu, blocks, _words(k8), s_k)
    out.v_quant(v, s_v, blocks, v8t)
    return list(out)


# The passes of keys whose segments other ranks share, in three steps around the ranks' exchanges:
# segment_sum_passes (then the ranks add the sums and take the max of v_amax: mu = RN(sum / L),
# s_v = RN(amax / 448)), k_quant_kernel on blocks cut on the whole segments' 128-key grid (then the
# max of each block's s_k over the ranks that hold its keys) and k_given_scale_passes. blocks:
# int64 [n, 3]; k, v: uint16 [tokens, heads, 128]. Arrays and return values as passes'.

def segment_sum_passes(k, v, blocks, block_offset, partials, sums, v_amax, stream=None):
    """sums, v_amax: f32 [segments, heads, 128] (kv_segment_sums_kernel), with block_offset
    int [segments + 1] numbering blocks; partials: f32 [2, n, heads, 128] scratch."""
    segments = block_offset.shape[0] - 1
    out = _Passes(stream)
    out.kv_block(k, v, blocks, partials)
    if segments:
        out.add("kv_segment_sums_kernel", (segments, k.shape[1]), SEG_THREADS, block_offset, partials, sums, v_amax)
    return list(out)


def k_given_scale_passes(k, mu, blocks, k8, s_k, stream=None):
    """k8 with each block's scale given in s_k (f32 [n, heads]: k_quant_given_kernel); mu: f32
    [segments, heads, 128]."""
    out = _Passes(stream)
    out.k_quant(k, mu, blocks, _words(k8), s_k, given=True)
    return list(out)
