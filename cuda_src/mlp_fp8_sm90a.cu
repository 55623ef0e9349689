// minimax_h3_mlp_fp8 on Hopper (sm_90a): the FC1 and FC2 GEMMs on wgmma (e4m3) fed by TMA, and
// the per-token quantization of y between them. Same functions as cuda_src/mlp_fp8.cu:
//   FC1: y[m, c] = bf16(bf16(silu(h_gate)) * h_up),  h = bf16((acc * a_scale[m]) * w1_scale[j])
//   y quantization: y_scale[m] = RN(amax_c |y[m, c]| / 448),  y_q = e4m3(RN(y / y_scale)) (0 where
//     y_scale is not positive), bitwise as mlp_fp8.cu's producer warps
//   FC2: o = bf16((acc * y_scale[m]) * w2_scale[j]),  out = bf16(residual + bf16(gate[i] * o)),
//     out = residual on rows whose adaln_index is out of range
// acc is an FP32 sum of exact e4m3 products, formed as below.
//
// The GEMM CTA: three warpgroups. Warpgroup 0 gives its registers up and one of its threads
// issues the TMA loads of a STAGES-deep ring of K slices (BM rows of A and BN rows of B, 128
// bytes of K each, 128B-swizzled); warpgroups 1 and 2 take the registers and each computes
// 64 rows x BN columns of the BM x BN output tile with wgmma. full[s] completes when a slice
// has landed (TMA transaction count), empty[s] when all 8 consumer warps are done reading it.
// A persistent grid walks the tiles in bands of GROUP_M m-tiles (m fastest inside a band) so
// that the tiles in flight share their A and B slices in L2; the loads run ahead across tile
// boundaries, so the next tile's first slices arrive while the epilogue of this one runs.
//
// Accumulation: the e4m3 wgmma keeps fewer bits than FP32 when it accumulates in the tensor
// core over a long K. Each 128-wide K slice is therefore summed in the tensor core into a
// zeroed partial (4 k32 steps), and the partial is added to FP32 registers ("promotion"), so
// no more than 128 products ever meet inside the tensor core. A consumer's 64 x 256 output is
// done per slice as four 64 x 64 quarters with two 32-register partials in turn (PROMOTE_N64 1:
// one quarter's additions overlap the next quarter's wgmmas), or as two 64 x 128 halves with
// one 64-register partial, each waited for (PROMOTE_N64 0). Both give the same bits; either way
// 64 registers of partials sit beside the 128 FP32 sums.
//
// Variants of the PROMOTE_N64 loop, timed by bench/hopper_mlp.py (the launch layer builds neither):
//   A_REGS 1, 2  each warp loads its 16 rows of the slice's A into registers once (ldmatrix from the
//                swizzled tile, in the wgmma register-A fragment) and the four quarters' wgmmas
//                read only B from shared memory: a quarter's m64n64k32 steps otherwise re-read the
//                same A block, so shared-memory reads per slice drop from 64 KiB to 40 KiB per
//                warpgroup. A registers may not change while a wgmma reading them is in flight:
//                A_REGS 1 (16 registers) waits for the slice's last quarter before loading the
//                next slice; A_REGS 2 (32 registers) alternates two sets between slices, so the
//                loop runs as the default's. The same sums, bitwise. A_REGS 1 with PROMOTE_K 256
//                holds both slices of a partial (32 registers).
//   PROMOTE_K    K summed in the tensor core per partial: 256 sums two slices (8 k32 steps) per
//                partial, half the FP32 additions, another error (another summation, other bits).
//
// Measurement builds (bench/hopper_mlp.py, bench/hopper_debug.py; never the launch layer's):
//   DBG_RAW_ACC     FC1 stores its FP32 sums themselves, [M, FC1_OUT] floats at y
//   DBG_PROMOTE_K32 (A_REGS 0) each k32 step into a zeroed partial, then FP32: its error measured
//   DBG_NO_PROMOTE  (with PROMOTE_N64 0) the whole K summed inside the tensor core: the speed
//                   and the error without promotion
//   DBG_NO_TMA, DBG_NO_MMA, DBG_NO_REGS  leave out the loads, the wgmmas, or setmaxnreg
//   DBG_NO_EPILOGUE  the epilogues skipped (but for an improbable value): what they cost in a tile
//   DBG_CLUSTER_LOCAL  (with CLUSTER_M 2) each CTA loads all of B itself, no multicast: the pairs'
//                   coupled barriers without the multicast
#include "hopper_common.cuh"
#include "mlp_fp8_common.cuh"

