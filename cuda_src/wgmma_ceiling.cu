// The e4m3 wgmma ceiling of an sm_90a GPU: back-to-back wgmma.mma_async m64n256k32 with both
// operands in shared memory, the yardstick of the wgmma family (fp8_mma_form 3), as
// mma_ceiling.cu is that of the mma.sync forms.
//
// Each CTA (one per SM) has WARPGROUPS warpgroups; each keeps one m64n256 FP32 accumulator
// (128 registers a thread; WGMMA_N 64 or 128, measurement builds: m64n64 / m64n128 wgmmas on the
// first rows of B, N / 2 registers) and issues K_STEPS wgmmas per commit group, waiting only for the
// group before the last, so a group is always queued behind the one in the tensor pipe. The
// operand tiles (A 64 x 128, B 256 x 128 e4m3, K-major, 128B swizzle, 1024-byte aligned) are
// written once with a fixed pattern of finite values (zeros could let the hardware skip work), or,
// where a_src and b_src are given, CTA c's tiles are the A_BYTES and B_BYTES bytes from
// a_src + c A_BYTES and b_src + c B_BYTES: a GEMM's own operand bits, whose toggling sets the
// tensor cores' power (under a board's power cap, its clock).
#include "hopper_common.cuh"

#if !defined(WGMMA_N) || !defined(WARPGROUPS) || !defined(K_STEPS)
#error "wgmma_ceiling.cu is built with -DWARPGROUPS, -DK_STEPS and -DWGMMA_N (h3kernels/_launch/wgmma_ceiling.py)"
#endif
#if WGMMA_N != 64 && WGMMA_N != 128 && WGMMA_N != 256
#error "WGMMA_N is 64, 128 or 256"
#endif

#define THREADS (128 * WARPGROUPS)
#define A_BYTES (64 * 128)
#define B_BYTES (256 * 128)

// One accumulating m64nNk32 step, N from the accumulator's size (the first N rows of B).
__device__ __forceinline__ void wgmma_e4m3(float (&d)[128], u64 a, u64 b) { wgmma_m64n256k32_e4m3(d, a, b, 1); }
__device__ __forceinline__ void wgmma_e4m3(float (&d)[64], u64 a, u64 b) { wgmma_m64n128k32_e4m3(d, a, b, 1); }
__device__ __forceinline__ void wgmma_e4m3(float (&d)[32], u64 a, u64 b) { wgmma_m64n64k32_e4m3(d, a, b, 1); }

extern "C" __global__ void __launch_bounds__(THREADS, 1) h3_wgmma_ceiling(float* __restrict__ sink, int iters,
                                                                          const u32* __restrict__ a_src,
                                                                          const u32* __restrict__ b_src) {
  __shared__ __align__(1024) u8 raw[A_BYTES + B_BYTES + 1024];
  const u32 base = (smem_u32(raw) + 1023u) & ~1023u;  // the 128B swizzle needs 1024-byte aligned tiles
  u8* tiles = raw + (base - smem_u32(raw));
  // e4m3 bytes with the exponent field at most 7 (magnitudes below 2) and both signs: finite, and
  // the sums stay far from overflow over any number of iterations
  for (int i = threadIdx.x; i < (A_BYTES + B_BYTES) / 4; i += THREADS) {
    const u32 h = (u32)i * 0x9E3779B1u;
    reinterpret_cast<u32*>(tiles)[i] = a_src == nullptr   ? (h ^ (h >> 15)) & 0xBFBFBFBFu
                                       : i < A_BYTES / 4 ? a_src[(size_t)blockIdx.x * (A_BYTES / 4) + i]
                                                         : b_src[(size_t)blockIdx.x * (B_BYTES / 4) + i - A_BYTES / 4];
  }
  fence_proxy_async_shared();
  __syncthreads();
  const u32 a = base, b = base + A_BYTES;
  float acc[WGMMA_N / 2];
#pragma unroll
  for (int i = 0; i < WGMMA_N / 2; ++i) acc[i] = 0.f;
  for (int it = 0; it < iters; ++it) {
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < K_STEPS; ++k)  // k32 steps along the 128-byte rows, then around again
      wgmma_e4m3(acc, wgmma_desc(a + 32 * (k % 4)), wgmma_desc(b + 32 * (k % 4)));
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < WGMMA_N / 2; ++i) s += acc[i];
  if (s == 1234.5f) sink[blockIdx.x * THREADS + threadIdx.x] = s;  // keeps the accumulators live
}
