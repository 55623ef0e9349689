"""bf16 and e4m3 conversions on raw bits, and the per-runner primitives of the Numba kernels.

The Numba simulator has no FP8 or bf16 types, so the kernels keep bf16 as uint16 and e4m3 as
uint8 bit patterns. The conversions below are written once in plain integer Python; they run
on the host (where the tests compare them exhaustively against torch) and in the simulator.

On the GPU the kernels get the same functions from `primitives()`, lowered to the hardware's
own instructions (cvt.rn.bf16.f32, cvt.rn.satfinite.e4m3x2.f32, div.rn, sqrt.rn), which
compute the same bits for every finite input (tests/test_fp8_convert.py checks the e4m3
instruction next to every midpoint on the GPU at hand); the GPU tests check the kernels bitwise against
h3kernels.reference. NaN payloads may differ between runners (a NaN stays a NaN).
"""
import math
from types import SimpleNamespace

import numpy as np

E4M3_MAX_BITS = 0x43E00000  # 448.0f
E4M3_MIN_NORMAL_BITS = 0x3C800000  # 2**-6
E4M3_REBIAS = 0x3C000000  # (127 - 7) << 23


def f32_bits(f):
    return int(np.float32(f).view(np.uint32))


def f32_from_bf16(b):
    return np.uint32((int(b) & 0xFFFF) << 16).view(np.float32)


def bf16_from_f32(f):
    """FP32 -> bf16 bits, round to nearest even (NaN -> 0x7FC0)."""
    u = f32_bits(f)
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return 0x7FC0
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def e4m3_from_f32(f):
    """FP32 -> e4m3 bits as cvt.rn.satfinite.e4m3 does: nearest even, |v| >= 448 (inf too) -> 448."""
    u = f32_bits(f)
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
    shift = 141 - e  # value / 2**-9 == mant / 2**shift
    q = mant >> shift
    rem = mant & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if rem > half or (rem == half and (q & 1) == 1):
        q += 1
    return sign | q


def e4m3x2_from_f32(lo, hi):
    return e4m3_from_f32(lo) | (e4m3_from_f32(hi) << 8)


def bf16x2_from_f32(lo, hi):
    """Two FP32 values -> a bf16 pair in 32 bits (lo in bits 0..15), each rounded as bf16_from_f32."""
    return np.uint32(bf16_from_f32(lo) | (bf16_from_f32(hi) << 16))


def f32_from_bf16_lo(w):
    """The bf16 in bits 0..15 of a 32-bit word, as FP32."""
    return np.uint32((int(w) << 16) & 0xFFFFFFFF).view(np.float32)


def f32_from_bf16_hi(w):
    """The bf16 in bits 16..31 of a 32-bit word, as FP32."""
    return np.uint32(int(w) & 0xFFFF0000).view(np.float32)


def quad_word(quad, h):
    """Word h (0: bits 0..31, 1: bits 32..63) of a 64-bit bf16 quad, as uint32: a bf16 pair."""
    return np.uint32((int(quad) >> (32 * int(h))) & 0xFFFFFFFF)


def div_rn(a, b):
    return np.float32(np.float32(a) / np.float32(b))


def fma_rn(x, y, z):
    """RN32(x * y + z) with one rounding, as the GPU's fused multiply-add. x * y is exact in float64
    (48 bits); TwoSum keeps the sum exact as t + e; t rounds to float32 as the exact sum does,
    except when t sits exactly halfway between two float32 neighbours, where e decides."""
    p = float(np.float32(x)) * float(np.float32(y))
    z = float(np.float32(z))
    t = p + z
    if not math.isfinite(t):
        return np.float32(t)
    b = t - p
    e = (p - (t - b)) + (z - b)
    r = np.float32(t)
    if e != 0 and math.isfinite(r):
        lo = r if float(r) <= t else np.nextafter(r, np.float32(-np.inf))
        hi = np.nextafter(lo, np.float32(np.inf))
        if t == (float(lo) + float(hi)) / 2:
            r = hi if e > 0 else lo
    if r == 0 and t == 0 and e == 0:
        r = np.float32(p + z)  # the IEEE sign of an exact zero sum
    return np.float32(r)


