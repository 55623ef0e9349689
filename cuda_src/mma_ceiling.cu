// The e4m3 mma.sync ceiling of this GPU (the yardstick of both operators' benchmarks),
// and one m16n8k32 tile, so that tests can check the fragment layout and that every
// H3_MMA_FORM gives the same sums.
#include "fp8_common.cuh"

#ifndef H3_MMA_FORM
#error "mma_ceiling.cu is built with -DH3_MMA_FORM (0 or 2)"
#endif

// Each warp keeps CHAINS independent accumulators so the tensor pipe never waits on a
// dependency. Every chain has its own B operand: on sm_90 the e4m3 form is emulated as
// HMMA(A, B, 0) followed by FADDs into C, so chains sharing A and B would share one product
// (ptxas does that), which overstated the rate almost threefold.
#define CHAINS 8

extern "C" __global__ void h3_mma_ceiling(float* __restrict__ sink, int iters, u32 seed) {
  u32 a[4], b[CHAINS][2];
  for (int i = 0; i < 4; ++i) a[i] = (seed * (threadIdx.x + 7 * i + 1)) & 0x3F3F3F3Fu;
#pragma unroll
  for (int c = 0; c < CHAINS; ++c)
#pragma unroll
    for (int i = 0; i < 2; ++i) b[c][i] = (seed * (threadIdx.x + 5 * i + 13 * c + 3)) & 0x3F3F3F3Fu;
  float acc[CHAINS][4];
#pragma unroll
  for (int c = 0; c < CHAINS; ++c)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[c][i] = 0.f;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) mma_e4m3_16832(acc[c], a, b[c]);
    a[0] ^= (u32)it & 0x01010101u;
  }
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < CHAINS; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  if (s == 1234.5f) sink[blockIdx.x * blockDim.x + threadIdx.x] = s;  // keeps the loop alive
}

// a: 16 x 32 e4m3 row-major, b: 8 x 32 e4m3 (B^T, row n holds k = 0..31), d: 16 x 8 float.
extern "C" __global__ void h3_mma_tile(const u8* __restrict__ a, const u8* __restrict__ b,
                                       float* __restrict__ d) {
  const int l = threadIdx.x, g = l >> 2, t = l & 3;
  u32 fa[4], fb[2];
  for (int r = 0; r < 4; ++r) {
    const int row = g + 8 * (r % 2), col = 4 * t + 16 * (r / 2);
    fa[r] = *reinterpret_cast<const u32*>(a + row * 32 + col);
  }
  for (int r = 0; r < 2; ++r) fb[r] = *reinterpret_cast<const u32*>(b + g * 32 + 4 * t + 16 * r);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  mma_e4m3_16832(acc, fa, fb);
  for (int i = 0; i < 4; ++i) d[(g + 8 * (i / 2)) * 8 + 2 * t + (i % 2)] = acc[i];
}
