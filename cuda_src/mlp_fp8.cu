// minimax_h3_mlp_fp8: the FC1 GEMM with its SwiGLU epilogue.
//   y[m, c] = bf16(bf16(silu(h_gate)) * h_up),  h = bf16((acc * s_a[m]) * s_w[j])
// acc: FP32 sum over K = 5376 of exact e4m3 products a_q[m, k] * w1_q[j, k], j in the prepacked
// row order (groups of 16 rows: 8 gate rows, then the 8 up rows of the same logical columns).
//
// Both operands are K-major, so they feed mma.row.col directly. A persistent grid walks
// 128 x 128 output tiles (in prepacked columns, i.e. 64 logical y columns) in bands of
// GROUP_M m-tiles so that the tiles in flight share their operands in L2. Each tile streams
// K through a STAGES-deep cp.async ring of 128-byte-wide K slices.
#include "mlp_fp8_common.cuh"

// The tile, thread and size constants come from h3kernels/_launch/mlp_fp8.py (NVRTC -D), which
// explains each: BM, BN, BK, STAGES, THREADS, GROUP_M, PRODUCERS, CHUNK_COLS, GROUP_ROWS, HIDDEN,
// FFN, FC1_OUT, and the per-arch unroll depths KS_STEP_FC1 and KS_STEP_FC2.
#if !defined(BM) || !defined(BN) || !defined(BK) || !defined(STAGES) || !defined(THREADS) || !defined(GROUP_M) || \
    !defined(PRODUCERS) || !defined(CHUNK_COLS) || !defined(GROUP_ROWS) || !defined(HIDDEN) || !defined(FFN) || \
    !defined(FC1_OUT) || !defined(KS_STEP_FC1) || !defined(KS_STEP_FC2) || !defined(H3_MMA_FORM)
#error "mlp_fp8.cu is built with the -D constants of h3kernels/_launch/mlp_fp8.py"
#endif
#define CHUNK_SLICES (CHUNK_COLS / BK)

// A stage holds BM rows of A then BN rows of B, 128 bytes each, as 16-byte chunks stored at
// chunk ^ (row % 8): the 8 rows that one ldmatrix phase reads then hit 8 different bank groups.
#define STAGE_BYTES ((BM + BN) * BK)

__device__ __forceinline__ int swizzled(int row, int chunk) { return row * BK + ((chunk ^ (row & 7)) << 4); }

// Loads the K slice [k0, k0 + BK) of the tile's A rows (m0 ...) and B rows (n0 ...) into a stage.
// K is the row pitch of both operands; consumer threads 0 .. THREADS-1 share the copies.
template <int K>
__device__ __forceinline__ void load_stage(u8* stage, const u8* __restrict__ a, const u8* __restrict__ b, int m0,
                                           int n0, int k0, int M) {
  const u32 base = smem_u32(stage);
#pragma unroll
  for (int i = 0; i < (BM * BK / 16) / THREADS; ++i) {
    const int idx = threadIdx.x + i * THREADS, row = idx >> 3, chunk = idx & 7;
    const int m = m0 + row;
    const u8* src = a + (i64)(m < M ? m : 0) * K + k0 + chunk * 16;
    cp_async_16(base + swizzled(row, chunk), src, m < M ? 16 : 0);
  }
#pragma unroll
  for (int i = 0; i < (BN * BK / 16) / THREADS; ++i) {
    const int idx = threadIdx.x + i * THREADS, row = idx >> 3, chunk = idx & 7;
    const u8* src = b + (i64)(n0 + row) * K + k0 + chunk * 16;
    cp_async_16(base + BM * BK + swizzled(row, chunk), src, 16);
  }
}