// From h3kernels/_launch/mlp_fp8_sm90a.py (NVRTC -D), which explains each value.
#if !defined(BM) || !defined(BN) || !defined(BK) || !defined(STAGES) || !defined(GROUP_M) || \
    !defined(PRODUCER_REGS) || !defined(CONSUMER_REGS) || !defined(QUANT_THREADS) || !defined(HIDDEN) || \
    !defined(FFN) || !defined(FC1_OUT) || !defined(CLUSTER_M) || !defined(PROMOTE_N64) || \
    !defined(PROMOTE_K) || !defined(A_REGS) || !defined(FAST_SILU)
#error "mlp_fp8_sm90a.cu is built with the -D constants of h3kernels/_launch/mlp_fp8_sm90a.py"
#endif
#if BM != 128 || BN != 256 || (BK != 128 && BK != 64)
#error "the warpgroup roles below assume 128 x 256 output tiles and K slices of 128 or 64 bytes"
#endif
#if BK == 64 && A_REGS
#error "A_REGS reads 128-byte rows"
#endif
// a K-major operand tile in shared memory: rows of BK bytes, swizzled over the whole row
__device__ __forceinline__ u64 operand_desc(u32 addr) { return wgmma_desc<BK>(addr); }
#if HIDDEN % BK != 0 || FFN % BK != 0 || FC1_OUT % BN != 0 || HIDDEN % BN != 0 || FFN % (8 * QUANT_THREADS) != 0
#error "the sizes must be whole numbers of tiles"
#endif

// K slices summed into one partial before its FP32 addition (PROMOTE_N64 only; 1 elsewhere)
#define SLICES_PER_PARTIAL (PROMOTE_K / BK)
#if PROMOTE_K % BK != 0 || STAGES % SLICES_PER_PARTIAL != 0 || HIDDEN % PROMOTE_K != 0 || FFN % PROMOTE_K != 0
#error "PROMOTE_K is a multiple of BK that divides STAGES * BK and both K"
#endif
#if (PROMOTE_K != BK || A_REGS) && !PROMOTE_N64
#error "PROMOTE_K other than BK and A_REGS are variants of the PROMOTE_N64 loop"
#endif
#if A_REGS == 2 && PROMOTE_K != BK
#error "A_REGS 2 holds two slices of A in registers: PROMOTE_K must be BK"
#endif
#if A_REGS == 2 && (HIDDEN / BK % 2 != 0 || FFN / BK % 2 != 0)
#error "A_REGS 2 alternates two sets of A registers: an even number of slices"
#endif
#define A_SETS (A_REGS == 2 ? 2 : 1)
#if PROMOTE_N64
#define KB_STEP SLICES_PER_PARTIAL
#else
#define KB_STEP 1
#endif

// The work split of a persistent GEMM (the launch layer's work_split() picks it; see wgmma_gemm).
struct SplitK {
  int whole;        // tiles taken whole: a multiple of the grid's CTA groups, or all tiles
  int parts;        // K ranges of each later tile (1: no tile is split)
  float* partials;  // per split tile, CTA of its group, warpgroup and part: 128 x 128 FP32 sums
  int* counters;    // per split tile, CTA of its group and warpgroup: parts done (0 before a launch,
                    // and the last part sets it back to 0)
};
struct WorkUnit {
  int tile, part;         // part -1: the whole tile
  int kb_begin, kb_end;   // its K slices
};

