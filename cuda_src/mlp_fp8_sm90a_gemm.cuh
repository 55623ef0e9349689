// The persistent wgmma GEMM of mlp_fp8_sm90a.cu: acc = A . B^T over K bytes of e4m3 for every
// BM x BN output tile of this CTA, handed to an epilogue in registers. Needs the build's
// constants (mlp_fp8_sm90a.cu), hopper_common.cuh and mlp_fp8_common.cuh (the tile walk).
//
// The CTA: three warpgroups. Warpgroup 0 gives its registers up; two of its threads issue the
// TMA loads of the K slices (128 bytes of K, 128B-swizzled): one the A ring (BM rows a slice)
// and consumer 0's B ring (its BN / 2 rows), the other consumer 1's B ring. Warpgroups 1 and 2
// take the registers and each computes all BM rows x its BN / 2 columns with wgmma, consumer 1
// a few slices behind consumer 0 (below). full_*[s] completes when a slice has landed (one
// arrival with the TMA transaction count), empty_*[s] when the warps reading it are done. The
// loads run ahead across tile boundaries, so the next tile's first slices arrive while the
// epilogue of this one runs.
//
// Accumulation: the e4m3 wgmma keeps fewer bits than FP32 when it accumulates in the tensor
// core over a long K. Each 128-wide K slice is therefore summed in the tensor core into a
// zeroed partial (4 k32 steps), and the partial is added to FP32 registers ("promotion"), so
// no more than 128 products ever meet inside the tensor core. A consumer's 128 x 128 output is
// done per slice as four 64 x 64 quarters with two 32-register partials in turn: one
// quarter's additions overlap the next quarter's wgmmas. 64 registers of partials sit beside
// the 128 FP32 sums.
#pragma once

// The work split of a persistent GEMM (the launch layer's work_split() picks it).
struct SplitK {
  int whole;        // tiles taken whole: a multiple of the grid's CTAs, or all tiles
  int parts;        // K ranges of each later tile (1: no tile is split)
  float* partials;  // per split tile, warpgroup and part: 128 x 128 FP32 sums
  int* counters;    // per split tile and warpgroup: parts done (0 before a launch, and the last
                    // part sets it back to 0)
};
struct WorkUnit {
  int tile, part;        // part -1: the whole tile
  int kb_begin, kb_end;  // its K slices
};

// Part boundaries fall on multiples of PART_SLICES slices (256 bytes of K), the unit in which
// the launch layer's work_split counts a part.
static constexpr int PART_SLICES = 256 / BK;
static_assert(HIDDEN % (PART_SLICES * BK) == 0 && FFN % (PART_SLICES * BK) == 0, "split parts divide both K");

__device__ __forceinline__ WorkUnit work_unit(int u, const SplitK& split, int slices) {
  if (u < split.whole) return {u, -1, 0, slices};
  const int v = u - split.whole, part = v % split.parts, steps = slices / PART_SLICES;
  return {split.whole + v / split.parts, part, PART_SLICES * (part * steps / split.parts),
          PART_SLICES * ((part + 1) * steps / split.parts)};
}

// One part of a split tile is done in acc (this consumer warpgroup's 64 rows): store its sums
// in its slot and count it; the tile's last part to arrive then reads every part's sums back in
// part order, so acc is the same FP32 sum whichever part came last. Returns whether this was the
// last part (which then runs the epilogue). slot: the split tile's index. The stores, fence,
// count and fence are the usual last-block pattern; the loads bypass L1 (.cg), which is not
// coherent with other SMs' stores.
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

static constexpr int GEMM_THREADS = 384;  // 3 warpgroups
static constexpr int HALF_BN = BN / 2;  // a consumer's columns
static constexpr int A_BYTES = BM * BK, B_BYTES = HALF_BN * BK;  // one slice of A; of one consumer's B
static_assert(LAG_SLICES >= 1 && LAG_SLICES < A_STAGES, "the lead consumer must be able to run LAG_SLICES ahead");
// The lag barriers: consumer 0 arrives once it is LAG_SLICES into a unit, consumer 1 waits there
// before starting it. Two ids in turn, so that an arrival for the next unit cannot meet the wait
// for this one (the A ring keeps consumer 0 fewer than A_STAGES slices, under two units, ahead).
static constexpr int LAG_BARRIER = 3;  // and 4; 1 and 2 are combine_parts' warpgroup barriers

