// minimax_h3_mlp_fp8 on Hopper (sm_90a): the FC1 and FC2 GEMMs on wgmma (e4m3) fed by TMA, and
// the per-token quantization of y between them. Same functions as cuda_src/mlp_fp8.cu:
//   FC1: y[m, c] = bf16(bf16(silu(h_gate)) * h_up),  h = bf16((acc * a_scale[m]) * w1_scale[j])
//   y quantization: y_scale[m] = RN(amax_c |y[m, c]| / 448),  y_q = e4m3(RN(y / y_scale)) (0 where
//     y_scale is not positive), bitwise as mlp_fp8.cu's producer warps
//   FC2: o = bf16((acc * y_scale[m]) * w2_scale[j]),  out = bf16(residual + bf16(gate[i] * o)),
//     out = residual on rows whose adaln_index is out of range
// acc is an FP32 sum of exact e4m3 products, promoted from the tensor core every 128 of K
// (mlp_fp8_sm90a_gemm.cuh, which has the GEMM itself; docs/kernels/mlp_sm90.md).
//
// Each kernel takes one __grid_constant__ struct, mirrored field by field in
// h3kernels/_launch/mlp_fp8_sm90a.py (the GEMMs' maps first, 64-byte aligned).
#include "hopper_common.cuh"

// The build's constants, from h3kernels/_launch/mlp_fp8_sm90a.py (MlpBuild, NVRTC -D), which
// explains each value.
#if !defined(H3_BM) || !defined(H3_BK) || !defined(H3_STAGES) || !defined(H3_GROUP_M) || \
    !defined(H3_PRODUCER_REGS) || !defined(H3_CONSUMER_REGS) || !defined(H3_FC1_EPI_BLOCKS) || \
    !defined(H3_FC2_EPI_BLOCKS) || !defined(H3_QUANT_THREADS) || !defined(H3_HIDDEN) || !defined(H3_FFN) || \
    !defined(H3_FC1_OUT)
#error "mlp_fp8_sm90a.cu is built with the -D constants of h3kernels/_launch/mlp_fp8_sm90a.py"
#endif
static constexpr int BM = H3_BM, BK = H3_BK, STAGES = H3_STAGES, GROUP_M = H3_GROUP_M;
static constexpr int PRODUCER_REGS = H3_PRODUCER_REGS, CONSUMER_REGS = H3_CONSUMER_REGS;
static constexpr int FC1_EPI_BLOCKS = H3_FC1_EPI_BLOCKS, FC2_EPI_BLOCKS = H3_FC2_EPI_BLOCKS;
static constexpr int QUANT_THREADS = H3_QUANT_THREADS;
static constexpr int HIDDEN = H3_HIDDEN, FFN = H3_FFN, FC1_OUT = H3_FC1_OUT;
static_assert(BM == 128 && BK == 128,
              "the warpgroup roles assume 128-row output tiles and K slices of one 128-byte swizzled row");
// The output tile widths the GEMMs are instantiated for (the entries at the end of this file).
static_assert(HIDDEN % BK == 0 && FFN % BK == 0 && FC1_OUT % 256 == 0 && HIDDEN % 256 == 0 && FC1_OUT % 224 == 0 &&
                  HIDDEN % 224 == 0 && FFN % (8 * QUANT_THREADS) == 0,
              "the sizes must be whole numbers of tiles");

#include "mlp_fp8_common.cuh"
#include "mlp_fp8_sm90a_gemm.cuh"

static_assert(FC1_EPI_BLOCKS % 2 == 0, "FC1's epilogue groups hold whole (gate, up) pairs of n8 blocks");

// SiLU with the special-function unit's exp and reciprocal: the contract allows a fast exp;
// CUDA bounds __expf within 2 + 1.2 |g| FP32 ulps and __fdividef within 2 (for these
// denominators), far below y's bf16 rounding (2^16 FP32 ulps). Below g = -87 the denominator
// passes 2^126 and the quotient is 0 where the IEEE form gives a magnitude under 1e-36;
// infinities and NaN come out as in the IEEE form.
// __expf(-g) is 2^(g * -log2(e)) on the unit's ex2; its flush-to-zero form drops the four
// instructions that keep a subnormal 2^x, which 1 + 2^x cannot tell from 0 (the same bits).
__device__ __forceinline__ float silu_fast(float g) {
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(g * -1.44269504f));
  return __fdividef(g, 1.f + e);
}

