// The loading warp of varlen_attention_fp8_sm90a.cu: lane 0 issues every TMA load; the warp
// fills each tile's slot.
#pragma once
#include "varlen_attention_fp8_sm90a_layout.cuh"

// Per work tile: its slot (TileInfo) and its bf16 Q (one box of BQ query rows x the head's 256
// bytes), once the consumers have read the previous tile's Q; then its keys a stage at a time
// into the ring, each stage a K box (128 key rows), a V^T box (128 channel rows x the stage's
// 128 keys) and the stage's K scale, once the consumers have freed that ring slot. Rows past the
// tokens come in as zeros (TMA's fill). Every read of the tile (its slot's, the K scales of up
// to 32 stages, a lane each) is issued before the first wait, so that one L2 trip covers them.
// The parameters are read where used (the constant bank), not held in this warp's 24 registers.
__device__ __forceinline__ void produce(const AttentionParams& p, const SharedMap& sm, const Barriers& bar,
                                        int lane) {
  if (lane == 0) {
    tma_prefetch_map(&p.map_q);
    tma_prefetch_map(&p.map_k);
    tma_prefetch_map(&p.map_v);
  }
  PipelineState<kStages> slot;
  PipelineState<1> q_slot;
  for (int nth = 0;; ++nth) {
    const int tile = blockIdx.x + nth * gridDim.x;  // (tile += gridDim.x kept gridDim, spilled)
    if (tile >= p.n_tiles) break;
    const int mine = lane < TILE_INTS ? __ldg(p.tiles + (i64)tile * TILE_INTS + lane) : 0;
    const int start = __shfl_sync(0xFFFFFFFFu, mine, 0), len = __shfl_sync(0xFFFFFFFFu, mine, 1);
    const int q0 = __shfl_sync(0xFFFFFFFFu, mine, 2), h = __shfl_sync(0xFFFFFFFFu, mine, 3);
    const int seg = __shfl_sync(0xFFFFFFFFu, mine, 4), kb0 = __shfl_sync(0xFFFFFFFFu, mine, 6);
    const float* sv = p.s_v + ((i64)seg * p.heads + h) * HD + lane;
    float v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = __ldg(sv + kLoaderLanes * i);
    const int word = lane == TILE_INTS ? __ldg(p.q_bounds + seg) : mine;  // the slot's word of this lane
    // the K scales of the stages, 32 at a time: lane i holds stage 32 n + i's
    const int n_stages = (len + kStageKeys - 1) / kStageKeys;
    const float* sk_col = p.s_k + (i64)kb0 * p.heads + h;  // a key block every `heads`
    float sks = lane < n_stages ? __ldg(sk_col + (i64)lane * p.heads) : 0.f;
    mbar_wait(bar.q_empty, q_slot.phase ^ 1);  // the consumers have read the previous tile's Q
    q_slot.advance();
    TileInfo& info = sm.info[nth & 1];
    if (lane <= TILE_INTS) info.words[lane] = word;
#pragma unroll
    for (int i = 0; i < 4; ++i) info.s_v[lane + kLoaderLanes * i] = v[i];
    if (lane == 0) {
      mbar_arrive_expect_tx(bar.q_full, kQStagedBytes);
      tma_load_2d(sm.q_staged, &p.map_q, h * 2 * HD, q0, bar.q_full);
    } else {
      mbar_arrive(bar.q_full);  // each lane's own stores to the slot, released
    }
#pragma unroll 1
    for (int j = 0; j < n_stages; ++j) {
      if (j % kLoaderLanes == 0 && j > 0)
        sks = j + lane < n_stages ? __ldg(sk_col + (i64)(j + lane) * p.heads) : 0.f;
      const float sk = __shfl_sync(0xFFFFFFFFu, sks, j % kLoaderLanes);
      mbar_wait(&bar.empty[slot.index], slot.phase ^ 1);
      if (lane == 0) {
        sm.stage_sk[slot.index] = sk;
        u64* full = &bar.full[slot.index];
        mbar_arrive_expect_tx(full, kStageBytes);
        const u32 dst = sm.stage(slot.index);
        tma_load_2d(dst, &p.map_k, h * HD, start + j * kStageKeys, full);
        tma_load_2d(dst + kKBytes, &p.map_v, (kb0 + j) * KSB, h * HD, full);
      }
      slot.advance();
    }
  }
}