// Part boundaries fall on the K loop's step (a partial's slices, both A register sets).
// Boundaries fall on multiples of 256 bytes of K as well, in every build, so that builds of the
// same sums split a tile into the same K ranges and keep giving the same bits.
#define UNIT_SLICES (KB_STEP * A_SETS)
#define PART_SLICES (256 / BK > UNIT_SLICES ? 256 / BK : UNIT_SLICES)
#if PART_SLICES % UNIT_SLICES != 0 || HIDDEN % (PART_SLICES * BK) != 0 || FFN % (PART_SLICES * BK) != 0
#error "split parts are whole steps of the K loop and divide both K"
#endif
__device__ __forceinline__ WorkUnit work_unit(int u, const SplitK& split, int slices) {
  if (u < split.whole) return {u, -1, 0, slices};
  const int v = u - split.whole, part = v % split.parts, steps = slices / PART_SLICES;
  return {split.whole + v / split.parts, part, PART_SLICES * (part * steps / split.parts),
          PART_SLICES * ((part + 1) * steps / split.parts)};
}

// One part of a split tile is done in acc (this consumer warpgroup's 64 rows): store its sums
// in its slot and count it; the tile's last part to arrive then reads every part's sums back in
// part order, so acc is the same FP32 sum whichever part came last. Returns whether this was the
// last part (which then runs the epilogue). slot: the split tile's index times CLUSTER_M plus
// the CTA's rank in its group. The stores, fence, count and fence are the usual last-block
// pattern; the loads bypass L1 (.cg), which is not coherent with other SMs' stores.
__device__ __forceinline__ bool combine_parts(float (&acc)[2][64], const SplitK& split, int part, int slot,
                                              int consumer) {
  __shared__ int arrived[2];
  const int t = threadIdx.x & 127, counter = 2 * slot + consumer;
  float* sums = split.partials + (i64)counter * split.parts * (128 * 128) + t;  // [part][i][thread]
#pragma unroll
  for (int i = 0; i < 128; ++i) __stcg(sums + (i64)part * (128 * 128) + 128 * i, acc[i >> 6][i & 63]);
  __threadfence();
  warpgroup_sync(1 + consumer);
  if (t == 0) arrived[consumer] = atomicAdd(split.counters + counter, 1);
  warpgroup_sync(1 + consumer);
  if (arrived[consumer] != split.parts - 1) return false;
  __threadfence();
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i >> 6][i & 63] = __ldcg(sums + 128 * i);
#pragma unroll 1
  for (int p = 1; p < split.parts; ++p)
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i >> 6][i & 63] += __ldcg(sums + (i64)p * (128 * 128) + 128 * i);
  if (t == 0) split.counters[counter] = 0;
  return true;
}

#if CLUSTER_M != 1 && CLUSTER_M != 2
#error "CLUSTER_M is 1 or 2"
#endif
#if CLUSTER_M == 2
#define GEMM_CLUSTER __cluster_dims__(2, 1, 1)
#else
#define GEMM_CLUSTER
#endif
#define GEMM_THREADS 384  // 3 warpgroups
#define A_BYTES (BM * BK)
#define STAGE_BYTES ((BM + BN) * BK)
#define CONSUMER_WARPS 8
#define HALF_N 128  // columns of one wgmma
#if !defined(FC1_EPI_BLOCKS) || !defined(FC2_EPI_BLOCKS) || FC1_EPI_BLOCKS % 2 != 0 || \
    (HALF_N / 8) % FC1_EPI_BLOCKS != 0 || (HALF_N / 8) % FC2_EPI_BLOCKS != 0
#error "FC1_EPI_BLOCKS (even) and FC2_EPI_BLOCKS divide the 16 n8 blocks of a half tile"
#endif

