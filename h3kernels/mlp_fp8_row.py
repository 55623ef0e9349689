"""The MLP row kernel (Numba): RMSNorm + indexed AdaLN + per-token e4m3 quantization.

One CTA per row. It works on raw bits (bf16 as uint16, e4m3 as uint8) and reduces through
shared memory, so the same kernel runs under NUMBA_ENABLE_CUDASIM=1 (CI) and on the GPU.
Every FP32 result is rounded explicitly (float32(...)) so that the simulator, which computes
in float64, rounds exactly where the GPU does.
"""
import math
import threading

import numpy as np
from numba import cuda, float32  # module level: the simulator swaps this global for its fake

from .reference import ROW_THREADS
from .shapes import E4M3_MAX, HIDDEN

PER_THREAD = HIDDEN // ROW_THREADS
assert PER_THREAD * ROW_THREADS == HIDDEN

_lock = threading.Lock()
_kernel = None


def _build():
    from .fp8_bits import device_functions

    bits = device_functions()
    f32_from_bf16, round_bf16, e4m3_from_f32 = bits.f32_from_bf16, bits.round_bf16, bits.e4m3_from_f32

    @cuda.jit
    def row_kernel(x, norm_w, scale_tab, shift_tab, tab_stride, rows, index, eps, a_q, a_scale):
        row = cuda.blockIdx.x
        t = cuda.threadIdx.x
        buf = cuda.shared.array(HIDDEN, float32)
        red = cuda.shared.array(ROW_THREADS, float32)

        acc = float32(0.0)
        for j in range(PER_THREAD):
            c = t + j * ROW_THREADS
            v = f32_from_bf16(x[row, c])
            buf[c] = v
            acc = float32(acc + float32(v * v))  # v*v is exact: v is bf16
        red[t] = acc
        cuda.syncthreads()
        half = ROW_THREADS // 2
        while half > 0:
            if t < half:
                red[t] = float32(red[t] + red[t + half])
            cuda.syncthreads()
            half //= 2
        mean_sq = float32(red[0] / float32(HIDDEN))
        r = float32(float32(1.0) / float32(math.sqrt(float32(mean_sq + eps))))
        cuda.syncthreads()  # red[0] is reused below

        i = index[row]
        valid = i >= 0 and i < rows
        base = 0
        if valid:
            base = i * tab_stride
        amax = float32(0.0)
        for j in range(PER_THREAD):
            c = t + j * ROW_THREADS
            a = float32(0.0)
            if valid:
                n = round_bf16(float32(float32(buf[c] * r) * f32_from_bf16(norm_w[c])))
                s = round_bf16(float32(float32(1.0) + f32_from_bf16(scale_tab[base + c])))
                a = round_bf16(float32(float32(n * s) + f32_from_bf16(shift_tab[base + c])))
            buf[c] = a
            amax = max(amax, abs(a))
        red[t] = amax
        cuda.syncthreads()
        half = ROW_THREADS // 2
        while half > 0:
            if t < half:
                red[t] = max(red[t], red[t + half])
            cuda.syncthreads()
            half //= 2
        s_a = float32(red[0] / float32(E4M3_MAX))
        for j in range(PER_THREAD):
            c = t + j * ROW_THREADS
            q = 0
            if s_a > float32(0.0):
                q = e4m3_from_f32(float32(buf[c] / s_a))
            a_q[row, c] = q
        if t == 0:
            a_scale[row] = s_a

    return row_kernel


def kernel():
    global _kernel
    with _lock:
        if _kernel is None:
            _kernel = _build()
        return _kernel


def launch(x_bits, norm_w_bits, scale_flat, shift_flat, tab_stride, rows, index, eps, a_q_bits, a_scale,
           stream=None):
    """Runs the row kernel. Arrays: uint16 bf16 bits, int64 index, uint8 e4m3 bits, float32 scale.

    The AdaLN tables arrive flat from their base element: row i starts at i * tab_stride, so
    column chunks of a wider modulation projection need no copy.
    Device arrays are anything Numba accepts (CAI objects imported without a sync), launched on
    `stream` (a Numba stream); under the simulator they are numpy arrays.
    """
    m = x_bits.shape[0]
    if m == 0:
        return
    k = kernel()
    args = (x_bits, norm_w_bits, scale_flat, shift_flat, np.int64(tab_stride), np.int64(rows), index, np.float32(eps), a_q_bits, a_scale)
    if stream is None:
        k[m, ROW_THREADS](*args)
    else:
        k[m, ROW_THREADS, stream](*args)
