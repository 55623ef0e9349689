// The stage loop of varlen_attention_fp8_sm90a.cu: a consumer warpgroup's 64 query rows against
// a segment of more than 64 keys, 128 keys (one ring stage) at a time.
#pragma once
#include "varlen_attention_fp8_sm90a_mma.cuh"
#include "varlen_attention_fp8_sm90a_softmax.cuh"
#include "varlen_attention_fp8_sm90a_tile.cuh"

// Stage st (keys 128 st ..): its S is in s / s_hi (issued a stage ahead; the first one here).
// One running max for the stage: both halves' lane maxima, one row reduction, both halves' P
// against it. The low half's P V is issued and runs while the high half's exponentials do; then
// the high half's P V, continuing the same accumulators (wgmmas of one warpgroup onto the same
// registers run in issue order), and the next stage's S behind it. One wait covers both P V.
//
// P V goes to a partial in the tensor core that runs on for kChainStages stages (1024 keys),
// rescaled in registers only in a warp whose max moved, then joins the FP32 O at O's own max (mo):
// no more than 1024 keys meet inside the tensor core, and O takes one multiply-add per element
// every 8 stages. l is the tensor core's sum of the rounded P (P . 1 beside each P V), rescaled
// by the stage's alpha in registers.
//
// The two consumers run half a stage apart: consumer 1 starts a tile's softmax once consumer 0
// has issued its first low half's P V (named barrier 2). Left to themselves they fell in step,
// consumer 1 about a sixth of a stage ahead (the in-order tensor core held its P V and S behind
// consumer 0's), both in their exponentials at once and both waiting on the tensor core at
// once; half a stage apart, each one's softmax runs while the other's products do, and nothing
// pulls them back in step within a tile (lab/attention_timeline.py; docs/kernels/attention_sm90.md).
//
// Every path issues the same wgmmas: a stage with no high half (the segment's last, 64 keys or
// fewer) runs that half with every key masked (P 0, m unchanged) on the V pass's zero padding,
// and past the last stage the next S is a stand-in (issue_next_s128). A wgmma issued under a
// condition while others are in flight made ptxas serialize every wgmma of the kernel
// (C7513 / C7515).
__device__ __forceinline__ void stage_loop(float (&o)[64], float& m0, float& m1, float& l0, float& l1, float& lt0,
                                           float& lt1, float (&part)[64], float (&lp)[4],
                                           PipelineState<kStages>& slot, const Tile& tl, const SharedMap& sm,
                                           const Barriers& bar, u32 a_q, u64 ones,
                                           int lane, int t) {
  float s[32], s_hi[32];
  u32 pa[kBlockKeys / 32][4], pb[kBlockKeys / 32][4];
  float sk = 0.f;  // s_k of the stage (the loading warp's copy beside its keys)
  float mo0 = neg_inf(), mo1 = neg_inf();  // the max O's values are at
  // the consumer, from the thread index again (a volatile read: ptxas merged a plain one with the
  // kernel's copy, which it kept across the loop and spilled)
  u32 tid;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  const int consumer = (int)(tid >> 7) - 1;
#pragma unroll 1
  for (int st = 0; st < tl.n_stages; ++st) {
    const u32 stage_base = sm.stage(slot.index);
    if (st == 0) {  // the tile's first S; the later ones are issued a stage ahead
      mbar_wait(&bar.full[slot.index], slot.phase);
      sk = stage_scale(sm, slot.index, lane);
      wgmma_fence();
      issue_s128(s, s_hi, a_q, stage_base);
      wgmma_commit();
      wgmma_wait<0>();
      if (tl.n_stages >= 2 && consumer == 1) named_barrier_sync<2, 256>();  // half a stage behind
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      fence_regs(s[i]);
      fence_regs(s_hi[i]);
    }
    const int valid = tl.len - st * kStageKeys;  // keys of the segment from this stage's first
    const float cb0 = tl.c0 * sk, cb1 = tl.c1 * sk;
    float x0, x1, y0, y1, a0, a1;
    lane_max<true>(s, x0, x1, cb0, cb1, valid, t);
    lane_max<true>(s_hi, y0, y1, cb0, cb1, valid - kBlockKeys, t);  // no keys: -inf
    row_max<true>(fmaxf(x0, y0), fmaxf(x1, y1), m0, m1, a0, a1, cb0, cb1);
    block_exp<true, kExactL>(s, pa, m0, m1, l0, l1, a0, a1, cb0, cb1, valid, t);
    // the chain's first stage starts part anew; a later one rescales it where a row's max moved
    const bool chain_on = st % kChainStages != 0;
    if (chain_on) scale_rows(part, a0, a1);
    wgmma_fence();
    issue_pv(part, pa, stage_base + kKBytes, lp, ones, true, chain_on);
    wgmma_commit();
    if (st == 0 && tl.n_stages >= 2 && consumer == 0) named_barrier_arrive<2, 256>();
    block_exp<true, kExactL>(s_hi, pb, m0, m1, l0, l1, 1.f, 1.f, cb0, cb1, valid - kBlockKeys, t);
    // The ring steps past the stage; where a next one follows, its keys are waited for before
    // the issue
    const int cur = slot.index;
    slot.advance();
    const bool more = st + 1 < tl.n_stages;
    if (more) {
      mbar_wait(&bar.full[slot.index], slot.phase);
      sk = stage_scale(sm, slot.index, lane);
    }
    wgmma_fence();
    issue_pv(part, pb, stage_base + kKBytes + kBlockKeys, lp, ones, true, true, true);  // P 0 without a high half
    wgmma_commit();
    issue_next_s128(s, s_hi, a_q, sm.stage(slot.index), stage_base, more);
    wgmma_commit();
    wgmma_wait<1>();  // both halves' P V are done; the next S may still run
    keep_p(pa);
    keep_p(pb);
    add_l(lt0, lt1, lp, a0, a1);
    if ((st + 1) % kChainStages == 0 || !more) {  // the chain joins O, at O's max (mo) till now
      const float f0 = ex2(mo0 - m0), f1 = ex2(mo1 - m1);  // 0 at the first: mo is -inf
      mo0 = m0;
      mo1 = m1;
      add_o(o, part, f0, f1);
    }
    if (!more) wgmma_wait<0>();  // the last stage's stand-in S reads its K rows
    if (lane == 0) mbar_arrive(&bar.empty[cur]);  // the stage's last reads are done
    wgmma_wait<0>();
  }
}