// Every tile of this CTA: acc = A[m0 ..) . B[n0 ..)^T over K bytes of e4m3 (A rows past M come
// in as zeros from TMA), then epilogue(acc, m0 + 64 * consumer, n0) in each consumer thread,
// acc[h][i] in the wgmma fragment layout of half h (hopper_common.cuh). The epilogue must not
// touch shared memory.
//
// Work units (split): a persistent grid of P CTAs takes units c, c + P, ... The first
// split.whole tiles (a multiple of P, so every CTA takes as many) are one unit each; each later
// tile, the last wave's, is split.parts units over consecutive K ranges, so that the last wave
// keeps all P CTAs busy instead of its r < P. Each part's FP32 sums go to a slot of
// split.partials; the last part of a tile to finish adds the slots in part order (the same bits
// whichever finishes last) and runs the epilogue.
//
// With CLUSTER_M = 2 the CTAs run in pairs (a cluster) on vertically adjacent tiles with the
// same B columns: each loads its own A and half of the B slice, multicast to both, so a pair
// reads B from L2 once. A stage of either CTA is then written by both producers, so its empty
// barrier counts the consumer warps of both CTAs before either producer refills it.
template <int K, class Epilogue>
__device__ __forceinline__ void wgmma_gemm(const TmaMap* map_a, const TmaMap* map_b, int M, int n_tiles,
                                           const SplitK& split, Epilogue epilogue) {
  extern __shared__ u8 smem_raw[];
  __shared__ __align__(8) u64 full[STAGES], empty[STAGES];
  const u32 base = (smem_u32(smem_raw) + 1023u) & ~1023u;  // the 128B swizzle needs 1024-byte tiles
  const int wg = threadIdx.x >> 7;
  const int m_tiles = (M + BM - 1) / BM;
  // the walk is over groups of CLUSTER_M vertically adjacent tiles; a group's CTAs take one tile each
  const int groups_m = (m_tiles + CLUSTER_M - 1) / CLUSTER_M, tiles = groups_m * n_tiles;
  const int group0 = blockIdx.x / CLUSTER_M, group_step = gridDim.x / CLUSTER_M;
  const int units = split.whole + (tiles - split.whole) * split.parts;
#if CLUSTER_M == 2
  const u32 rank = cluster_rank();
#else
  const u32 rank = 0;
#endif
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], CONSUMER_WARPS * CLUSTER_M);
    }
    mbar_init_fence();
  }
#if CLUSTER_M == 2
  cluster_sync();  // the peer's barriers exist before anything signals them
#else
  __syncthreads();