// FC2 runs producer warps beside the GEMM warps, so its GEMM warps meet at a named barrier
// that the producers never join; FC1 has only GEMM warps.
template <bool kProducers>
__device__ __forceinline__ void gemm_sync() {
  if (kProducers)
    asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory");
  else
    __syncthreads();
}

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The loads of a persistent CTA: consecutive K slices of its tiles, tile after tile, into the
// STAGES-deep ring. It runs ahead across tile boundaries, so the next tile's first slices are
// in flight while the current tile finishes and its epilogue runs. With flags (FC2), the slices
// of y chunk c of an m-tile are read only once all the m-tile's producer groups have written it.
template <int K, bool kProducers>
struct Loader {
  u8* smem;
  const u8* __restrict__ a;
  const u8* __restrict__ b;
  const int* flags;
  int M, m_tiles, n_tiles, tile, kt, slot, m0, n0;

  __device__ __forceinline__ void start(int first_tile) {  // keeps `slot`: the ring runs on
    tile = first_tile;
    kt = 0;
    if (tile < m_tiles * n_tiles) tile_origin(tile, m_tiles, n_tiles, BN, m0, n0);
  }
  __device__ __forceinline__ void load_next() {
    if (tile < m_tiles * n_tiles) {
      if (kProducers && kt % CHUNK_SLICES == 0) {
        const int need = min(BM, M - m0 + GROUP_ROWS - 1) / GROUP_ROWS;  // producer groups of the m-tile
        const int* ready = flags + 1 + (m0 / BM) * (FFN / CHUNK_COLS) + kt / CHUNK_SLICES;
        while (load_acquire(ready) < need) __nanosleep(128);
      }
      load_stage<K>(smem + slot * STAGE_BYTES, a, b, m0, n0, kt * BK, M);
      if (++kt == K / BK) start(tile + gridDim.x);
    }
    cp_async_commit();  // an empty group past the last tile keeps the wait counts uniform
    slot = slot + 1 == STAGES ? 0 : slot + 1;
  }
};

// One K slice from a ring stage: acc += A_stage . B_stage^T, KS_STEP k32 steps unrolled at a
// time (KS_STEP_FC1, KS_STEP_FC2: per arch, from h3kernels/_launch/mlp_fp8.py).
template <int KS_STEP>
__device__ __forceinline__ void mma_stage(float (&acc)[4][4][4], const u8* stage) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warp_m = warp >> 2, warp_n = warp & 3;  // 2 x 4 warps
  const u32 a_base = smem_u32(stage), b_base = smem_u32(stage + BM * BK);
#pragma unroll 1
  for (int k0 = 0; k0 < BK / 32; k0 += KS_STEP)
