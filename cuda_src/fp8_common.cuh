// Shared device code of the h3kernels CUDA sources: integer types without <cstdint>
// (NVRTC has no standard headers), the FP8 mma in its two forms, and the roundings the
// contract names (bf16 RNE, e4m3 RNE satfinite).
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

// H3_MMA_FORM (a -D from the launch layer; the forms per arch are in h3kernels/_runtime/targets.py) picks the instruction:
//   0  legacy mma.sync.m16n8k32.e4m3 (sm_89, sm_90, sm_120a)
//   2  mma.sync kind::mxf8f6f4 block_scale with unit UE8M0 scales (sm_120a)
// Both compute the same FP32 sums of exact e4m3 products. (kind::f8f6f4 without scales
// compiles to the same SASS as form 0 on sm_120a, so it is not offered.) A source without an
// mma (fp8_convert.cu) needs no form; the sources with one #error without it.
#ifdef H3_MMA_FORM
// D += A * B for one m16n8k32 tile. Fragments as in docs/spec.md (the m16n8k32 e4m3 layout).
__device__ __forceinline__ void mma_e4m3_16832(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
#if H3_MMA_FORM == 0
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif H3_MMA_FORM == 2
  const u32 unit_scale = 0x7F7F7F7Fu;  // UE8M0 0x7F is 2^0 in every byte
  const u16 zero = 0;
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.e4m3.e4m3.f32.ue8m0 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3}, %10, {%12,%12}, %11, {%12,%12};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(unit_scale),
        "r"(unit_scale), "h"(zero));
#else
#error "H3_MMA_FORM must be 0 or 2"
#endif
}
#endif  // H3_MMA_FORM

// Two FP32 values -> two e4m3 bytes (lo in bits 0..7), RNE with saturation to +-448
// (docs/spec.md's e4m3()). tests/test_fp8_convert.py checks it next to every midpoint.
__device__ __forceinline__ u16 e4m3x2_from_f32(float lo, float hi) {
  u16 r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ float f32_from_bf16(u16 b) { return __uint_as_float(((u32)b) << 16); }

// Two bf16 magnitudes (a u32 word) onto max bits m, per u16 lane. Non-negative bf16 bits order as
// their values, and a NaN's bits exceed every number's, so a NaN in a row reaches its scale.
__device__ __forceinline__ u32 abs_max2(u32 m, u32 w) { return __vmaxu2(m, w & 0x7FFF7FFFu); }

// Four bf16 values (two words, first value lowest) -> four e4m3 codes e4m3(RN(v / s)), by
// divisions: the MLP's y quantization and the attention Q tile's rare rows.
__device__ __forceinline__ u32 e4m3x4_from_bf16x4(u32 lo, u32 hi, float s) {
  if (!(s > 0.f)) return 0u;  // a zero row (and, as in the reference, a NaN row) quantizes to 0
  const float v0 = __fdiv_rn(f32_from_bf16((u16)lo), s), v1 = __fdiv_rn(f32_from_bf16((u16)(lo >> 16)), s);
  const float v2 = __fdiv_rn(f32_from_bf16((u16)hi), s), v3 = __fdiv_rn(f32_from_bf16((u16)(hi >> 16)), s);
  return (u32)e4m3x2_from_f32(v0, v1) | ((u32)e4m3x2_from_f32(v2, v3) << 16);
}

__device__ __forceinline__ u16 bf16_from_f32(float f) {
  u16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}

__device__ __forceinline__ float round_bf16(float f) { return f32_from_bf16(bf16_from_f32(f)); }

// lo in the low half, hi in the high half, each rounded to nearest even
__device__ __forceinline__ u32 bf16x2_from_f32(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// round_bf16 of both values, in one conversion
__device__ __forceinline__ void round_bf16x2(float (&v)[2]) {
  const u32 r = bf16x2_from_f32(v[0], v[1]);
  v[0] = __uint_as_float(r << 16);
  v[1] = __uint_as_float(r & 0xFFFF0000u);
}

// Shared-memory addresses and the asynchronous-copy and ldmatrix instructions both kernels use.
__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared through L2 only (never a stale L1 line); src_bytes = 0 fills zeros.
__device__ __forceinline__ void cp_async_16(u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

