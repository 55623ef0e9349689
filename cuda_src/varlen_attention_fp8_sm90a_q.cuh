// The Q tile's quantization in varlen_attention_fp8_sm90a.cu: each consumer warp turns its 16
// bf16 query rows, staged by TMA, into the e4m3 rows its S wgmmas read, with the Q pass's
// arithmetic (docs/spec.md, Attention): s_q = RN(amax / 448) over a row's 128 channels,
// q8 = e4m3(RN(q / s_q)), zero codes for a zero scale. So q8 and s_q are the bits the Q pass
// (h3kernels/_launch/numba/varlen_attention_fp8_quant.py, q_kernel) writes for the mma.sync
// kernel, and the Q pass's read and write of Q are not needed on this path.
#pragma once
#include "varlen_attention_fp8_sm90a_layout.cuh"

// RN(a / s) for a bf16 a of a row whose own amax gave s = RN(amax / 448) >= kMinFastScale, and
// inv = RN(1 / s): q = RN(a inv) is within an ulp, and one correction by the exact remainder
// rounds it (the Q pass's make_quotient, checked there for every bf16 a and amax). An exact
// product keeps its own sign: the correction would turn a = -0 into +0. The bound is the Q
// pass's own, fp8_bits.MIN_FAST_SCALE (a test holds the two equal).
constexpr float kMinFastScale = 1e-30f;

__device__ __forceinline__ float quotient(float a, float s, float inv) {
  const float q = __fmul_rn(a, inv);
  const float r = __fmaf_rn(-q, s, a);
  return r == 0.f ? q : __fmaf_rn(r, inv, q);
}

// 16 bytes of shared memory at `addr`
__device__ __forceinline__ uint4 lds128(u32 addr) {
  uint4 w;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w) : "r"(addr));
  return w;
}

// Eight bf16 values (a 16-byte chunk) -> eight e4m3 codes (two words, first value lowest) by
// quotient(); the divisions' form of the same codes is fp8_common.cuh's e4m3x4_from_bf16x4.
__device__ __forceinline__ uint2 e4m3x8(const uint4& w, float s, float inv) {
  const u32 in[4] = {w.x, w.y, w.z, w.w};
  u32 out[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float lo = __uint_as_float(in[i] << 16), hi = __uint_as_float(in[i] & 0xFFFF0000u);
    out[i / 2] |= (u32)e4m3x2_from_f32(quotient(lo, s, inv), quotient(hi, s, inv)) << (16 * (i % 2));
  }
  return make_uint2(out[0], out[1]);
}

// Warp `warp` of a consumer: rows 16 warp .. 16 warp + 15 of the warpgroup's 64, read from
// `staged` (the warpgroup's bf16 rows, 256 bytes each, unswizzled) and written to `q8` (its e4m3
// rows, the 128-byte swizzle; the rows' place in the 1024-byte swizzle pattern is row % 8). Lane
// l takes half l % 2 of row l / 2: 8 chunks, in an order rotated by the row, so that the 32
// lanes' 16-byte reads fall evenly on the bank groups. Returns s_q of the lane's row.
__device__ __forceinline__ float quantize_q_rows(u32 staged, u32 q8, int warp, int lane) {
  const int r = lane >> 1, half = lane & 1;
  const int row = 16 * warp + r;
  uint4 w[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int chunk = 8 * half + ((j + r) & 7);
    w[j] = lds128(staged + row * 2 * HD + chunk * 16);
  }
  // The amax on the bf16 bits (abs_max2): a NaN reaches the scale (RN(NaN / 448): codes 0, S
  // NaN, as the Q pass's NaN-keeping max gives)
  u32 m = 0u;
#pragma unroll
  for (int j = 0; j < 8; ++j) m = abs_max2(abs_max2(abs_max2(abs_max2(m, w[j].x), w[j].y), w[j].z), w[j].w);
  m = __vmaxu2(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
  const float amax = __uint_as_float(max(m & 0xFFFFu, m >> 16) << 16);
  const float s = __fdiv_rn(amax, 448.f);
  // chunk j: 8 codes, half (chunk % 2) of 16-byte chunk chunk / 2 of the row's e4m3 bytes
  const auto at = [&](int j) {
    const int chunk = 8 * half + ((j + r) & 7);
    return q8 + row * HD + ((((chunk >> 1) ^ (row & 7))) << 4) + (chunk & 1) * 8;
  };
  // a warp-uniform branch: a divergent one here cost the stage loop its uniform descriptors
  if (__all_sync(0xFFFFFFFFu, s >= kMinFastScale && s < __int_as_float(0x7f800000))) {
    const float inv = __fdiv_rn(1.f, s);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint2 codes = e4m3x8(w[j], s, inv);
      asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(at(j)), "r"(codes.x), "r"(codes.y) : "memory");
    }
  } else {  // rare (a row of the warp below kMinFastScale, or with an Inf): divisions, rolled
#pragma unroll 1
    for (int j = 0; j < 8; ++j) {
      const uint4 v = lds128(staged + row * 2 * HD + (8 * half + ((j + r) & 7)) * 16);
      // zero codes for a zero or NaN scale
      asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(at(j)), "r"(e4m3x4_from_bf16x4(v.x, v.y, s)),
                   "r"(e4m3x4_from_bf16x4(v.z, v.w, s))
                   : "memory");
    }
  }
  return s;
}