// Each kernel's one parameter (h3kernels/_launch/mlp_fp8_sm90a.py mirrors the fields): the maps
// first (64-byte aligned), then the rest at natural alignment. Pointers read from a struct whose
// address is taken (the maps') are not restrict kernel parameters: the compiler reads the scales,
// the gate table and adaln_index with plain global loads (LDG), not the read-only path.
struct Fc1Params {
  TmaMap map_a, map_w1;  // a_q [M, HIDDEN], w1_q [FC1_OUT, HIDDEN] (prepacked rows)
  const float* a_scale;
  const float* w1_scale;
  u16* y;
  int M;
  int split_whole, split_parts;  // SplitK
  float* partials;
  int* counters;
};

struct Fc2Params {
  TmaMap map_y_q, map_w2;  // y_q [M, FFN], w2_q [HIDDEN, FFN]
  const float* y_scale;
  const float* w2_scale;
  const u16* gate;  // the AdaLN gate table: gate_rows rows of gate_stride elements
  i64 gate_stride, gate_rows;
  const i64* adaln_index;
  const u16* residual;  // may be out
  u16* out;
  int M;
  int split_whole, split_parts;  // SplitK
  float* partials;
  int* counters;
};

struct QuantParams {
  const u16* y;
  u8* y_q;
  float* y_scale;
};

// The epilogues run in each consumer thread of a BN-column tile: thread t of a consumer
// warpgroup holds rows r0 + 16 (t / 32) + t % 32 / 4 + {0, 8} and, per half h and n8 block j
// (BN / 16 a half), columns BN / 2 h + 8 j + 2 (t % 4) + {0, 1}: acc[h][4 j + 2 rh + e]. An
// epilogue takes its n8 blocks in groups (FC1_EPI_BLOCKS, FC2_EPI_BLOCKS); a 224-column tile's
// 14 blocks a half end in a shorter group. fc1 and fc2 read their struct's fields into locals
// once: the maps' addresses are taken, so the compiler would read a field again after every
// store through a pointer.

// FC1: n8 blocks (j, j + 1), j even, are the gate and up values of 8 logical columns (the
// prepacked row order), so one thread holds both operands of each SwiGLU.
template <int BN>
__device__ __forceinline__ void fc1(const Fc1Params& p) {
  constexpr int HALF_N = BN / 2, HALF_BLOCKS = BN / 16;  // a half's columns and n8 blocks
  const float *a_scale = p.a_scale, *w1_scale = p.w1_scale;
  u16* y = p.y;
  const int M = p.M;
  const SplitK split{p.split_whole, p.split_parts, p.partials, p.counters};
  wgmma_gemm<HIDDEN, BN>(&p.map_a, &p.map_w1, M, FC1_OUT / BN, split, [&](const float (&acc)[2][BN / 4], int r0,
                                                                         int n0) {
    const int t = threadIdx.x & 127;
    const int row0 = r0 + 16 * (t >> 5) + ((t & 31) >> 2), col0 = n0 + 2 * (t & 3);
    // Every global load of a group of columns is issued before any of its arithmetic. Loaded
    // next to its use (the expf and the IEEE division between them kept the compiler from
    // hoisting), each scale waited out its own L2 latency while the tensor cores idled: FC1 took
    // 10% longer at M = 16384 (docs/kernels/mlp_sm90.md, "Decisions").
    float sa[2];
  #pragma unroll
    for (int rh = 0; rh < 2; ++rh) sa[rh] = row0 + 8 * rh < M ? a_scale[row0 + 8 * rh] : 0.f;
  #pragma unroll
    for (int h = 0; h < 2; ++h)
  #pragma unroll
      for (int j0 = 0; j0 < HALF_BLOCKS; j0 += FC1_EPI_BLOCKS) {
        float g_scale[FC1_EPI_BLOCKS / 2][2], u_scale[FC1_EPI_BLOCKS / 2][2];  // of the gate and up columns
  #pragma unroll
        for (int p = 0; p < FC1_EPI_BLOCKS / 2; ++p) {
          if (j0 + 2 * p >= HALF_BLOCKS) break;  // a constant once unrolled
          const int pg = col0 + h * HALF_N + 8 * (j0 + 2 * p);  // prepacked gate column (even, pg % 16 < 8)
  #pragma unroll
          for (int e = 0; e < 2; ++e) {  // scalar loads: the scale vectors may start at any float
            g_scale[p][e] = w1_scale[pg + e];
            u_scale[p][e] = w1_scale[pg + 8 + e];
          }
        }
  #pragma unroll
        for (int rh = 0; rh < 2; ++rh) {
          const int row = row0 + 8 * rh;
          if (row >= M) continue;
          // the group's first logical column; the others follow at 4 per n8 block (two prepacked
          // blocks of 8 are one logical block of 8), so the stores take constant offsets
          u16* y_group = y + (i64)row * FFN + fc1_logical_column(col0 + h * HALF_N + 8 * j0);
  #pragma unroll
          for (int p = 0; p < FC1_EPI_BLOCKS / 2; ++p) {
            const int j = j0 + 2 * p;
            if (j >= HALF_BLOCKS) break;
            // both columns' roundings in one conversion each (the same RN bits as one at a time)
            float hg[2], hu[2], sg[2];
  #pragma unroll
            for (int e = 0; e < 2; ++e) {
              hg[e] = (acc[h][4 * j + 2 * rh + e] * sa[rh]) * g_scale[p][e];
              hu[e] = (acc[h][4 * (j + 1) + 2 * rh + e] * sa[rh]) * u_scale[p][e];
            }
            round_bf16x2(hg);
            round_bf16x2(hu);
  #pragma unroll
            for (int e = 0; e < 2; ++e) sg[e] = silu_fast(hg[e]);
            round_bf16x2(sg);
            const u32 packed = bf16x2_from_f32(sg[0] * hu[0], sg[1] * hu[1]);
            *reinterpret_cast<u32*>(y_group + 8 * p) = packed;
          }
        }
      }
  });
}

