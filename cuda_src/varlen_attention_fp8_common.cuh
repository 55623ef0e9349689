// What the two kernels of minimax_h3_varlen_attention_fp8 share: the mma.sync kernel
// (varlen_attention_fp8.cu) and the Hopper wgmma kernel (varlen_attention_fp8_sm90a.cu) hold
// S and O in the same per-warp fragment layout (lane (g, t) holds, per n8 tile of columns,
// columns 2t and 2t + 1 of rows g and g + 8), so the P packing and the epilogue are the same.
#pragma once
#include "fp8_common.cuh"

// 128-byte rows (Q, K): 16-byte chunk c of row r at c ^ (r % 8), so the 8 rows one ldmatrix
// phase reads fall in 8 different bank groups. It is also TMA's 128-byte swizzle of a tile
// whose base is 1024-byte aligned, which the wgmma kernel's tiles are.
__device__ __forceinline__ u32 swz128(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }

#ifdef H3_MMA_FORM
// One k32 step of a 64-key block's S on mma.sync m16n8k32 (the kernels' S, bit for bit, is this
// step for ks = 0 .. 3 into zeroed tiles): qa, this warp's Q A fragment of the step; k_rows, the
// block's 64 swizzled K rows, read by ldmatrix as the "col" B operand; s[nt], the m16n8 C tile of
// keys 8 nt .. 8 nt + 7.
template <int KEYS>
__device__ __forceinline__ void s_step_mma_sync(float (&s)[KEYS / 8][4], const u32 (&qa)[4], u32 k_rows, int ks,
                                                int lane) {
  const int lq = lane >> 3, lr = lane & 7;  // ldmatrix: lane gives row lr of matrix lq
#pragma unroll
  for (int np = 0; np < KEYS / 16; ++np) {
    u32 b[2][2];
    ldmatrix_x4(k_rows + swz128(np * 16 + lr + 8 * (lq >> 1), 2 * ks + (lq & 1)), b[0][0], b[0][1], b[1][0], b[1][1]);
    mma_e4m3_16832(s[2 * np], qa, b[0]);
    mma_e4m3_16832(s[2 * np + 1], qa, b[1]);
  }
}
#endif

__device__ __forceinline__ float ex2(float x) {  // 2^x; -inf -> +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Four probabilities -> four e4m3 bytes of BIAS * p (the 2^8 bias; 1 where the exponent already
// holds it), first in the low byte.
template <int BIAS = 256>
__device__ __forceinline__ u32 pack_p(float a, float b, float c, float d) {
  constexpr float f = BIAS;
  return (u32)e4m3x2_from_f32(f * a, f * b) | ((u32)e4m3x2_from_f32(f * c, f * d) << 16);
}

// The log-sum-exp of the true scores softmax_scale * q . k of a written row, for lse [heads,
// tokens]. The loop's scores are those of K - mu (mu: the segment's key mean, the quantization
// passes' [segments, heads, 128] array), in log2 units: sum_k 2^S = 2^m * l (l sums the unbiased
// 2^(S - m); P's 2^8 bias never enters l), so their lse is (m + log2 l) * ln 2, and the shift
// adds back softmax_scale * q . mu, with `dot` = q . mu from the bf16 q (see write_rows).
__device__ __forceinline__ float row_lse(float m, float l, float dot, float softmax_scale) {
  return fmaf(softmax_scale, dot, (m + log2f(l)) * 0.6931471805599453f);
}

// A row's sum from the shares of its 4 lanes (lanes 4g .. 4g + 3 hold rows g and g + 8), in each.
__device__ __forceinline__ void row_sums(float& l0, float& l1) {
#pragma unroll
  for (int x = 1; x < 4; x <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, x);
    l1 += __shfl_xor_sync(0xffffffffu, l1, x);
  }
}

// A row's maximum from the maxima of its 4 lanes, in each (fmaxf is exact: any order gives it).
__device__ __forceinline__ void row_maxima(float& m0, float& m1) {
#pragma unroll
  for (int x = 1; x < 4; x <<= 1) {
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, x));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, x));
  }
}

