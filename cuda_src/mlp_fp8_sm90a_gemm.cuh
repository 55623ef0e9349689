// The persistent wgmma GEMM of mlp_fp8_sm90a.cu: acc = A . B^T over K bytes of e4m3 for every
// BM x BN output tile of this CTA (BN 256 or 224, a template parameter: the launch layer's plan
// picks it per GEMM and M), handed to an epilogue in registers. Needs the build's
// constants (mlp_fp8_sm90a.cu), hopper_common.cuh and mlp_fp8_common.cuh (the tile walk).
//
// The CTA: three warpgroups. Warpgroup 0 gives its registers up and one of its threads issues
// the TMA loads of a STAGES-deep ring of K slices (BM rows of A and BN rows of B, 128 bytes of
// K each, 128B-swizzled); warpgroups 1 and 2 take the registers and each computes 64 rows x BN
// columns with wgmma. full[s] completes when a slice has landed (one arrival with the TMA
// transaction count), empty[s] when all 8 consumer warps are done reading it. The loads run
// ahead across tile boundaries, so the next tile's first slices arrive while the epilogue of
// this one runs.
//
// Accumulation: the e4m3 wgmma keeps fewer bits than FP32 when it accumulates in the tensor
// core over a long K. Each 128-wide K slice is therefore summed in the tensor core into a
// zeroed partial (4 k32 steps), and the partial is added to FP32 registers ("promotion"), so
// no more than 128 products ever meet inside the tensor core. A consumer's 64 x BN output is
// done per slice in pieces with two partials in turn, so one piece's additions overlap the next
// piece's wgmmas: four m64n64 quarters at BN = 256 (64 registers of partials beside the 128 FP32
// sums; halves would need 256), two m64n112 halves at BN = 224 (112 beside 112), which read A
// from shared memory half as often as quarters.
#pragma once

// The work split of a persistent GEMM (the launch layer's work_split() picks it).
struct SplitK {
  int whole;        // tiles taken whole: a multiple of the grid's CTAs, or all tiles
  int parts;        // K ranges of each later tile (1: no tile is split)
  float* partials;  // per split tile, warpgroup and part: 64 x BN FP32 sums
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
template <int QN>
__device__ __forceinline__ bool combine_parts(float (&acc)[2][QN], const SplitK& split, int part, int slot,
                                              int consumer) {
  constexpr int N = 2 * QN, SLOT = 128 * N;  // a thread's sums; a part's sums of one warpgroup
  __shared__ int arrived[2];
  const int t = threadIdx.x & 127, counter = 2 * slot + consumer;
  float* sums = split.partials + (i64)counter * split.parts * SLOT + t;  // [part][i][thread]
#pragma unroll
  for (int i = 0; i < N; ++i) __stcg(sums + (i64)part * SLOT + 128 * i, acc[i / QN][i % QN]);
  __threadfence();
  warpgroup_sync(1 + consumer);
  if (t == 0) arrived[consumer] = atomicAdd(split.counters + counter, 1);
  warpgroup_sync(1 + consumer);
  if (arrived[consumer] != split.parts - 1) return false;
  __threadfence();
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i / QN][i % QN] = __ldcg(sums + 128 * i);
#pragma unroll 1
  for (int p = 1; p < split.parts; ++p)
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i / QN][i % QN] += __ldcg(sums + (i64)p * SLOT + 128 * i);
  if (t == 0) split.counters[counter] = 0;
  return true;
}

static constexpr int GEMM_THREADS = 384;  // 3 warpgroups
static constexpr int CONSUMER_WARPS = 8;
static constexpr int A_BYTES = BM * BK;

// One k32 step of a piece: 64 x PN x 32 (the m64n128 fragment over PN / 8 n8 blocks).
template <int PN>
__device__ __forceinline__ void wgmma_piece(float (&d)[PN / 2], u64 desc_a, u64 desc_b, int accumulate) {
  if constexpr (PN == 64)
    wgmma_m64n64k32_e4m3(d, desc_a, desc_b, accumulate);
  else
    wgmma_m64n112k32_e4m3(d, desc_a, desc_b, accumulate);
}

