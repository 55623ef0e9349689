"""bf16 and e4m3 conversions on raw bits, written once for three runners.

The Numba simulator has no FP8 or bf16 types, so the row kernel works on integer bit
patterns (uint16 bf16, uint8 e4m3). The same Python source below is
- compiled by Numba for the GPU (bit casts through libdevice),
- run by the Numba simulator (bit casts through numpy),
- run on the host by the tests, which compare it exhaustively against torch.
Only the two bit-cast primitives differ between runners: as_bits (f32 -> its uint32 pattern
as an integer) and f32_from_bf16 (bf16 pattern -> f32).
"""
from types import SimpleNamespace

import numpy as np

E4M3_MAX_BITS = 0x43E00000  # 448.0f
E4M3_MIN_NORMAL_BITS = 0x3C800000  # 2**-6
E4M3_REBIAS = 0x3C000000  # (127 - 7) << 23


def _define(as_bits, f32_from_bf16, jit):
    @jit
    def bf16_from_f32(f):
        u = as_bits(f)
        if (u & 0x7FFFFFFF) > 0x7F800000:
            return 0x7FC0
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF

    @jit
    def round_bf16(f):
        """FP32 -> nearest bf16 value, as FP32."""
        return f32_from_bf16(bf16_from_f32(f))

    @jit
    def e4m3_from_f32(f):
        """cvt.rn.satfinite.e4m3: nearest even, |v| >= 448 (and inf) saturates to 448."""
        u = as_bits(f)
        sign = (u >> 24) & 0x80
        a = u & 0x7FFFFFFF
        if a > 0x7F800000:
            return sign | 0x7F
        if a >= E4M3_MAX_BITS:
            return sign | 0x7E
        if a >= E4M3_MIN_NORMAL_BITS:
            v = a - E4M3_REBIAS
            return sign | ((v + 0x7FFFF + ((v >> 20) & 1)) >> 20)
        e = a >> 23
        if e < 117:  # below half the smallest subnormal 2**-9 (f32 denormals included)
            return sign
        mant = (a & 0x7FFFFF) | 0x800000
        shift = 141 - e  # value / 2**-9 == mant >> shift
        q = mant >> shift
        rem = mant & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        if rem > half or (rem == half and (q & 1) == 1):
            q += 1
        return sign | q

    return SimpleNamespace(f32_from_bf16=f32_from_bf16, bf16_from_f32=bf16_from_f32,
                           round_bf16=round_bf16, e4m3_from_f32=e4m3_from_f32)


def _py_as_bits(f):
    return int(np.float32(f).view(np.uint32))


def _py_f32_from_bf16(b):
    return np.uint32(int(b) << 16).view(np.float32)


host = _define(_py_as_bits, _py_f32_from_bf16, lambda fn: fn)


def device_functions():
    """The same conversions as Numba CUDA device functions (or simulator functions)."""
    from numba import cuda, int32
    from numba.cuda import config

    if config.ENABLE_CUDASIM:
        return _define(_py_as_bits, _py_f32_from_bf16, cuda.jit(device=True))
    from numba.cuda import libdevice

    @cuda.jit(device=True)
    def as_bits(f):
        return libdevice.float_as_int(f) & 0xFFFFFFFF

    @cuda.jit(device=True)
    def f32_from_bf16(b):
        return libdevice.int_as_float(int32(b) << 16)

    return _define(as_bits, f32_from_bf16, cuda.jit(device=True))
