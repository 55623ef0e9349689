// The stage loop of varlen_attention_fp8_sm90a.cu: a consumer warpgroup's 64 query rows against
// a segment of more than 64 keys, 256 keys (two ring stages) at a time.
#pragma once
#include "varlen_attention_fp8_sm90a_mma.cuh"
#include "varlen_attention_fp8_sm90a_softmax.cuh"
#include "varlen_attention_fp8_sm90a_tile.cuh"

// A pair of stages (keys 256 it ..): S of both (s[0..1] the first stage's halves, s[2..3] the
// second's) was issued at the end of the pair before (the tile's first here). One running max for
// the pair: the four quarters' lane maxima, scaled by their stage's s_k, one row reduction. Each
// quarter's P V (and P . 1) is issued as soon as its exponentials are packed, onto O, which
// accumulates in the tensor core over the whole segment and is rescaled in registers in a warp
// whose max moved. Once the four P V are done the next pair's S is issued.
//
// Every path issues the same wgmmas: a pair with one stage (the segment's last, odd stage) runs
// its second stage on a stand-in (the first stage's K rows and V^T columns) with every key masked
// (P 0), and past the last pair the next S is a stand-in on this pair's K rows (issue_next_s128),
// waited for before the stages are released. A wgmma issued under a condition while others are
// in flight made ptxas serialize every wgmma of the kernel (C7513 / C7515).
__device__ __forceinline__ void stage_loop(float (&o)[64], float& m0, float& m1, float& l0, float& l1, float& lt0,
                                           float& lt1, float (&lp)[4], float sk_first,
                                           PipelineState<kStages>& slot, const Tile& tl, const SharedMap& sm,
                                           const Barriers& bar, u32 a_q, u64 ones, int heads, int lane, int t) {
  float s[4][32];
  u32 p[4][kBlockKeys / 32][4];
  float ska = sk_first, skb = tl.n_stages > 1 ? __ldg(tl.sk + heads) : 0.f;  // s_k of the pair's stages
  const int n_pairs = (tl.n_stages + 1) / 2;
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;  // the first P V overwrites it
#pragma unroll 1
  for (int it = 0; it < n_pairs; ++it) {
    const bool has_b = 2 * it + 1 < tl.n_stages;  // CTA-uniform
    PipelineState<kStages> slot_b = slot;
    slot_b.advance();
    const u32 base_a = sm.stage(slot.index), base_b = has_b ? sm.stage(slot_b.index) : base_a;
    if (it == 0) {  // the tile's first S; the later ones are issued at the end of the pair before
      mbar_wait(&bar.full[slot.index], slot.phase);
      if (has_b) mbar_wait(&bar.full[slot_b.index], slot_b.phase);
      wgmma_fence();
      issue_s128(s[0], s[1], a_q, base_a);
      issue_s128(s[2], s[3], a_q, base_b);
      wgmma_commit();
      wgmma_wait<0>();
    }
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int i = 0; i < 32; ++i) fence_regs(s[q][i]);
    const int valid = tl.len - it * 2 * kStageKeys;  // keys of the segment from the pair's first
    const float ca0 = tl.c0 * ska, ca1 = tl.c1 * ska, cb0 = tl.c0 * skb, cb1 = tl.c1 * skb;
    // each quarter's lane maxima scaled by its stage's factor before the row reduction (cb >= 0
    // and rounding are monotonic: the same maxima); a quarter with every key masked gives -inf * cb,
    // or NaN where cb = 0, which fmaxf drops
    float y0 = neg_inf(), y1 = neg_inf(), a0, a1;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float x0, x1;
      lane_max<true>(s[q], x0, x1, 0.f, 0.f, valid - q * kBlockKeys, t);
      y0 = fmaxf(y0, x0 * (q < 2 ? ca0 : cb0));
      y1 = fmaxf(y1, x1 * (q < 2 ? ca1 : cb1));
    }
    row_max<true>(y0, y1, m0, m1, a0, a1, 1.f, 1.f);
    if (it > 0) scale_rows(o, a0, a1);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      block_exp<true, kExactL>(s[q], p[q], m0, m1, l0, l1, q == 0 ? a0 : 1.f, q == 0 ? a1 : 1.f,
                               q < 2 ? ca0 : cb0, q < 2 ? ca1 : cb1, valid - q * kBlockKeys, t);
      wgmma_fence();
      issue_pv(o, p[q], (q < 2 ? base_a : base_b) + kKBytes + (q & 1) * kBlockKeys, lp, ones, true,
               it > 0 || q > 0, q > 0);
      wgmma_commit();
      if (q == 2) {  // the first quarter's P V is done by now: its P registers go to the last quarter's
        wgmma_wait<2>();
        keep_p(p[0]);
      }
    }
    wgmma_wait<0>();  // the pair's P V: its P registers are free, and the next S may take them
#pragma unroll
    for (int q = 1; q < 4; ++q) keep_p(p[q]);
    add_l(lt0, lt1, lp, a0, a1);
    const int cur_a = slot.index, cur_b = slot_b.index;
    slot.advance();
    if (has_b) slot.advance();
    const bool more = it + 1 < n_pairs;
    const bool next_b = 2 * it + 3 < tl.n_stages;
    PipelineState<kStages> next_slot_b = slot;
    next_slot_b.advance();
    if (more) {
      ska = __ldg(tl.sk + (i64)(2 * it + 2) * heads);
      skb = next_b ? __ldg(tl.sk + (i64)(2 * it + 3) * heads) : 0.f;
      mbar_wait(&bar.full[slot.index], slot.phase);
      if (next_b) mbar_wait(&bar.full[next_slot_b.index], next_slot_b.phase);
    }
    const u32 next_a = sm.stage(slot.index), next_bb = next_b ? sm.stage(next_slot_b.index) : next_a;
    wgmma_fence();
    issue_next_s128(s[0], s[1], a_q, next_a, base_a, more);
    issue_next_s128(s[2], s[3], a_q, next_bb, base_a, more);
    wgmma_commit();
    wgmma_wait<0>();  // the next pair's S (or the stand-in, which reads this pair's K rows)
    if (lane == 0) {  // the pair's stages' last reads are done
      mbar_arrive(&bar.empty[cur_a]);
      if (has_b) mbar_arrive(&bar.empty[cur_b]);
    }
  }
}