def sqrt_rn(a):
    return np.float32(math.sqrt(np.float32(a)))  # double rounding of sqrt from f64 is exact


def max_nan(a, b):
    """The larger of two FP32 values, NaN if either is NaN (PTX max.NaN.f32; Python's max and the
    plain max.f32 would drop the NaN, and an amax must not)."""
    a, b = np.float32(a), np.float32(b)
    if a != a:
        return a
    if b != b:
        return b
    return a if a >= b else b


host = SimpleNamespace(max_nan=max_nan, f32_from_bf16=f32_from_bf16, bf16_from_f32=bf16_from_f32,
                       bf16x2_from_f32=bf16x2_from_f32, f32_from_bf16_lo=f32_from_bf16_lo, f32_from_bf16_hi=f32_from_bf16_hi,
                       quad_word=quad_word, e4m3_from_f32=e4m3_from_f32, e4m3x2_from_f32=e4m3x2_from_f32,
                       div_rn=div_rn, sqrt_rn=sqrt_rn, fma_rn=fma_rn)


MIN_FAST_SCALE = 1e-30  # below this scale, kernels divide bf16 values instead of calling quotient()
MIN_FAST_SCALE_FP32 = 2.0 ** -90  # the same for FP32 numerators (K's centred keys)


def device_function(fn):
    """A Numba device function on the GPU; in the CUDA simulator `fn` itself. The simulator runs
    device functions as Python anyway, and its cuda.jit(device=True) wrapper takes a module-wide
    lock on every call, which 128 busy threads turn into a convoy (a K pass ran minutes instead of
    seconds). So simulated kernels call plain functions, and nothing inside one may use `cuda.`."""
    from numba import cuda
    from numba.cuda import config

    return fn if config.ENABLE_CUDASIM else cuda.jit(device=True)(fn)


def make_range(min_scale):
    """in_range(s), a Numba device function: s from min_scale up and finite, where quotient()
    gives the division's codes (make_quotient: MIN_FAST_SCALE for bf16 values,
    MIN_FAST_SCALE_FP32 for FP32 ones)."""
    from numba import float32

    @device_function
    def in_range(s):
        return s >= float32(min_scale) and s < float32(math.inf)

    return in_range


def make_quotient(fma_rn, div_rn):
    """Numba device functions (quotient, quotient_or_div, in_range) for e4m3(RN(a / s)).

    quotient(a, s, inv), given inv = RN(1 / s), has the e4m3 code of RN(a / s) without a
    division: a * inv is within about an ulp, and one correction by the exact remainder (two
    FMAs, Markstein) rounds it. It is checked from a scale on (make_range):
    - bf16 a (MIN_FAST_SCALE, in_range's): code by code for every bf16 a with |a| <= amax and every
      bf16 amax with s = RN(amax / 448) >= MIN_FAST_SCALE (`python tests/test_fp8_bits.py`, all
      1.04e9 pairs; the tests a sample). Below it the remainder can be subnormal.
    - any FP32 a (MIN_FAST_SCALE_FP32): the corrected quotient is within an ulp of
      RN(a / s) always, and RN(a / s) itself for every FP32 s and every a within 6 ulps of s
      times an e4m3 rounding boundary, the only quotients where an ulp can change the code
      (`python tests/test_fp8_bits.py fp32`, all 2^23 mantissas of s; the tests a sample). From
      2^-90 on, every rounding that can reach a nonzero code is of normal numbers, so the check
      at one exponent holds at all.
    An infinite s (an Inf among the values) has inv = 0, which turns a / inf = 0 into NaN: out of
    range too. An exact product keeps its own sign: the correction would turn a = -0 into +0.
    quotient_or_div(a, s, inv) divides outside in_range; kernels whose scale is fixed for a
    whole loop test the range once and call quotient in the loop."""
    from numba import float32

    in_range = make_range(MIN_FAST_SCALE)

    @device_function
    def quotient(a, s, inv):
        q = float32(a * inv)
        r = fma_rn(-q, s, a)
        if r == float32(0.0):
            return q
        return fma_rn(r, inv, q)

    @device_function
    def quotient_or_div(a, s, inv):
        if in_range(s):
            return quotient(a, s, inv)
        return div_rn(a, s)

    return quotient, quotient_or_div, in_range


