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
// Every path issues the same wgmmas: a stage with no high half (the segment's last, 64 keys or
// fewer) runs that half with every key masked (P 0, m unchanged) on the V pass's zero padding,
// and past the last stage the next S is a stand-in (issue_next_s128). A wgmma issued under a
// condition while others are in flight made ptxas serialize every wgmma of the kernel
// (C7513 / C7515).
__device__ __forceinline__ void stage_loop(float4* o_lane, float& m0, float& m1, float& l0, float& l1, float& lt0,
                                           float& lt1, float (&part)[64], float (&lp)[4], float sk_next,
                                           PipelineState<kStages>& slot, const Tile& tl, const SharedMap& sm,
                                           const Barriers& bar, u32 a_q, u64 ones, int heads, int lane, int t) {
  float s[32], s_hi[32];
  u32 pa[kBlockKeys / 32][4], pb[kBlockKeys / 32][4];
  float sk = 0.f;  // s_k of the stage
  float mo0 = neg_inf(), mo1 = neg_inf();  // the max O's values are at
  float x0, x1;  // the lane maxima of the stage's low half, taken while its high half's S runs
  const int consumer = (threadIdx.x >> 7) - 1;
#pragma unroll 1
  for (int st = 0; st < tl.n_stages; ++st) {
    const u32 stage_base = sm.stage(slot.index);
    const int valid = tl.len - st * kStageKeys;  // keys of the segment from this stage's first
    if (st == 0) {  // the tile's first S; the later ones are issued during the stage before
      sk = sk_next;
      if (tl.n_stages > 1) sk_next = __ldg(tl.sk + heads);
      mbar_wait(&bar.full[slot.index], slot.phase);
      wgmma_fence();
      issue_s64(s, a_q, stage_base);
      issue_s64(s_hi, a_q, stage_base + kBlockKeys * HD);
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 32; ++i) fence_regs(s[i]);
      lane_max<true>(s, x0, x1, 0.f, 0.f, valid, t);
      if (tl.n_stages >= 2 && consumer == 1) named_barrier_sync<2, 256>();
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      fence_regs(s[i]);
      fence_regs(s_hi[i]);
    }
    const float cb0 = tl.c0 * sk, cb1 = tl.c1 * sk;
    float y0, y1, a0, a1;
    lane_max<true>(s_hi, y0, y1, cb0, cb1, valid - kBlockKeys, t);  // no keys: -inf
    row_max<true>(fmaxf(x0, y0), fmaxf(x1, y1), m0, m1, a0, a1, cb0, cb1);
    block_exp<true, kExactL>(s, pa, m0, m1, l0, l1, a0, a1, cb0, cb1, valid, t);
    // the chain's first stage starts part anew; a later one rescales it where a row's max moved
    const bool chain_on = st % kChainStages != 0;
    if (chain_on) scale_rows(part, a0, a1);
    // The ring steps past the stage; where a next one follows, its s_k is read and its keys
    // waited for, before its S is issued
    const int cur = slot.index;
    slot.advance();
    const bool more = st + 1 < tl.n_stages;
    if (more) {
      sk = sk_next;
      if (st + 2 < tl.n_stages) sk_next = __ldg(tl.sk + (i64)(st + 2) * heads);
      mbar_wait(&bar.full[slot.index], slot.phase);
    }
    const u32 next_q = more ? a_q : stage_base, next_k = more ? sm.stage(slot.index) : stage_base;
    wgmma_fence();
    issue_pv(part, pa, stage_base + kKBytes, lp, ones, true, chain_on);
    wgmma_commit();
    issue_s64(s, next_q, next_k);  // the next stage's low half (a stand-in past the last)
    wgmma_commit();
    if (st == 0 && tl.n_stages >= 2 && consumer == 0) asm volatile("bar.arrive 2, 256;" ::: "memory");
    block_exp<true, kExactL>(s_hi, pb, m0, m1, l0, l1, 1.f, 1.f, cb0, cb1, valid - kBlockKeys, t);
    wgmma_fence();
    issue_pv(part, pb, stage_base + kKBytes + kBlockKeys, lp, ones, true, true, true);  // P 0 without a high half
    wgmma_commit();
    issue_s64(s_hi, next_q, next_k + kBlockKeys * HD);
    wgmma_commit();
    wgmma_wait<1>();  // both halves' P V and the next low half are done; the next high half may still run
    keep_p(pa);
    keep_p(pb);
#pragma unroll
    for (int i = 0; i < 32; ++i) fence_regs(s[i]);
    if (more) lane_max<true>(s, x0, x1, 0.f, 0.f, valid - kStageKeys, t);
    add_l(lt0, lt1, lp, a0, a1);
    if ((st + 1) % kChainStages == 0 || !more) {  // the chain joins O, at O's max (mo) till now
      const float f0 = ex2(mo0 - m0), f1 = ex2(mo1 - m1);  // 0 at the first: mo is -inf
      mo0 = m0;
      mo1 = m1;
      add_o(o_lane, part, f0, f1, st < kChainStages);
    }
    if (!more) wgmma_wait<0>();  // the last stage's stand-in S reads its K rows
    if (lane == 0) mbar_arrive(&bar.empty[cur]);  // the stage's last reads are done
    wgmma_wait<0>();
  }
}