#pragma unroll
  for (int kk = 0; kk < KS_STEP; ++kk) {
    const int ks = k0 + kk;
    // ldmatrix lane roles: matrix q = lane / 8 takes its row from lane % 8.
    const int q = lane >> 3, rr = lane & 7;
    u32 bf[4][2];
#pragma unroll
    for (int nj = 0; nj < 2; ++nj) {
      const int row = warp_n * 32 + nj * 16 + rr + 8 * (q >> 1);
      const int chunk = ks * 2 + (q & 1);
      ldmatrix_x4(b_base + swizzled(row, chunk), bf[2 * nj][0], bf[2 * nj][1], bf[2 * nj + 1][0], bf[2 * nj + 1][1]);
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

// Every tile of this CTA (tile = blockIdx.x, += gridDim.x): acc = A[m0 ..) . B[n0 ..)^T over K
// bytes of e4m3, then, for each output row this thread holds (row < M), epilogue(acc[mi], half,
// row, col): the row's values are acc[mi][ni][2 * half + e] at columns col + 8 * ni + e (the
// m16n8 C layout). The epilogue must not touch shared memory.
template <int K, bool kProducers, int KS_STEP, class Epilogue>
__device__ __forceinline__ void persistent_gemm(u8* smem, const u8* __restrict__ a, const u8* __restrict__ b,
                                                const int* flags, int M, int n_tiles, Epilogue epilogue) {
  const int m_tiles = (M + BM - 1) / BM;
  Loader<K, kProducers> ld{smem, a, b, flags, M, m_tiles, n_tiles};
  ld.slot = 0;
  ld.start(blockIdx.x);
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) ld.load_next();
  int slot = 0;
  for (int tile = blockIdx.x; tile < m_tiles * n_tiles; tile += gridDim.x) {
    int m0, n0;
    tile_origin(tile, m_tiles, n_tiles, BN, m0, n0);
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;
#pragma unroll 1
    for (int kt = 0; kt < K / BK; ++kt) {
      cp_async_wait<STAGES - 2>();
      gemm_sync<kProducers>();  // this slot's slice is visible to all; the previous slot is free
      ld.load_next();
      mma_stage<KS_STEP>(acc, smem + slot * STAGE_BYTES);
      slot = slot + 1 == STAGES ? 0 : slot + 1;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int col = n0 + (warp & 3) * 32 + 2 * (lane & 3);
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + (warp >> 2) * 64 + mi * 16 + (lane >> 2) + 8 * half;
        if (row < M) epilogue(acc[mi], half, row, col);
      }
  }
  cp_async_wait<0>();
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    h3_mlp_fc1(const u8* __restrict__ a_q, const float* __restrict__ a_scale, const u8* __restrict__ w1_q,
               const float* __restrict__ w1_scale, u16* __restrict__ y, int M) {
  extern __shared__ __align__(128) u8 smem[];
  // n8 fragments (0, 1) and (2, 3) of a row are the gate and up values of 8 logical columns.
  persistent_gemm<HIDDEN, false, KS_STEP_FC1>(
      smem, a_q, w1_q, nullptr, M, FC1_OUT / BN, [&](const float (&acc)[4][4], int half, int row, int col) {
        const float sa = a_scale[row];
#pragma unroll
        for (int pair = 0; pair < 2; ++pair) {
          const int pg = col + pair * 16;  // prepacked gate column (even)
          const float* gate = acc[2 * pair] + 2 * half;
          const float* up = acc[2 * pair + 1] + 2 * half;
          u32 packed = 0;
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float hg = round_bf16((gate[e] * sa) * w1_scale[pg + e]);
            const float hu = round_bf16((up[e] * sa) * w1_scale[pg + 8 + e]);
            packed |= (u32)bf16_from_f32(round_bf16(silu(hg)) * hu) << (16 * e);
          }
          *reinterpret_cast<u32*>(y + (i64)row * FFN + fc1_logical_column(pg)) = packed;
        }
      });
}

// --- FC2: y quantization (producer warps) + GEMM + gate and residual epilogue ----------------
//   y_scale[m] = RN(amax_c |y[m, c]| / 448);  y_q = e4m3(RN(y / y_scale)), 0 where y_scale = 0
//   o = bf16((acc * y_scale[m]) * w2_scale[j]);  out = bf16(residual + bf16(gate[i] * o))
// flags (zeroed before the launch): flags[0] hands out groups of GROUP_ROWS rows to the
// producers in row order; flags[1 + tile * CHUNKS + c] counts the groups of 128-row tile `tile`
// whose y_q columns of chunk c are written. Only running producers claim groups and they never
// wait on the GEMM warps, so the GEMM warps' waits always end, whatever CTAs are resident.
#define CHUNKS (FFN / CHUNK_COLS)

__device__ __forceinline__ void producers_sync() { asm volatile("bar.sync 2, %0;\n" ::"n"(PRODUCERS) : "memory"); }

__device__ void produce_y_q(const u16* __restrict__ y, u8* __restrict__ y_q, float* __restrict__ y_scale,
                            int* flags, int M) {
  __shared__ int claimed;
  __shared__ float scales[GROUP_ROWS];
  const int p = threadIdx.x - THREADS, lane = p & 31, pw = p >> 5;
  const int groups = (M + GROUP_ROWS - 1) / GROUP_ROWS;
  constexpr int ROWS = GROUP_ROWS / (PRODUCERS / 32);  // rows per producer warp
  for (;;) {
    if (p == 0) claimed = atomicAdd(flags, 1);
    producers_sync();
    const int group = claimed;
    producers_sync();  // both warps have read `claimed` before it is overwritten
    if (group >= groups) return;
    const int row0 = group * GROUP_ROWS + pw * ROWS, tile = group * GROUP_ROWS / BM;

    float* scale = scales + pw * ROWS;
#pragma unroll 1
    for (int r = 0; r < ROWS; ++r) {
      const int row = row0 + r;
      u32 m = 0;
      if (row < M) {
        const uint4* src = reinterpret_cast<const uint4*>(y + (i64)row * FFN) + lane;
#pragma unroll 8
        for (int i = 0; i < FFN / 256; ++i) {  // 32 lanes x 8 bf16 per step
          const uint4 v = __ldg(src + i * 32);
          m = abs_max2(abs_max2(m, v.x), v.y);
          m = abs_max2(abs_max2(m, v.z), v.w);
        }
      }
      m = max(m & 0xFFFFu, m >> 16);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
      const float s = __fdiv_rn(f32_from_bf16((u16)m), 448.f);
      if (lane == 0) {
        scale[r] = s;
        if (row < M) y_scale[row] = s;
      }
    }

    __syncwarp();
#pragma unroll 1
    for (int c = 0; c < CHUNKS; ++c) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const int row = row0 + r;
        if (row >= M) break;
        const float sr = scale[r];
        const uint4* src = reinterpret_cast<const uint4*>(y + (i64)row * FFN + c * CHUNK_COLS) + lane;
        uint2* dst = reinterpret_cast<uint2*>(y_q + (i64)row * FFN + c * CHUNK_COLS) + lane;
#pragma unroll
        for (int i = 0; i < CHUNK_COLS / 256; ++i) {
          const uint4 v = __ldg(src + i * 32);
          dst[i * 32] = make_uint2(e4m3x4_from_bf16x4(v.x, v.y, sr), e4m3x4_from_bf16x4(v.z, v.w, sr));
        }
      }
      __threadfence();
      producers_sync();
      if (p == 0) {
        __threadfence();
        atomicAdd(flags + 1 + tile * CHUNKS + c, 1);
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(THREADS + PRODUCERS, 1)
    h3_mlp_fc2(const u16* __restrict__ y, u8* y_q, float* y_scale, const u8* __restrict__ w2_q,
               const float* __restrict__ w2_scale, const u16* __restrict__ gate, i64 gate_stride, i64 gate_rows,
               const i64* __restrict__ adaln_index, const u16* residual, u16* out, int* flags, int M) {
  extern __shared__ __align__(128) u8 smem[];
  if (threadIdx.x >= THREADS) {
    produce_y_q(y, y_q, y_scale, flags, M);
    return;
  }
  persistent_gemm<FFN, true, KS_STEP_FC2>(
      smem, y_q, w2_q, flags, M, HIDDEN / BN, [&](const float (&acc)[4][4], int half, int row, int col0) {
        const float sy = __ldcg(y_scale + row);  // written by a producer during this launch
        const i64 idx = adaln_index[row];
        const bool guarded = idx < 0 || idx >= gate_rows;
        const u16* gate_row = gate + (guarded ? 0 : idx) * gate_stride;
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          const int col = col0 + ni * 8;
          const i64 at = (i64)row * HIDDEN + col;
          const u32 res = *reinterpret_cast<const u32*>(residual + at);  // read before out (may alias) is written
          u32 packed = res;
          if (!guarded) {
            packed = 0;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float o = round_bf16((acc[ni][2 * half + e] * sy) * w2_scale[col + e]);
              const float go = round_bf16(f32_from_bf16(gate_row[col + e]) * o);
              packed |= (u32)bf16_from_f32(f32_from_bf16((u16)(res >> (16 * e))) + go) << (16 * e);
            }
          }
          *reinterpret_cast<u32*>(out + at) = packed;
        }
      });
}
