// A softmax warpgroup of varlen_attention_fp8_sm90a.cu: 64 query rows of each work tile.
#pragma once
#include "varlen_attention_fp8_sm90a_epilogue.cuh"
#include "varlen_attention_fp8_sm90a_one_block.cuh"
#include "varlen_attention_fp8_sm90a_q.cuh"
#include "varlen_attention_fp8_sm90a_stage_loop.cuh"

__device__ __forceinline__ void consume(const Args& p, const SharedMap& sm, const Barriers& bar, int consumer) {
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
  const int g = lane >> 2, t = lane & 3;
  const i64 pitch = (i64)p.heads * HD;  // elements between consecutive tokens of out and q
  PipelineState<kStages> slot;  // the ring stage of the next keys
  PipelineState<1> q_slot;
  float part[64];  // the P V partial (see stage_loop)
  float lp[4] = {0.f, 0.f, 0.f, 0.f};  // P . 1 of a stage
  const u64 ones_desc = wgmma_desc(sm.ones);
#pragma unroll
  for (int i = 0; i < 64; ++i) part[i] = 0.f;
  for (int tile = blockIdx.x, nth = 0; tile < p.n_tiles; tile += gridDim.x, ++nth) {
    const TileInfo& info = sm.info[nth & 1];  // the loading warp's copy of the plan's row and s_v
    // The tile's Q first, quantized while little else is live (placed after the tile's loads
    // of the plan, it cost the stage loop its schedule: descriptors converted between wgmmas)
    mbar_wait(bar.q_full, q_slot.phase);
    q_slot.advance();
    const float sq = quantize_q_rows(sm.q_staged + consumer * 64 * 2 * HD, sm.q + consumer * 64 * HD, warp, lane);
    // every thread's reads of the staged rows and of the previous tile's slot are done: the next
    // tile's may land (each thread arrives after its own reads, so that no warp-level ordering
    // is assumed)
    mbar_arrive(bar.q_empty);
    fence_proxy_async_shared();
    named_barrier_sync<1, 256>();  // both consumers: they start every tile together
    // s_q of rows g and g + 8 (lanes 2 g and 2 g + 16 quantized them); rows past the segment
    // give S = 0 and are not written
    const float sq0 = __shfl_sync(0xFFFFFFFFu, sq, 2 * g), sq1 = __shfl_sync(0xFFFFFFFFu, sq, 2 * g + 16);
    Tile tl;
    tl.len = info.row[1];
    const int q0 = info.row[2];
    tl.end = info.row[5];
    tl.n_stages = (tl.len + kStageKeys - 1) / kStageKeys;
    const bool one_block = (tl.len + kBlockKeys - 1) / kBlockKeys == 1;  // CTA-uniform: S on mma.sync, l in FP32
    tl.row0 = q0 + 64 * consumer + 16 * warp + g;
    // ptxas 13.0 kept q0 across the exact-l build's tile instead and spilled it (8 bytes a tile):
    // there row0 is kept as computed (in the other build the same pin spilled 16 bytes instead)
    if constexpr (kExactL) asm volatile("" : "+r"(tl.row0));
    tl.row1 = tl.row0 + 8;
    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    float m0 = neg_inf(), m1 = neg_inf(), l0 = 0.f, l1 = 0.f, lt0 = 0.f, lt1 = 0.f;
    const u32 a_q = sm.q + consumer * 64 * HD;  // this warpgroup's rows of the Q tile
    tl.c0 = tl.row0 < tl.end ? sq0 * p.scale_log2 : 0.f;
    tl.c1 = tl.row1 < tl.end ? sq1 * p.scale_log2 : 0.f;
    if (one_block)  // apart from the stage loop: a branch inside it cost the loop 7% (H200)
      one_block_tile(o, m0, m1, l0, l1, lt0, lt1, part, lp, slot, tl, sm, bar, a_q, ones_desc, warp, lane, t);
    else
      stage_loop(o, m0, m1, l0, l1, lt0, lt1, part, lp, slot, tl, sm, bar, a_q, ones_desc, lane, t);
    finish_tile(o, p, m0, m1, l0, l1, lt0, lt1, tl, one_block, lane, pitch, info,
                sm.out_stage + (4 * consumer + warp) * kOutWarpBytes);
  }
}