// Every tile of this CTA: acc = A[m0 ..) . B[n0 ..)^T over K bytes of e4m3 (A rows past M come
// in as zeros from TMA), then epilogue(acc, m0, n0 + HALF_BN * consumer) in each consumer thread:
// consumer c owns all BM rows of the tile and its columns HALF_BN c .., acc[h] the m64n128
// fragment (hopper_common.cuh) of row half h. The epilogue must not touch shared memory.
//
// Why the columns are split and consumer 1 runs LAG_SLICES slices behind consumer 0: each
// consumer's epilogue then runs while the other consumer has the tensor core to itself, instead
// of both leaving it idle at once. The lag costs shared memory only for A (the operand both read):
// A has its own ring of A_STAGES slices, released by both consumers; each consumer's half of B
// has a ring of B_STAGES, filled by its own producer thread, so the lagging consumer's B never
// holds back the leading one's loads. A lag is kept as it is by the two consumers' equal work, so
// a barrier only sets it at each unit's start (LAG_BARRIER); the A ring bounds it from above.
//
// Work units (split): a persistent grid of P CTAs takes units c, c + P, ... The first
// split.whole tiles (a multiple of P, so every CTA takes as many) are one unit each; each later
// tile, the last wave's, is split.parts units over consecutive K ranges, so that the last wave
// keeps all P CTAs busy instead of its r < P. Each part's FP32 sums go to a slot of
// split.partials; the last part of a tile to finish adds the slots in part order (the same bits
// whichever finishes last) and runs the epilogue.
template <int K, class Epilogue>
__device__ __forceinline__ void wgmma_gemm(const TmaMap* map_a, const TmaMap* map_b, int M, int n_tiles,
                                           const SplitK& split, Epilogue epilogue) {
  extern __shared__ u8 smem_raw[];
  __shared__ __align__(8) u64 full_a[A_STAGES], empty_a[A_STAGES], full_b[2][B_STAGES], empty_b[2][B_STAGES];
  // the rings: A_STAGES slices of A, then B_STAGES slices of each consumer's half of B
  const u32 base = (smem_u32(smem_raw) + 1023u) & ~1023u;  // the 128B swizzle needs 1024-byte tiles
  const u32 base_b = base + A_STAGES * A_BYTES;
  const int wg = threadIdx.x >> 7;
  const int m_tiles = (M + BM - 1) / BM, tiles = m_tiles * n_tiles;
  const int first_unit = blockIdx.x, unit_step = gridDim.x;
  const int units = split.whole + (tiles - split.whole) * split.parts;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < A_STAGES; ++s) {
      mbar_init(&full_a[s], 1);
      mbar_init(&empty_a[s], 8);  // the warps of both consumers
    }
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
      for (int s = 0; s < B_STAGES; ++s) {
        mbar_init(&full_b[c][s], 1);
        mbar_init(&empty_b[c][s], 4);
      }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    regs_dealloc<PRODUCER_REGS>();
    // Lane 0 of warp 0 loads A and consumer 0's B, lane 0 of warp 1 consumer 1's B.
    const int loader = threadIdx.x >> 5;
    if (loader < 2 && (threadIdx.x & 31) == 0) {
      tma_prefetch_map(map_a);
      tma_prefetch_map(map_b);
      PipelineState<A_STAGES> ring_a;
      PipelineState<B_STAGES> ring_b;
      for (int unit = first_unit; unit < units; unit += unit_step) {
        const WorkUnit w = work_unit(unit, split, K / BK);
        int m0, n0;
        tile_origin(w.tile, m_tiles, n_tiles, m0, n0);
#pragma unroll 1
        for (int kb = w.kb_begin; kb < w.kb_end; ++kb) {
          if (loader == 0) {
            mbar_wait(&empty_a[ring_a.index], ring_a.phase ^ 1);
            mbar_arrive_expect_tx(&full_a[ring_a.index], A_BYTES);
            tma_load_2d(base + ring_a.index * A_BYTES, map_a, kb * BK, m0, &full_a[ring_a.index]);
            ring_a.advance();
          }
          mbar_wait(&empty_b[loader][ring_b.index], ring_b.phase ^ 1);
          mbar_arrive_expect_tx(&full_b[loader][ring_b.index], B_BYTES);
          tma_load_2d(base_b + (loader * B_STAGES + ring_b.index) * B_BYTES, map_b, kb * BK, n0 + HALF_BN * loader,
                      &full_b[loader][ring_b.index]);
          ring_b.advance();
        }
      }
    }
    return;
  }

  regs_alloc<CONSUMER_REGS>();
  // warp-uniform as the compiler sees it (a shuffle from lane 0), so the descriptors below live in
  // the uniform datapath instead of being moved there for every wgmma
  const int consumer = __shfl_sync(0xffffffffu, wg - 1, 0), lane = threadIdx.x & 31;
  // the slice read next, and the oldest slice still read: released in ring order, one slice behind
  PipelineState<A_STAGES> ring_a, held_a;
  PipelineState<B_STAGES> ring_b, held_b;
  const u32 my_b = base_b + consumer * B_STAGES * B_BYTES;
  // Four 64 x 64 quarters per slice (row half q / 2, column half q % 2), two partials in turn: a
  // quarter's wgmmas run while the previous quarter's partial is added.
  int lag_id = LAG_BARRIER;
  for (int unit = first_unit; unit < units; unit += unit_step) {
    const WorkUnit w = work_unit(unit, split, K / BK);
    int m0, n0;
    tile_origin(w.tile, m_tiles, n_tiles, m0, n0);
    // consumer 0 arrives as it starts this unit's slice lag_at (its last, in a shorter unit)
    const int lag_at = w.kb_begin + min(LAG_SLICES, w.kb_end - w.kb_begin - 1);
    if (consumer == 1) named_barrier_sync(lag_id, 256);
    // the partials are zeroed per unit, not once, so that they are dead during the epilogue
    float acc[2][64], part[2][32];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[h][i] = 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) part[0][i] = part[1][i] = 0.f;
    int kb = w.kb_begin;  // every unit has at least one slice
