// The loading warpgroup of varlen_attention_fp8_sm90a.cu: one thread issues every TMA load.
#pragma once
#include "varlen_attention_fp8_sm90a_layout.cuh"

// Per work tile: the tile's bf16 Q (one box of BQ query rows x the head's 256 bytes, once the
// consumers have read the previous tile's), then its keys a stage at a time into the ring, each stage a
// K box (128 key rows) and a V^T box (128 channel rows x the stage's 128 keys), each once the
// consumers have freed that ring slot. Rows past the tokens come in as zeros (TMA's fill).
__device__ __forceinline__ void produce(const AttentionParams& maps, const Args& p, const SharedMap& sm,
                                        const Barriers& bar) {
  tma_prefetch_map(&maps.map_q);
  tma_prefetch_map(&maps.map_k);
  tma_prefetch_map(&maps.map_v);
  PipelineState<kStages> slot;
  PipelineState<1> q_slot;
  for (int tile = blockIdx.x; tile < p.n_tiles; tile += gridDim.x) {
    const int* w = p.tiles + (i64)tile * TILE_INTS;
    const int start = __ldg(w), len = __ldg(w + 1), q0 = __ldg(w + 2), h = __ldg(w + 3), seg = __ldg(w + 4);
    const int kb0 = __ldg(w + 6);
    // the consumers' first s_k and their epilogue's s_v (its 4 lines) into L1: an L2 trip each,
    // on their path between tiles, otherwise
    prefetch_l1(p.s_k + (i64)kb0 * p.heads + h);
#pragma unroll
    for (int i = 0; i < HD * 4 / 128; ++i) prefetch_l1(p.s_v + ((i64)seg * p.heads + h) * HD + 32 * i);
    mbar_wait(bar.q_empty, q_slot.phase ^ 1);  // the consumers have read the previous tile's Q
    q_slot.advance();
    mbar_arrive_expect_tx(bar.q_full, kQStagedBytes);
    tma_load_2d(sm.q_staged, &maps.map_q, h * 2 * HD, q0, bar.q_full);
#pragma unroll 1
    for (int j = 0; j * kStageKeys < len; ++j) {
      u64* full = &bar.full[slot.index];
      mbar_wait(&bar.empty[slot.index], slot.phase ^ 1);
      mbar_arrive_expect_tx(full, kStageBytes);
      const u32 dst = sm.stage(slot.index);
      tma_load_2d(dst, &maps.map_k, h * HD, start + j * kStageKeys, full);
      tma_load_2d(dst + kKBytes, &maps.map_v, (kb0 + j) * KSB, h * HD, full);
      slot.advance();
    }
  }
}