// The epilogue's arithmetic for a lane's two query rows row0 and row1 = row0 + 8: o(ct, r) is its
// O accumulator of n8 channel tile ct, register r (r < 2: row0, channel 8 ct + 2t + r; r >= 2:
// row1, channel 8 ct + 2t + r - 2); m and l are the rows' running max and whole sum (row_sums),
// lse_l the sum the lse takes (l but for a kernel whose O divides by the sum of its rounded P).
// put(half, ct, word) takes the lane's two bf16 of channel tile ct of row0 (half 0) or row1
// (half 1) as one word, in channel-tile order; with lse non-null the lse of the rows below end
// is written, each element of q it reads (q . mu) read before that element's word is put (out
// may alias q): with Q_FIRST all of them before the first word, in a loop of their own (the
// shorter code where the words go to shared memory), else each tile's just before its words
// (fewer live registers where they go to out directly). pitch: elements between consecutive
// tokens of q; q_first: a row of the segment, read in place of rows past it. sv and mu: the rows'
// segment and head's HDIM values of s_v and of the key mean (sv may be in shared memory).
// READ_ONLY: mu through the read-only cache by name (__ldg), for a kernel whose pointers come
// from a parameter struct, where the compiler does not infer it as it does from const
// __restrict__ parameters.
template <int HDIM, bool Q_FIRST, bool READ_ONLY, class Acc, class Put>
__device__ __forceinline__ void epilogue_rows(Acc o, int row0, int end, int t, float m0, float m1, float l0,
                                              float l1, float lse_l0, float lse_l1, const float* __restrict__ sv,
                                              const float* __restrict__ mu, const u16* q, float* __restrict__ lse,
                                              int h, i64 pitch, int tokens, int q_first, float softmax_scale,
                                              Put put) {
  const int row1 = row0 + 8;
  // q . mu for the lse: the lane takes the channels it writes (2t, 2t + 1 of every 8), in channel
  // order with fma; then the row's four lanes add pairwise (t ^ 1, then t ^ 2)
  const float* mus = mu + 2 * t;
  const u16* qr0 = q + (i64)(row0 < end ? row0 : q_first) * pitch + h * HDIM + 2 * t;
  const u16* qr1 = q + (i64)(row1 < end ? row1 : q_first) * pitch + h * HDIM + 2 * t;
  float d0 = 0.f, d1 = 0.f;
  auto load = [](const float* a) { return READ_ONLY ? __ldg(a) : *a; };
  auto dot = [&](int ct) {
    const float ma = load(mus + ct * 8), mb = load(mus + ct * 8 + 1);
    const u32 qa = *reinterpret_cast<const u32*>(qr0 + ct * 8), qb = *reinterpret_cast<const u32*>(qr1 + ct * 8);
    d0 = fmaf(__uint_as_float(qa & 0xffff0000u), mb, fmaf(__uint_as_float(qa << 16), ma, d0));
    d1 = fmaf(__uint_as_float(qb & 0xffff0000u), mb, fmaf(__uint_as_float(qb << 16), ma, d1));
  };
  auto write_lse = [&]() {
    row_sums(d0, d1);
    if (t == 0) {
      if (row0 < end) lse[(i64)h * tokens + row0] = row_lse(m0, lse_l0, d0, softmax_scale);
      if (row1 < end) lse[(i64)h * tokens + row1] = row_lse(m1, lse_l1, d1, softmax_scale);
    }
  };
  if (Q_FIRST && lse != nullptr) {
#pragma unroll
    for (int ct = 0; ct < HDIM / 8; ++ct) dot(ct);
    write_lse();
  }
  // out = bf16(O * s_v / (256 * l)), the contract's single rounding to bf16; l >= 1 on every
  // written row. The FP32 quotient goes through one reciprocal per row (it may differ from the
  // division by an FP32 ulp): 64 IEEE divisions per lane cost each work tile about a microsecond.
  const float r0 = __frcp_rn(256.f * l0), r1 = __frcp_rn(256.f * l1);
  const float* svs = sv + 2 * t;
#pragma unroll
  for (int ct = 0; ct < HDIM / 8; ++ct) {
    if (!Q_FIRST && lse != nullptr) dot(ct);
    const float v0 = svs[ct * 8], v1 = svs[ct * 8 + 1];
    put(0, ct, (u32)bf16_from_f32(o(ct, 0) * v0 * r0) | ((u32)bf16_from_f32(o(ct, 1) * v1 * r0) << 16));
    put(1, ct, (u32)bf16_from_f32(o(ct, 2) * v0 * r1) | ((u32)bf16_from_f32(o(ct, 3) * v1 * r1) << 16));
  }
  if (!Q_FIRST && lse != nullptr) write_lse();
}

// The epilogue of a lane's two query rows straight from the fragment (epilogue_rows): rows >= end
// are not written; out's pitch is q's.
template <int HDIM, class Acc>
__device__ __forceinline__ void write_rows(Acc o, int row0, int end, int t, float m0, float m1, float l0, float l1,
                                           float lse_l0, float lse_l1,
                                           const float* __restrict__ s_v, const float* __restrict__ mu, const u16* q,
                                           u16* out, float* __restrict__ lse, int seg, int h, int heads, i64 pitch,
                                           int tokens, int q_first, float softmax_scale) {
  const int row1 = row0 + 8;
  u16* out0 = out + (i64)row0 * pitch + h * HDIM + 2 * t;
  u16* out1 = out + (i64)row1 * pitch + h * HDIM + 2 * t;
  const i64 at = ((i64)seg * heads + h) * HDIM;  // the segment and head's s_v and mean
  epilogue_rows<HDIM, false, false>(o, row0, end, t, m0, m1, l0, l1, lse_l0, lse_l1, s_v + at, mu + at, q, lse, h,
                                    pitch, tokens, q_first, softmax_scale, [&](int half, int ct, u32 word) {
                        if ((half ? row1 : row0) < end) *reinterpret_cast<u32*>((half ? out1 : out0) + ct * 8) = word;
                      });
}