def primitives():
    """The conversions for Numba kernels: simulator functions, or GPU device functions."""
    from numba.cuda import config

    if config.ENABLE_CUDASIM:
        return host  # plain functions: see device_function
    return _gpu_primitives()


def _gpu_primitives():
    from llvmlite import ir
    from numba import cuda, int32, types, uint32, uint64
    from numba.cuda import libdevice
    from numba.cuda.extending import intrinsic

    @intrinsic
    def _cvt_bf16(typingctx, f):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.IntType(16), [ir.FloatType()]), "cvt.rn.bf16.f32 $0, $1;", "=h,f")
            return builder.call(asm, args)

        return types.uint16(types.float32), codegen

    def paired_cvt(ptx, bits):
        """Two FP32 values -> one `bits`-wide register by `ptx`; PTX puts its first source in the
        high half, so the call passes (hi, lo)."""
        @intrinsic
        def cvt(typingctx, lo, hi):
            def codegen(context, builder, sig, args):
                fnty = ir.FunctionType(ir.IntType(bits), [ir.FloatType(), ir.FloatType()])
                asm = ir.InlineAsm(fnty, ptx + " $0, $1, $2;", ("=h" if bits == 16 else "=r") + ",f,f")
                return builder.call(asm, [args[1], args[0]])

            return getattr(types, f"uint{bits}")(types.float32, types.float32), codegen

        return cvt

    @intrinsic
    def _max_nan(typingctx, a, b):
        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType(), ir.FloatType()])
            return builder.call(ir.InlineAsm(fnty, "max.NaN.f32 $0, $1, $2;", "=f,f,f"), args)

        return types.float32(types.float32, types.float32), codegen

    @cuda.jit(device=True)
    def g_max_nan(a, b):
        return _max_nan(a, b)

    _cvt_bf16x2 = paired_cvt("cvt.rn.bf16x2.f32", 32)
    _cvt_e4m3x2 = paired_cvt("cvt.rn.satfinite.e4m3x2.f32", 16)

    @cuda.jit(device=True)
    def g_f32_from_bf16(b):
        return libdevice.int_as_float(int32(b) << 16)

    @cuda.jit(device=True)
    def g_bf16_from_f32(f):
        return _cvt_bf16(f)

    @cuda.jit(device=True)
    def g_bf16x2_from_f32(lo, hi):
        return _cvt_bf16x2(lo, hi)

    @cuda.jit(device=True)
    def g_f32_from_bf16_lo(w):
        return libdevice.int_as_float(int32(w << 16))

    @cuda.jit(device=True)
    def g_f32_from_bf16_hi(w):
        return libdevice.int_as_float(int32(w & 0xFFFF0000))

    @cuda.jit(device=True)
    def g_quad_word(quad, h):
        return uint32((quad >> uint64(32 * h)) & uint64(0xFFFFFFFF))

    @cuda.jit(device=True)
    def g_e4m3x2_from_f32(lo, hi):
        return _cvt_e4m3x2(lo, hi)

    @cuda.jit(device=True)
    def g_e4m3_from_f32(f):
        return g_e4m3x2_from_f32(f, f) & 0xFF

    @cuda.jit(device=True)
    def g_div_rn(a, b):
        return libdevice.fdiv_rn(a, b)

    @cuda.jit(device=True)
    def g_sqrt_rn(a):
        return libdevice.fsqrt_rn(a)

    @cuda.jit(device=True)
    def g_fma_rn(x, y, z):
        return libdevice.fmaf(x, y, z)

    return SimpleNamespace(max_nan=g_max_nan, f32_from_bf16=g_f32_from_bf16, bf16_from_f32=g_bf16_from_f32,
                           bf16x2_from_f32=g_bf16x2_from_f32, f32_from_bf16_lo=g_f32_from_bf16_lo,
                           f32_from_bf16_hi=g_f32_from_bf16_hi, quad_word=g_quad_word,
                           e4m3_from_f32=g_e4m3_from_f32, e4m3x2_from_f32=g_e4m3x2_from_f32,
                           div_rn=g_div_rn, sqrt_rn=g_sqrt_rn, fma_rn=g_fma_rn)