#endif

  if (wg == 0) {
#ifndef DBG_NO_REGS
    regs_dealloc<PRODUCER_REGS>();
#endif
    if (threadIdx.x == 0) {
      tma_prefetch_map(map_a);
      tma_prefetch_map(map_b);
      int stage = 0;
      u32 phase = 0;
      for (int unit = group0; unit < units; unit += group_step) {
        const WorkUnit w = work_unit(unit, split, K / BK);
        int m0, n0;
        tile_origin(w.tile, groups_m, n_tiles, m0, n0);
        m0 = m0 * CLUSTER_M + rank * BM;
#pragma unroll 1
        for (int kb = w.kb_begin; kb < w.kb_end; ++kb) {
          mbar_wait(&empty[stage], phase ^ 1);
#ifdef DBG_NO_TMA
          mbar_arrive(&full[stage]);
#else
          // a tile wholly past M (the second of a pair, M odd in tiles) loads no A: its rows are
          // never stored, and its CTA still loads its half of B for the peer
          mbar_arrive_expect_tx(&full[stage], m0 < M ? STAGE_BYTES : STAGE_BYTES - A_BYTES);
          const u32 dst = base + stage * STAGE_BYTES;
          if (m0 < M) tma_load_2d(dst, map_a, kb * BK, m0, &full[stage]);
#if CLUSTER_M == 2 && defined(DBG_CLUSTER_LOCAL)
          tma_load_2d(dst + A_BYTES, map_b, kb * BK, n0, &full[stage]);
          tma_load_2d(dst + A_BYTES + (BN / 2) * BK, map_b, kb * BK, n0 + BN / 2, &full[stage]);
#elif CLUSTER_M == 2
          tma_load_2d_multicast(dst + A_BYTES + rank * (BN / 2) * BK, map_b, kb * BK, n0 + rank * (BN / 2),
                                &full[stage], (u16)3);
#else
          tma_load_2d(dst + A_BYTES, map_b, kb * BK, n0, &full[stage]);
#endif
#endif
          if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    }
  } else {
#ifndef DBG_NO_REGS
    regs_alloc<CONSUMER_REGS>();
#endif
    const int consumer = wg - 1, lane = threadIdx.x & 31;
    auto release = [&](int s) {  // this warp is done reading stage s (lane 0 calls it)
#if CLUSTER_M == 2
      mbar_arrive_cluster(&empty[s], 0);
      mbar_arrive_cluster(&empty[s], 1);
#else
      mbar_arrive(&empty[s]);
#endif
    };
    int stage = 0;
    u32 phase = 0;
#if PROMOTE_N64
    // Four 64 x 64 quarters per slice, two partials in turn: a quarter's wgmmas run while the
    // previous quarter's partial is added, so this warpgroup keeps the tensor core fed itself.
    float part[2][32];
#pragma unroll
    for (int i = 0; i < 32; ++i) part[0][i] = part[1][i] = 0.f;
#if A_REGS
    // A_REGS: each warp's 16 rows of A come into registers once per slice (ldmatrix from the
    // swizzled tile) and feed all four quarters, which then read only B from shared memory.
    // Lane l gives row (l % 8) + 8 ((l / 8) % 2) of matrix l / 8, 16-byte chunk 2 k + l / 16 of
    // the swizzled row: as the chunk's low bit is l / 16, its swizzled offset for k32 step k is
    // that of step 0 XOR 32 k.
    u32 a_frag[A_SETS][SLICES_PER_PARTIAL][BK / 32][4];
    const int a_row = 16 * ((threadIdx.x & 127) >> 5) + (lane & 7) + 8 * ((lane >> 3) & 1);
    const u32 a_lane = a_row * BK + ((((lane >> 4) ^ (lane & 7))) << 4);
#endif
#else
    float part[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) part[i] = 0.f;
#endif
    for (int unit = group0; unit < units; unit += group_step) {
      const WorkUnit w = work_unit(unit, split, K / BK);
      const int kb_begin = w.kb_begin, kb_end = w.kb_end;
      int m0, n0;
      tile_origin(w.tile, groups_m, n_tiles, m0, n0);
      m0 = m0 * CLUSTER_M + rank * BM;
      float acc[2][64];
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[h][i] = 0.f;
      int kb0 = kb_begin;  // every unit has at least one step
#pragma unroll 1
      do {
#pragma unroll
        for (int u = 0; u < A_SETS; ++u) {  // A_REGS 2: slices alternate between two sets of A registers
          const int kb = kb0 + u * KB_STEP;
          (void)kb;  // the PROMOTE_N64 0 loop does not need it
          mbar_wait(&full[stage], phase);
          const u32 a = base + stage * STAGE_BYTES + consumer * 64 * BK;
          const u32 b = base + stage * STAGE_BYTES + A_BYTES;
#if PROMOTE_N64
          // a group of SLICES_PER_PARTIAL consecutive stages (same phase: STAGES is a multiple)
#pragma unroll
          for (int p = 1; p < SLICES_PER_PARTIAL; ++p) mbar_wait(&full[stage + p], phase);
#if A_REGS == 1
          if (kb > kb_begin) {  // the previous group's last quarter still reads a_frag: wait for it, free its stages
            wgmma_wait<0>();
#pragma unroll
            for (int p = 0; p < SLICES_PER_PARTIAL; ++p)
#pragma unroll
              for (int k = 0; k < BK / 32; ++k)
#pragma unroll
                for (int j = 0; j < 4; ++j) fence_regs(a_frag[0][p][k][j]);
            if (lane == 0) {
#pragma unroll
              for (int p = SLICES_PER_PARTIAL; p > 0; --p) release(stage >= p ? stage - p : stage + STAGES - p);
            }
          }
#endif
#if A_REGS
          // this warp's 16 rows of the slice, once, in the register-A fragment of each k32 step
          // (A_REGS 2: the set last read by the slice before the previous one, whose wgmmas the
          // previous slice's first wait covered)
#pragma unroll
          for (int p = 0; p < SLICES_PER_PARTIAL; ++p)
#pragma unroll
            for (int k = 0; k < BK / 32; ++k) ldmatrix_x4(a_frag[u][p][k], (a + p * STAGE_BYTES + a_lane) ^ (32 * k));
#endif
#ifdef DBG_PROMOTE_K32
          // Accuracy only: each k32 step into a zeroed partial, waited for and added in FP32, the
          // finest promotion the tensor core allows (A from shared memory)
#pragma unroll
          for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int p = 0; p < SLICES_PER_PARTIAL; ++p)
#pragma unroll
              for (int k = 0; k < BK / 32; ++k) {
                wgmma_fence();
                wgmma_m64n64k32_e4m3(part[0], operand_desc(a + p * STAGE_BYTES + 32 * k),
                                     operand_desc(b + p * STAGE_BYTES + q * 64 * BK + 32 * k), 0);
                wgmma_commit();
                wgmma_wait<0>();
#pragma unroll
                for (int i = 0; i < 32; ++i) {
                  fence_regs(part[0][i]);
                  acc[q >> 1][32 * (q & 1) + i] += part[0][i];
                }
              }
          if (lane == 0) {
#pragma unroll
            for (int p = 0; p < SLICES_PER_PARTIAL; ++p) release(stage + p);
          }
#else
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            wgmma_fence();
#pragma unroll
            for (int p = 0; p < SLICES_PER_PARTIAL; ++p)
#pragma unroll
              for (int k = 0; k < BK / 32; ++k) {
                const u64 desc_b = operand_desc(b + p * STAGE_BYTES + q * 64 * BK + 32 * k);
#if A_REGS
                wgmma_m64n64k32_e4m3_rs(part[q & 1], a_frag[u][p][k], desc_b, p + k);
#else
                wgmma_m64n64k32_e4m3(part[q & 1], operand_desc(a + p * STAGE_BYTES + 32 * k), desc_b, p + k);
#endif
              }
            wgmma_commit();
            wgmma_wait<1>();  // the previous quarter (of this group or the last) is done
            const int pq = (q + 3) & 3;  // its quarter
            if (q > 0 || kb > kb_begin) {
#pragma unroll
              for (int i = 0; i < 32; ++i) {
                fence_regs(part[pq & 1][i]);
                acc[pq >> 1][32 * (pq & 1) + i] += part[pq & 1][i];
              }
            }
#if A_REGS != 1
            if (q == 0 && kb > kb_begin && lane == 0) {  // the previous group's last quarter is done: free its stages
#pragma unroll
              for (int p = SLICES_PER_PARTIAL; p > 0; --p) release(stage >= p ? stage - p : stage + STAGES - p);
            }
#endif
          }
          if (kb == kb_end - SLICES_PER_PARTIAL) {  // the unit's last quarter
            wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < 32; ++i) {
              fence_regs(part[1][i]);
              acc[1][32 + i] += part[1][i];
            }
            if (lane == 0) {
#pragma unroll
              for (int p = 0; p < SLICES_PER_PARTIAL; ++p) release(stage + p);
            }
          }
#endif
          stage += SLICES_PER_PARTIAL;
          if (stage == STAGES) {
            stage = 0;
            phase ^= 1;
          }
          continue;
#elif defined(DBG_NO_PROMOTE)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < BK / 32; ++k)
              wgmma_m64n128k32_e4m3(acc[h], operand_desc(a + 32 * k), operand_desc(b + h * HALF_N * BK + 32 * k), 1);
          }
          wgmma_commit();
          wgmma_wait<1>();  // the previous slice is done: free its stage
          if (kb > kb_begin && lane == 0) release(stage == 0 ? STAGES - 1 : stage - 1);
          if (kb == kb_end - 1) {
            wgmma_wait<0>();
          } else {
            if (++stage == STAGES) {
              stage = 0;
              phase ^= 1;
            }
            continue;
          }
#else
#pragma unroll
          for (int h = 0; h < 2; ++h) {
#ifndef DBG_NO_MMA
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < BK / 32; ++k)
              wgmma_m64n128k32_e4m3(part, operand_desc(a + 32 * k), operand_desc(b + h * HALF_N * BK + 32 * k), k);
            wgmma_commit();
            wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < 64; ++i) {
              fence_regs(part[i]);  // the additions read part only after the wait
              acc[h][i] += part[i];
            }
#endif
          }