// FC2: out may be residual itself.
template <int BN>
__device__ __forceinline__ void fc2(const Fc2Params& p) {
  constexpr int HALF_N = BN / 2, HALF_BLOCKS = BN / 16;
  const float *y_scale = p.y_scale, *w2_scale = p.w2_scale;
  const u16* gate = p.gate;
  const i64 gate_stride = p.gate_stride, gate_rows = p.gate_rows;
  const i64* adaln_index = p.adaln_index;
  const u16* residual = p.residual;
  u16* out = p.out;
  const int M = p.M;
  const SplitK split{p.split_whole, p.split_parts, p.partials, p.counters};
  wgmma_gemm<FFN, BN>(&p.map_y_q, &p.map_w2, M, HIDDEN / BN, split, [&](const float (&acc)[2][BN / 4], int r0,
                                                                      int n0) {
    const int t = threadIdx.x & 127;
    const int row0 = r0 + 16 * (t >> 5) + ((t & 31) >> 2), col0 = n0 + 2 * (t & 3);
    // As in FC1, a group's loads (residual, gate, scales) all come before its arithmetic and
    // stores; each residual element is still read before the store that may overwrite it.
  #pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      const int row = row0 + 8 * rh;
      if (row >= M) continue;
      const float sy = y_scale[row];
      const i64 idx = adaln_index[row];
      const bool guarded = idx < 0 || idx >= gate_rows;
      const u16* gate_row = gate + (guarded ? 0 : idx) * gate_stride;
  #pragma unroll
      for (int h = 0; h < 2; ++h)
  #pragma unroll
        for (int j0 = 0; j0 < HALF_BLOCKS; j0 += FC2_EPI_BLOCKS) {
          u32 res[FC2_EPI_BLOCKS];
          u16 gates[FC2_EPI_BLOCKS][2];  // scalar loads: the scale vectors may start at any float
          float w_scale[FC2_EPI_BLOCKS][2];
  #pragma unroll
          for (int j = 0; j < FC2_EPI_BLOCKS; ++j) {
            if (j0 + j >= HALF_BLOCKS) break;  // a constant once unrolled
            const int col = col0 + h * HALF_N + 8 * (j0 + j);
            res[j] = *reinterpret_cast<const u32*>(residual + (i64)row * HIDDEN + col);
  #pragma unroll
            for (int e = 0; e < 2; ++e) {
              gates[j][e] = gate_row[col + e];
              w_scale[j][e] = w2_scale[col + e];
            }
          }
  #pragma unroll
          for (int j = 0; j < FC2_EPI_BLOCKS; ++j) {
            if (j0 + j >= HALF_BLOCKS) break;
            const int col = col0 + h * HALF_N + 8 * (j0 + j);
            // computed on guarded rows too and then not taken (a select, not a branch: inside a
            // branch ptxas moved the gate and scale loads back next to their use)
            // both columns' roundings in one conversion each (the same RN bits as one at a time)
            float o[2], go[2];
  #pragma unroll
            for (int e = 0; e < 2; ++e) o[e] = (acc[h][4 * (j0 + j) + 2 * rh + e] * sy) * w_scale[j][e];
            round_bf16x2(o);
  #pragma unroll
            for (int e = 0; e < 2; ++e) go[e] = f32_from_bf16(gates[j][e]) * o[e];
            round_bf16x2(go);
            u32 packed = bf16x2_from_f32(f32_from_bf16((u16)res[j]) + go[0],
                                         f32_from_bf16((u16)(res[j] >> 16)) + go[1]);
            packed = guarded ? res[j] : packed;
            *reinterpret_cast<u32*>(out + (i64)row * HIDDEN + col) = packed;
          }
        }
    }
  });
}

