// minimax_h3_mlp_fp8: the FC1 GEMM with its SwiGLU epilogue.
//   y[m, c] = bf16(bf16(silu(h_gate)) * h_up),  h = bf16((acc * s_a[m]) * s_w[j])
// acc: FP32 sum over K = 5376 of exact e4m3 products a_q[m, k] * w1_q[j, k], j in the prepacked
// row order (groups of 16 rows: 8 gate rows, then the 8 up rows of the same logical columns).
//
// Both operands are K-major, so they feed mma.row.col directly. A persistent grid walks
// 128 x 128 output tiles (in prepacked columns, i.e. 64 logical y columns) in bands of
// GROUP_M m-tiles so that the tiles in flight share their operands in L2. Each tile streams
// K through a STAGES-deep cp.async ring of 128-byte-wide K slices.
#include "fp8_common.cuh"

#define BM 128
#define BN 128
#define BK 128  // bytes of K per stage
#define STAGES 3
#define THREADS 256  // 8 warps: 2 along M x 4 along N, 64 x 32 outputs each
#define GROUP_M 16
#define HIDDEN 5376
#define FFN 14336
#define FC1_OUT 28672

// A stage holds BM rows of A then BN rows of B, 128 bytes each, as 16-byte chunks stored at
// chunk ^ (row % 8): the 8 rows that one ldmatrix phase reads then hit 8 different bank groups.
#define STAGE_BYTES ((BM + BN) * BK)

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ int swizzled(int row, int chunk) { return row * BK + ((chunk ^ (row & 7)) << 4); }

// 16 bytes global -> shared; src_bytes = 0 fills zeros (rows past M).
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

// Loads the K slice [k0, k0 + BK) of the tile's A rows (m0 ...) and B rows (n0 ...) into a stage.
__device__ __forceinline__ void load_stage(u8* stage, const u8* __restrict__ a, const u8* __restrict__ b, int m0,
                                           int n0, int k0, int M) {
  const u32 base = smem_u32(stage);
#pragma unroll
  for (int i = 0; i < (BM * BK / 16) / THREADS; ++i) {
    const int idx = threadIdx.x + i * THREADS, row = idx >> 3, chunk = idx & 7;
    const int m = m0 + row;
    const u8* src = a + (i64)(m < M ? m : 0) * HIDDEN + k0 + chunk * 16;
    cp_async_16(base + swizzled(row, chunk), src, m < M ? 16 : 0);
  }
#pragma unroll
  for (int i = 0; i < (BN * BK / 16) / THREADS; ++i) {
    const int idx = threadIdx.x + i * THREADS, row = idx >> 3, chunk = idx & 7;
    const u8* src = b + (i64)(n0 + row) * HIDDEN + k0 + chunk * 16;
    cp_async_16(base + BM * BK + swizzled(row, chunk), src, 16);
  }
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    h3_mlp_fc1(const u8* __restrict__ a_q, const float* __restrict__ a_scale, const u8* __restrict__ w1_q,
               const float* __restrict__ w1_scale, u16* __restrict__ y, int M) {
  extern __shared__ __align__(128) u8 smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warp_m = warp >> 2, warp_n = warp & 3;  // 2 x 4 warps
  const int g = lane >> 2, t = lane & 3;
  const int m_tiles = (M + BM - 1) / BM, n_tiles = FC1_OUT / BN;
  const int tiles = m_tiles * n_tiles;
  constexpr int KT = HIDDEN / BK;

  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    // Bands of GROUP_M m-tiles; inside a band, m varies fastest.
    const int band = tile / (GROUP_M * n_tiles), first_m = band * GROUP_M;
    const int band_m = min(GROUP_M, m_tiles - first_m);
    const int in_band = tile - band * GROUP_M * n_tiles;
    const int m0 = (first_m + in_band % band_m) * BM, n0 = (in_band / band_m) * BN;

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      load_stage(smem + s * STAGE_BYTES, a_q, w1_q, m0, n0, s * BK, M);
      cp_async_commit();
    }

    for (int kt = 0; kt < KT; ++kt) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();  // stage kt is visible to all; stage kt - 1 is free for the next load
      const int next = kt + STAGES - 1;
      if (next < KT) load_stage(smem + (next % STAGES) * STAGE_BYTES, a_q, w1_q, m0, n0, next * BK, M);
      cp_async_commit();

      const u8* stage = smem + (kt % STAGES) * STAGE_BYTES;
      const u32 a_base = smem_u32(stage), b_base = smem_u32(stage + BM * BK);
#if H3_MMA_FORM == 0 && defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
#pragma unroll 1  // sm_90 emulates each mma with conversions and FADDs: unrolled, it spills
#else
#pragma unroll
#endif
      for (int ks = 0; ks < BK / 32; ++ks) {
        // ldmatrix lane roles: matrix q = lane / 8 takes its row from lane % 8.
        const int q = lane >> 3, rr = lane & 7;
        u32 bf[4][2];
#pragma unroll
        for (int nj = 0; nj < 2; ++nj) {
          const int row = warp_n * 32 + nj * 16 + rr + 8 * (q >> 1);
          const int chunk = ks * 2 + (q & 1);
          ldmatrix_x4(b_base + swizzled(row, chunk), bf[2 * nj][0], bf[2 * nj][1], bf[2 * nj + 1][0],
                      bf[2 * nj + 1][1]);
        }
        // Two m16 fragments of A at a time: on sm_90, where the e4m3 mma is emulated through
        // half precision, all four (plus their converted copies) would not fit in registers.
#pragma unroll
        for (int mh = 0; mh < 2; ++mh) {
          u32 af[2][4];
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int row = warp_m * 64 + (2 * mh + i) * 16 + rr + 8 * (q & 1);
            const int chunk = ks * 2 + (q >> 1);
            ldmatrix_x4(a_base + swizzled(row, chunk), af[i][0], af[i][1], af[i][2], af[i][3]);
          }
#pragma unroll
          for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) mma_e4m3_16832(acc[2 * mh + i][ni], af[i], bf[ni]);
        }
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // the ring is reused by the next tile

    // Epilogue: n8 fragments (0, 1) and (2, 3) are the gate and up rows of 8 logical columns.
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + warp_m * 64 + mi * 16 + g + 8 * half;
        if (row >= M) continue;
        const float sa = a_scale[row];
#pragma unroll
        for (int pair = 0; pair < 2; ++pair) {
          const int pg = n0 + warp_n * 32 + pair * 16 + 2 * t;  // prepacked gate column (even)
          const float* gate = acc[mi][2 * pair] + 2 * half;
          const float* up = acc[mi][2 * pair + 1] + 2 * half;
          u32 packed = 0;
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float hg = round_bf16((gate[e] * sa) * w1_scale[pg + e]);
            const float hu = round_bf16((up[e] * sa) * w1_scale[pg + 8 + e]);
            packed |= (u32)bf16_from_f32(round_bf16(silu(hg)) * hu) << (16 * e);
          }
          const int col = (pg / 16) * 8 + (pg % 8);  // logical y column of pg
          *reinterpret_cast<u32*>(y + (i64)row * FFN + col) = packed;
        }
      }
    }
  }
}
