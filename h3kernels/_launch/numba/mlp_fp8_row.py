"""The MLP row kernel (Numba): RMSNorm + indexed AdaLN + per-token e4m3 quantization.

One CTA of ROW_THREADS threads per row. Inputs and outputs are raw bits, four elements per
access: bf16 quads as uint64, e4m3 quads as uint32. Each thread keeps its quads of x, then of
a, in registers; only the reductions go through shared memory, so
the same kernel runs under NUMBA_ENABLE_CUDASIM=1 (CI) and on the GPU. Every FP32 result is
rounded explicitly (float32(...)) because the simulator computes in float64.

The sum of squares is FP32 in a fixed order that h3kernels.reference reproduces: thread t
adds the squares of quads t, t + T, t + 2T, ... (the four elements of a quad in order), then
the T partials are halved pairwise down to 3, and the last three add as (p0 + p1) + p2.
"""
import threading

import numpy as np
from numba import cuda, float32, uint32, uint64  # module level: the simulator swaps this global for its fake

from h3kernels.constants import E4M3_MAX, HIDDEN, ROW_THREADS

QUADS = HIDDEN // 4
QUADS_PER_THREAD = QUADS // ROW_THREADS
assert QUADS_PER_THREAD * ROW_THREADS == QUADS

_lock = threading.Lock()
_kernel = None