#endif
          if (lane == 0) release(stage);
          if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
          }
        }
      } while ((kb0 += UNIT_SLICES) < kb_end);
      // a split tile's parts but its last end here (combine_parts)
      const bool done = w.part < 0 || combine_parts(acc, split, w.part, (w.tile - split.whole) * CLUSTER_M + rank, consumer);
#ifdef DBG_NO_EPILOGUE
      if (done && acc[0][0] == 1234.5f && acc[1][63] == 1234.5f) epilogue(acc, m0 + 64 * consumer, n0);  // keeps the sums live
#else
      if (done) epilogue(acc, m0 + 64 * consumer, n0);
#endif
    }
  }
#if CLUSTER_M == 2
  cluster_sync();  // the peer may still arrive on this CTA's empty barriers until it is done
#endif
}

// SiLU with the special-function unit's exp and reciprocal (FAST_SILU): the contract allows a fast
// exp; CUDA bounds __expf within 2 + 1.2 |g| FP32 ulps and __fdividef within 2 (for these
// denominators), far below y's bf16 rounding (2^16 FP32 ulps). Below g = -87 the
// denominator passes 2^126 and the quotient is 0 where the IEEE form gives a magnitude under
// 1e-36; infinities and NaN come out as in the IEEE form.
__device__ __forceinline__ float silu_fast(float g) { return __fdividef(g, 1.f + __expf(-g)); }