// The entries: each GEMM at the tile widths the launch layer's plan picks from (mlp_fp8_sm90a.py,
// WIDTHS): 256, and 224 where 256-column tiles would leave much of the last wave idle.
extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1) h3_mlp_fc1_wgmma_n256(const __grid_constant__ Fc1Params p) {
  fc1<256>(p);
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1) h3_mlp_fc1_wgmma_n224(const __grid_constant__ Fc1Params p) {
  fc1<224>(p);
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1) h3_mlp_fc2_wgmma_n256(const __grid_constant__ Fc2Params p) {
  fc2<256>(p);
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1) h3_mlp_fc2_wgmma_n224(const __grid_constant__ Fc2Params p) {
  fc2<224>(p);
}

// --- y quantization: one CTA per row, the row held in registers between its amax and its
// quantization. The arithmetic is mlp_fp8.cu's produce_y_q's (mlp_fp8_common.cuh: max of the
// bf16 magnitudes' bits, one IEEE division by 448, one per element), so y_q and y_scale are
// bitwise the same.

static constexpr int QUANT_VECS = FFN / 8 / QUANT_THREADS;  // 16-byte vectors of y per thread

extern "C" __global__ void __launch_bounds__(QUANT_THREADS) h3_mlp_y_quant(const __grid_constant__ QuantParams p) {
  const u16* y = p.y;
  u8* y_q = p.y_q;
  float* y_scale = p.y_scale;
  __shared__ u32 warp_max[QUANT_THREADS / 32];
  const i64 row = blockIdx.x;
  const uint4* src = reinterpret_cast<const uint4*>(y + row * FFN) + threadIdx.x;
  uint4 v[QUANT_VECS];
  u32 m = 0;
#pragma unroll
  for (int i = 0; i < QUANT_VECS; ++i) v[i] = __ldg(src + i * QUANT_THREADS);
#pragma unroll
  for (int i = 0; i < QUANT_VECS; ++i) {
    m = abs_max2(abs_max2(m, v[i].x), v[i].y);
    m = abs_max2(abs_max2(m, v[i].z), v[i].w);
  }
  m = max(m & 0xFFFFu, m >> 16);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  m = warp_max[0];
#pragma unroll
  for (int w = 1; w < QUANT_THREADS / 32; ++w) m = max(m, warp_max[w]);
  const float s = __fdiv_rn(f32_from_bf16((u16)m), 448.f);
  if (threadIdx.x == 0) y_scale[row] = s;
  uint2* dst = reinterpret_cast<uint2*>(y_q + row * FFN) + threadIdx.x;
#pragma unroll
  for (int i = 0; i < QUANT_VECS; ++i)
    dst[i * QUANT_THREADS] = make_uint2(e4m3x4_from_bf16x4(v[i].x, v[i].y, s), e4m3x4_from_bf16x4(v[i].z, v[i].w, s));
}