#pragma unroll 1
    do {
      if (consumer == 0 && kb == lag_at) named_barrier_arrive(lag_id, 256);
      mbar_wait(&full_a[ring_a.index], ring_a.phase);
      mbar_wait(&full_b[consumer][ring_b.index], ring_b.phase);
      // the slice's descriptors once, then stepped by adds (a k32 step is 32 bytes, a row half
      // 64 rows)
      const u32 a_lo = wgmma_desc_lo(base + ring_a.index * A_BYTES);
      const u32 b_lo = wgmma_desc_lo(my_b + ring_b.index * B_BYTES);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < BK / 32; ++k)
          wgmma_m64n64k32_e4m3(part[q & 1], wgmma_desc_at(a_lo, (q >> 1) * 64 * BK + 32 * k),
                               wgmma_desc_at(b_lo, (q & 1) * 64 * BK + 32 * k), k);
        wgmma_commit();
        wgmma_wait<1>();  // the previous quarter (of this slice or the last) is done
        const int pq = (q + 3) & 3;  // its quarter
        if (q > 0 || kb > w.kb_begin) {
#pragma unroll
          for (int i = 0; i < 32; ++i) {
            fence_regs(part[pq & 1][i]);  // the additions read the partial only after the wait
            acc[pq >> 1][32 * (pq & 1) + i] += part[pq & 1][i];
          }
        }
        // A slice is released only once the wait above covers its last quarter: the previous
        // slice's, at this slice's first quarter.
        if (q == 0 && kb > w.kb_begin) {
          if (lane == 0) {
            mbar_arrive(&empty_a[held_a.index]);
            mbar_arrive(&empty_b[consumer][held_b.index]);
          }
          held_a.advance();
          held_b.advance();
        }
      }
      if (kb == w.kb_end - 1) {  // the unit's last quarter
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          fence_regs(part[1][i]);
          acc[1][32 + i] += part[1][i];
        }
        if (lane == 0) {
          mbar_arrive(&empty_a[held_a.index]);
          mbar_arrive(&empty_b[consumer][held_b.index]);
        }
        held_a.advance();
        held_b.advance();
      }
      ring_a.advance();
      ring_b.advance();
    } while (++kb < w.kb_end);
    lag_id ^= LAG_BARRIER ^ (LAG_BARRIER + 1);
    // a split tile's parts but its last end here (combine_parts)
    if (w.part < 0 || combine_parts(acc, split, w.part, w.tile - split.whole, consumer))
      epilogue(acc, m0, n0 + HALF_BN * consumer);
  }
}