// Every tile of this CTA: acc = A[m0 ..) . B[n0 ..)^T over K bytes of e4m3 (A rows past M come
// in as zeros from TMA), then epilogue(acc, m0 + 64 * consumer, n0) in each consumer thread,
// acc[h][i] in the m64n128 fragment layout of half h (hopper_common.cuh) over its BN / 16 n8
// blocks. The epilogue must not touch shared memory.
//
// Work units (split): a persistent grid of P CTAs takes units c, c + P, ... The first
// split.whole tiles (a multiple of P, so every CTA takes as many) are one unit each; each later
// tile, the last wave's, is split.parts units over consecutive K ranges, so that the last wave
// keeps all P CTAs busy instead of its r < P. Each part's FP32 sums go to a slot of
// split.partials; the last part of a tile to finish adds the slots in part order (the same bits
// whichever finishes last) and runs the epilogue.
template <int K, int BN, class Epilogue>
__device__ __forceinline__ void wgmma_gemm(const TmaMap* map_a, const TmaMap* map_b, int M, int n_tiles,
                                           const SplitK& split, Epilogue epilogue) {
  static_assert(BN == 256 || BN == 224, "tiles of 256 or 224 columns (wgmma_piece)");
  // halves where the sums and two half-width partials (BN registers) fit the consumer's budget
  // beside its addressing, quarters otherwise
  constexpr int PIECES = BN <= 224 ? 2 : 4;
  constexpr int QN = BN / 4, PN = BN / PIECES, PR = PN / 2;  // a half's registers; a piece's columns, registers
  constexpr int STAGE_BYTES = (BM + BN) * BK;  // a multiple of 1024, as the swizzle needs
  extern __shared__ u8 smem_raw[];
  __shared__ __align__(8) u64 full[STAGES], empty[STAGES];
  const u32 base = (smem_u32(smem_raw) + 1023u) & ~1023u;  // the 128B swizzle needs 1024-byte tiles
  const int wg = threadIdx.x >> 7;
  const int m_tiles = (M + BM - 1) / BM, tiles = m_tiles * n_tiles;
  const int first_unit = blockIdx.x, unit_step = gridDim.x;
  const int units = split.whole + (tiles - split.whole) * split.parts;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], CONSUMER_WARPS);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    regs_dealloc<PRODUCER_REGS>();
    if (threadIdx.x == 0) {
      tma_prefetch_map(map_a);
      tma_prefetch_map(map_b);
      PipelineState<STAGES> ring;
      for (int unit = first_unit; unit < units; unit += unit_step) {
        const WorkUnit w = work_unit(unit, split, K / BK);
        int m0, n0;
        tile_origin(w.tile, m_tiles, n_tiles, BN, m0, n0);
#pragma unroll 1
        for (int kb = w.kb_begin; kb < w.kb_end; ++kb) {
          mbar_wait(&empty[ring.index], ring.phase ^ 1);
          mbar_arrive_expect_tx(&full[ring.index], STAGE_BYTES);
          const u32 dst = base + ring.index * STAGE_BYTES;
          tma_load_2d(dst, map_a, kb * BK, m0, &full[ring.index]);
          tma_load_2d(dst + A_BYTES, map_b, kb * BK, n0, &full[ring.index]);
          ring.advance();
        }
      }
    }
    return;
  }

  regs_alloc<CONSUMER_REGS>();
  // warp-uniform as the compiler sees it (a shuffle from lane 0), so the descriptors below live in
  // the uniform datapath instead of being moved there for every wgmma
  const int consumer = __shfl_sync(0xffffffffu, wg - 1, 0), lane = threadIdx.x & 31;
  // the stage read next, and the oldest stage still read: released in ring order, one slice behind
  PipelineState<STAGES> ring, held;
  // PIECES 64 x PN pieces per slice, two partials in turn: a piece's wgmmas run while the
  // previous piece's partial is added, so this warpgroup keeps the tensor core fed itself.
  float part[2][PR];
#pragma unroll
  for (int i = 0; i < PR; ++i) part[0][i] = part[1][i] = 0.f;
  for (int unit = first_unit; unit < units; unit += unit_step) {
    const WorkUnit w = work_unit(unit, split, K / BK);
    int m0, n0;
    tile_origin(w.tile, m_tiles, n_tiles, BN, m0, n0);
    float acc[2][QN];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < QN; ++i) acc[h][i] = 0.f;
    // piece q's partial register i is acc's register PR q + i (of the flattened halves)
    auto add_piece = [&](int q) {
#pragma unroll
      for (int i = 0; i < PR; ++i) {
        fence_regs(part[q & 1][i]);  // the additions read the partial only after the wait
        acc[(PR * q + i) / QN][(PR * q + i) % QN] += part[q & 1][i];
      }
    };
    int kb = w.kb_begin;  // every unit has at least one slice
#pragma unroll 1
    do {
      mbar_wait(&full[ring.index], ring.phase);
      // the slice's descriptors once, then stepped by adds (a k32 step is 32 bytes, a piece
      // PN rows of B: a multiple of the swizzle's 8 rows)
      const u32 a_lo = wgmma_desc_lo(base + ring.index * STAGE_BYTES + consumer * 64 * BK);
      const u32 b_lo = wgmma_desc_lo(base + ring.index * STAGE_BYTES + A_BYTES);
#pragma unroll
      for (int q = 0; q < PIECES; ++q) {
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < BK / 32; ++k)
          wgmma_piece<PN>(part[q & 1], wgmma_desc_at(a_lo, 32 * k), wgmma_desc_at(b_lo, q * PN * BK + 32 * k), k);
        wgmma_commit();
        wgmma_wait<1>();  // the previous piece (of this slice or the last) is done
        if (q > 0 || kb > w.kb_begin) add_piece((q + PIECES - 1) % PIECES);
        // A stage is released only once the wait above covers its slice's last piece: the
        // previous slice's, at this slice's first piece.
        if (q == 0 && kb > w.kb_begin) {
          if (lane == 0) mbar_arrive(&empty[held.index]);
          held.advance();
        }
      }
      if (kb == w.kb_end - 1) {  // the unit's last piece
        wgmma_wait<0>();
        add_piece(PIECES - 1);
        if (lane == 0) mbar_arrive(&empty[held.index]);
        held.advance();
      }
      ring.advance();
    } while (++kb < w.kb_end);
    // a split tile's parts but its last end here (combine_parts)
    if (w.part < 0 || combine_parts(acc, split, w.part, w.tile - split.whole, consumer))
      epilogue(acc, m0 + 64 * consumer, n0);
  }
}