def _build():
    from h3kernels._launch.numba.fp8_bits import make_quotient, primitives

    p = primitives()
    f32_from_bf16, bf16_from_f32, e4m3x2, div_rn, sqrt_rn, fma_rn = (
        p.f32_from_bf16, p.bf16_from_f32, p.e4m3x2_from_f32, p.div_rn, p.sqrt_rn, p.fma_rn)
    max_nan = p.max_nan  # a NaN anywhere in the row makes its amax and scale NaN, as the reference's
    # bf16 pairs in 32-bit words: one shift or mask per element to unpack, one cvt per pair to pack
    bf16x2, lo, hi, word = p.bf16x2_from_f32, p.f32_from_bf16_lo, p.f32_from_bf16_hi, p.quad_word

    quotient, _, in_quotient_range = make_quotient(fma_rn, div_rn)  # RN(a / s) by two FMAs

    @cuda.jit
    def row_kernel(x, norm_w, scale_tab, shift_tab, tab_stride, rows, index, eps, a_q, a_scale, zero):
        """x: uint64 [M, 1344]; norm_w: uint64 [1344]; tables: flat uint64 from their base, row i at
        i * tab_stride quads; index: int64 [M]; a_q: uint32 [M, 1344]; a_scale: float32 [M];
        zero: int32 [n], words that the GEMMs launched after this kernel need at 0 (their split
        counters or tile flags), which CTA 0 clears: a memset launch fewer per call."""
        # Unsigned indices throughout: Numba adds a negative-index wraparound to every signed one.
        row = uint64(cuda.blockIdx.x)
        t = uint64(cuda.threadIdx.x)
        if row == uint64(0):
            w = t
            while w < uint64(zero.shape[0]):
                zero[w] = 0
                w += uint64(ROW_THREADS)
        red = cuda.shared.array(ROW_THREADS, float32)
        xq = cuda.local.array(QUADS_PER_THREAD, uint64)  # x, then a, as bf16 quads in registers
        for j in range(QUADS_PER_THREAD):  # all loads first: QUADS_PER_THREAD in flight per thread
            xq[j] = x[row, t + uint64(j * ROW_THREADS)]
        acc = float32(0.0)
        for j in range(QUADS_PER_THREAD):
            for h in range(2):  # the quad's four elements in order
                w = word(xq[j], h)
                v0, v1 = lo(w), hi(w)
                acc = float32(acc + float32(v0 * v0))  # v*v is exact: v is bf16
                acc = float32(acc + float32(v1 * v1))
        red[t] = acc
        cuda.syncthreads()
        half = uint64(ROW_THREADS // 2)
        while True:  # 192 -> 96 -> ... -> 3 partials
            if t < half:
                red[t] = float32(red[t] + red[t + half])
            cuda.syncthreads()
            if half % uint64(2) == uint64(1):
                break
            half //= uint64(2)
        total = float32(float32(red[0] + red[1]) + red[2])
        mean_sq = div_rn(total, float32(HIDDEN))
        r = div_rn(float32(1.0), sqrt_rn(float32(mean_sq + eps)))
        cuda.syncthreads()  # everyone has read red[0..2] before it is reused

        i = index[row]
        valid = i >= 0 and i < rows
        amax = float32(0.0)
        if valid:
            base = uint64(i) * uint64(tab_stride)
            for j in range(QUADS_PER_THREAD):
                qd = t + uint64(j * ROW_THREADS)
                wq = norm_w[qd]
                sq = scale_tab[base + qd]
                hq = shift_tab[base + qd]
                packed = uint64(0)
                for h in range(2):
                    xw, ww, sw, hw = word(xq[j], h), word(wq, h), word(sq, h), word(hq, h)
                    n = bf16x2(float32(float32(lo(xw) * r) * lo(ww)), float32(float32(hi(xw) * r) * hi(ww)))
                    s = bf16x2(float32(float32(1.0) + lo(sw)), float32(float32(1.0) + hi(sw)))
                    # n * s is exact (two bf16 values), so a fused multiply-add rounds the same
                    v0 = float32(float32(lo(n) * lo(s)) + lo(hw))
                    v1 = float32(float32(hi(n) * hi(s)) + hi(hw))
                    # bf16 rounding is monotonic and odd, so the amax of the rounded pair is the
                    # rounded amax of (v0, v1): taken once, after the reduction
                    amax = max_nan(amax, max_nan(abs(v0), abs(v1)))
                    packed |= uint64(bf16x2(v0, v1)) << uint64(32 * h)
                xq[j] = packed
        red[t] = amax
        cuda.syncthreads()
        half = uint64(ROW_THREADS // 2)
        while True:
            if t < half:
                red[t] = max_nan(red[t], red[t + half])
            cuda.syncthreads()
            if half % uint64(2) == uint64(1):
                break
            half //= uint64(2)
        s_a = div_rn(f32_from_bf16(bf16_from_f32(max_nan(max_nan(red[0], red[1]), red[2]))), float32(E4M3_MAX))
        live = valid and s_a > float32(0.0)  # a NaN scale writes zero codes, as the reference
        inv = float32(0.0)
        if live:
            inv = div_rn(float32(1.0), s_a)
        # Rows outside the quotient's range (tiny, or an Inf in the AdaLN tables) divide every
        # element. The choice is per row, so no warp diverges on it, and there is one loop per
        # case, so the hot one carries no per-quad branches.
        if live and in_quotient_range(s_a):
            for j in range(QUADS_PER_THREAD):
                w0, w1 = word(xq[j], 0), word(xq[j], 1)
                q0, q1 = quotient(lo(w0), s_a, inv), quotient(hi(w0), s_a, inv)
                q2, q3 = quotient(lo(w1), s_a, inv), quotient(hi(w1), s_a, inv)
                a_q[row, t + uint64(j * ROW_THREADS)] = e4m3x2(q0, q1) | (e4m3x2(q2, q3) << 16)
        elif live:
            for j in range(QUADS_PER_THREAD):
                w0, w1 = word(xq[j], 0), word(xq[j], 1)
                q0, q1 = div_rn(lo(w0), s_a), div_rn(hi(w0), s_a)
                q2, q3 = div_rn(lo(w1), s_a), div_rn(hi(w1), s_a)
                a_q[row, t + uint64(j * ROW_THREADS)] = e4m3x2(q0, q1) | (e4m3x2(q2, q3) << 16)
        else:
            for j in range(QUADS_PER_THREAD):
                a_q[row, t + uint64(j * ROW_THREADS)] = 0
        if t == uint64(0):
            a_scale[row] = s_a

    return row_kernel


def kernel():
    global _kernel
    with _lock:
        if _kernel is None:
            _kernel = _build()
        return _kernel


def launch(x_quads, norm_w_quads, scale_flat, shift_flat, tab_stride_quads, rows, index, eps, a_q_quads,
           a_scale, zero=None, stream=None):
    """Runs the row kernel on raw-bit quad views (see row_kernel's docstring); zero: int32 words
    it clears, or None.

    Device arrays are anything Numba accepts, launched on `stream` (a Numba stream); under the
    simulator they are numpy arrays.
    """
    m = x_quads.shape[0]
    if m == 0:
        return
    k = kernel()
    if zero is None:
        zero = np.zeros(0, np.int32)
    args = (x_quads, norm_w_quads, scale_flat, shift_flat, np.int64(tab_stride_quads), np.int64(rows), index,
            np.float32(eps), a_q_quads, a_scale, zero)
    if stream is None:
        k[m, ROW_THREADS](*args)
    else:
        k[m, ROW_THREADS, stream](*args)
