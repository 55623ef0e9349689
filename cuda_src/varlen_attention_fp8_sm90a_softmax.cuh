// The softmax of varlen_attention_fp8_sm90a.cu on a consumer thread's fragment of S: the mask of
// keys past the segment's end, the row maxima, the exponentials and P packed as wgmma A operands.
//
// Fragment of a 64-key half (s[32], the wgmma accumulator layout): register i at row g + 8 ((i / 2)
// % 2), key 8 (i / 4) + 2t + i % 2 (lane = 4g + t). s[4 nt + r] is the mma.sync C register r of
// n8 tile nt, so P packs as in the mma.sync kernel.
//
// FOLD (the stage loop): S stays unscaled until the exponent: the maximum of the scaled scores is
// cb times the unscaled one (cb >= 0, and rounding is monotonic), and each score's scaling joins
// its subtraction of the max in one FFMA: one instruction and one rounding less per score. Its
// margin is in block_exp. A one-block tile (P on the reference's grid) keeps the unfolded order.
// SUM_L: l summed in FP32 from the unrounded P (the one-block tile, and the lse's sum in the
// exact-l build); else l is the tensor core's sum of the rounded P (P . 1, issue_pv).
#pragma once
#include "varlen_attention_fp8_sm90a_layout.cuh"

// Keys from `valid` on (this lane's fragment) to -inf; only a segment's last stage has any.
__device__ __forceinline__ void mask_keys(float (&v)[32], int valid, int t) {
  if (valid < kBlockKeys) {  // CTA-uniform
#pragma unroll
    for (int i = 0; i < 32; ++i)
      if (8 * (i >> 2) + 2 * t + (i & 1) >= valid) v[i] = neg_inf();
  }
}

// This lane's maxima of its two rows' masked scores (with FOLD unscaled) in the half.
template <bool FOLD>
__device__ __forceinline__ void lane_max(float (&s)[32], float& mx0, float& mx1, float cb0, float cb1, int valid,
                                         int t) {
  if (!FOLD) {
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] *= (i & 2) ? cb1 : cb0;
  }
  mask_keys(s, valid, t);
  // A tree of fmaxf, 4 dependent steps, not 16 (fmaxf is exact: any order gives the same maxima)
  float r0[8], r1[8];
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    r0[q] = fmaxf(s[4 * q], s[4 * q + 1]);
    r1[q] = fmaxf(s[4 * q + 2], s[4 * q + 3]);
  }
#pragma unroll
  for (int w = 4; w >= 1; w >>= 1)
#pragma unroll
    for (int q = 0; q < w; ++q) {
      r0[q] = fmaxf(r0[q], r0[q + w]);
      r1[q] = fmaxf(r1[q], r1[q + w]);
    }
  mx0 = r0[0];
  mx1 = r1[0];
}

// The rows' maxima across their 4 lanes, the running max m updated and alpha = 2^(m_old - m).
template <bool FOLD>
__device__ __forceinline__ void row_max(float mx0, float mx1, float& m0, float& m1, float& a0, float& a1, float cb0,
                                        float cb1) {
  row_maxima(mx0, mx1);
  // With FOLD, a half with every key masked gives -inf * cb, or NaN where cb = 0: fmaxf keeps m
  mx0 = fmaxf(m0, FOLD ? mx0 * cb0 : mx0);
  mx1 = fmaxf(m1, FOLD ? mx1 * cb1 : mx1);
  // The first stage always has key 0, so mx is finite from here on and alpha = 2^-inf = 0 at first.
  a0 = ex2(m0 - mx0);
  a1 = ex2(m1 - mx1);
  m0 = mx0;
  m1 = mx1;
}

// P = e4m3(2^(S - (m - 8))) of the half against the max m (after row_max), packed as the A
// fragments of its two k32 steps; with SUM_L, l = l * alpha + the sum of the unrounded P.
template <bool FOLD, bool SUM_L>
__device__ __forceinline__ void block_exp(float (&s)[32], u32 (&pa)[kBlockKeys / 32][4], float m0, float m1,
                                          float& l0, float& l1, float a0, float a1, float cb0, float cb1, int valid,
                                          int t) {
  if (SUM_L) {
    l0 *= a0;
    l1 *= a1;
  }
  // P's 2^8 bias in the exponent, 256 * 2^(S - m) = 2^(S - (m - 8)) (m - 8 is exact), one FADD
  // per score where the bias costs an FMUL more; l then sums 256 times the unbiased values
  // (the epilogue takes l / 256).
  constexpr float bias = 8.f;
  // FOLD's margin: the FFMA leaves the maximum's own argument the rounding error of its
  // unrounded product, up to half an ulp of m, which for huge scores (queries scaled by 1e30) is
  // 2^(+-huge). So e lies a margin below m - bias, |m| 2^-22 (at least twice m's ulp, beyond both
  // roundings): the maximum's argument is then at least bias, and where |m| is huge, 2^(huge) =
  // inf, which P's conversion saturates to 448, and l (P . 1 of the rounded P) agrees with it:
  // without the margin such rows were NaN. Below |m| = 2^12 the margin is under 2^-10.
  const float e0 = FOLD ? fmaf(fabsf(m0), -0x1p-22f, m0 - bias) : m0 - bias;
  const float e1 = FOLD ? fmaf(fabsf(m1), -0x1p-22f, m1 - bias) : m1 - bias;
  if (FOLD) {
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = (i & 2) ? fmaf(s[i], cb1, -e1) : fmaf(s[i], cb0, -e0);
    mask_keys(s, valid, t);  // again: cb may be 0
  }
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    s[i] = ex2(FOLD ? s[i] : s[i] - ((i & 2) ? e1 : e0));
    if (!SUM_L)
      continue;
    const float p = FOLD ? fminf(s[i], 0x1p64f) : s[i];  // the margin's inf (huge scores) kept finite
    if (i & 2)
      l1 += p;
    else
      l0 += p;
  }
#pragma unroll
  for (int kk = 0; kk < kBlockKeys / 32; ++kk) {
    const float* p = s + 16 * kk;  // n8 tiles 4kk .. 4kk + 3: keys 32kk .. 32kk + 31
    pa[kk][0] = pack_p<1>(p[0], p[1], p[4], p[5]);
    pa[kk][1] = pack_p<1>(p[2], p[3], p[6], p[7]);
    pa[kk][2] = pack_p<1>(p[8], p[9], p[12], p[13]);
    pa[kk][3] = pack_p<1>(p[10], p[11], p[14], p[15]);
  }
}