// Thread t of a consumer warpgroup holds rows r0 + 16 (t / 32) + t % 32 / 4 + {0, 8} and, per
// half h and n8 block j, columns 128 h + 8 j + 2 (t % 4) + {0, 1}: acc[h][4 j + 2 rh + e].
extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1) GEMM_CLUSTER
    h3_mlp_fc1_wgmma(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_w1,
                     const float* __restrict__ a_scale, const float* __restrict__ w1_scale, u16* __restrict__ y,
                     int M, int split_whole, int split_parts, float* partials, int* counters) {
  // n8 blocks (j, j + 1), j even, are the gate and up values of 8 logical columns (the prepacked
  // row order), so one thread holds both operands of each SwiGLU.
  wgmma_gemm<HIDDEN>(&map_a, &map_w1, M, FC1_OUT / BN, SplitK{split_whole, split_parts, partials, counters}, [&](const float (&acc)[2][64], int r0, int n0) {
    const int t = threadIdx.x & 127;
    const int row0 = r0 + 16 * (t >> 5) + ((t & 31) >> 2), col0 = n0 + 2 * (t & 3);
#ifdef DBG_RAW_ACC  // the FP32 sums themselves, [M, FC1_OUT] floats at y, to measure their error
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        const int row = row0 + 8 * ((i >> 1) & 1), col = col0 + h * HALF_N + 8 * (i >> 2) + (i & 1);
        if (row < M) reinterpret_cast<float*>(y)[(i64)row * FC1_OUT + col] = acc[h][i];
      }
    return;
#endif
    // Every global load of a group of columns is issued before any of its arithmetic. Loaded
    // next to its use (the expf and the IEEE division between them kept the compiler from
    // hoisting), each scale waited out its own L2 latency while the tensor cores idled: FC1 took
    // 10% longer at M = 16384 (docs/hopper.md).
    float sa[2];
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) sa[rh] = row0 + 8 * rh < M ? a_scale[row0 + 8 * rh] : 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j0 = 0; j0 < HALF_N / 8; j0 += FC1_EPI_BLOCKS) {
        float g_scale[FC1_EPI_BLOCKS / 2][2], u_scale[FC1_EPI_BLOCKS / 2][2];  // of the gate and up columns
#pragma unroll
        for (int p = 0; p < FC1_EPI_BLOCKS / 2; ++p) {
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
#pragma unroll
          for (int p = 0; p < FC1_EPI_BLOCKS / 2; ++p) {
            const int j = j0 + 2 * p, pg = col0 + h * HALF_N + 8 * j;
            u32 packed = 0;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float hg = round_bf16((acc[h][4 * j + 2 * rh + e] * sa[rh]) * g_scale[p][e]);
              const float hu = round_bf16((acc[h][4 * (j + 1) + 2 * rh + e] * sa[rh]) * u_scale[p][e]);
              packed |= (u32)bf16_from_f32(round_bf16(FAST_SILU ? silu_fast(hg) : silu(hg)) * hu) << (16 * e);
            }
            *reinterpret_cast<u32*>(y + (i64)row * FFN + fc1_logical_column(pg)) = packed;
          }
        }
      }
  });
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1) GEMM_CLUSTER
    h3_mlp_fc2_wgmma(const __grid_constant__ TmaMap map_y_q, const __grid_constant__ TmaMap map_w2,
                     const float* __restrict__ y_scale, const float* __restrict__ w2_scale,
                     const u16* __restrict__ gate, i64 gate_stride, i64 gate_rows, const i64* __restrict__ adaln_index,
                     const u16* residual, u16* out, int M, int split_whole, int split_parts, float* partials,
                     int* counters) {
  wgmma_gemm<FFN>(&map_y_q, &map_w2, M, HIDDEN / BN, SplitK{split_whole, split_parts, partials, counters}, [&](const float (&acc)[2][64], int r0, int n0) {
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
        for (int j0 = 0; j0 < HALF_N / 8; j0 += FC2_EPI_BLOCKS) {
          u32 res[FC2_EPI_BLOCKS];
          u16 gates[FC2_EPI_BLOCKS][2];  // scalar loads, as before: the scale vectors may start at any float
          float w_scale[FC2_EPI_BLOCKS][2];
#pragma unroll
          for (int j = 0; j < FC2_EPI_BLOCKS; ++j) {
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
            const int col = col0 + h * HALF_N + 8 * (j0 + j);
            // computed on guarded rows too and then not taken (a select, not a branch: inside a
            // branch ptxas moved the gate and scale loads back next to their use)
            u32 packed = 0;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float o = round_bf16((acc[h][4 * (j0 + j) + 2 * rh + e] * sy) * w_scale[j][e]);
              const float go = round_bf16(f32_from_bf16(gates[j][e]) * o);
              packed |= (u32)bf16_from_f32(f32_from_bf16((u16)(res[j] >> (16 * e))) + go) << (16 * e);
            }
            packed = guarded ? res[j] : packed;
            *reinterpret_cast<u32*>(out + (i64)row * HIDDEN + col) = packed;
          }
        }
    }
  });
}

// --- y quantization: one CTA per row, the row held in registers between its amax and its
// quantization. The arithmetic is mlp_fp8.cu's produce_y_q's (mlp_fp8_common.cuh: max of the bf16 magnitudes' bits,
// one IEEE division by 448, one per element), so y_q and y_scale are bitwise the same.

#define QUANT_VECS (FFN / 8 / QUANT_THREADS)  // 16-byte vectors of y per thread

extern "C" __global__ void __launch_bounds__(QUANT_THREADS)
    h3_mlp_y_quant(const u16* __restrict__ y, u8* __restrict__ y_q, float* __restrict__ y_scale) {
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
