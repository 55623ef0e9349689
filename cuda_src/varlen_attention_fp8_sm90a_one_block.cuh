// A segment of a single 64-key block in varlen_attention_fp8_sm90a.cu: S on mma.sync.
//
// There the reference's P grid holds the output to 0.005 (longer segments: 0.03), which S summed
// in the FP8 tensor cores (128 products inside the core) misses on some sets, so S is form 0's
// (the mma.sync kernel's steps, s_step_mma_sync, from the same swizzled tiles: the same bits),
// scaled before its max and with l summed in FP32 from the unrounded P, as the reference does.
#pragma once
#include "varlen_attention_fp8_sm90a_mma.cuh"
#include "varlen_attention_fp8_sm90a_softmax.cuh"
#include "varlen_attention_fp8_sm90a_tile.cuh"

// The A fragment (the m16n8k32 mma.sync one, also the register A of wgmma) of k32 step ks of a
// warp's 16 Q rows (q_rows: its first, in the swizzled Q tile).
__device__ __forceinline__ void load_q_step(u32 (&qa)[4], u32 q_rows, int lane, int ks) {
  const int lq = lane >> 3, lr = lane & 7;  // ldmatrix: lane gives row lr of matrix lq
  ldmatrix_x4(q_rows + (swz128(lr + 8 * (lq & 1), lq >> 1) ^ (ks << 5)), qa[0], qa[1], qa[2], qa[3]);
}

// S of the block on mma.sync m16n8k32; the m16n8 C registers of n8 tile nt are s[4 nt .. 4 nt + 3],
// the wgmma layout.
__device__ __forceinline__ void compute_s_sync(float (&s)[32], u32 q_rows, u32 k_rows, int lane) {
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = 0.f;
#pragma unroll
  for (int ks = 0; ks < HD / 32; ++ks) {
    u32 qa[4];
    load_q_step(qa, q_rows, lane, ks);
    s_step_mma_sync<kBlockKeys>(*reinterpret_cast<float(*)[kBlockKeys / 8][4]>(s), qa, k_rows, ks, lane);
  }
}

// The tile's one stage: S, the softmax, P V on wgmma (waited for at once), O = O * alpha + P V.
__device__ __forceinline__ void one_block_tile(float (&o)[64], float& m0, float& m1, float& l0, float& l1, float& lt0,
                                               float& lt1, float (&part)[64], float (&lp)[4],
                                               PipelineState<kStages>& slot, const Tile& tl, const SharedMap& sm,
                                               const Barriers& bar, u32 a_q, u64 ones, int warp, int lane, int t) {
  mbar_wait(&bar.full[slot.index], slot.phase);
  const u32 k_rows = sm.stage(slot.index);
  float s[32];
  compute_s_sync(s, a_q + 16 * warp * HD, k_rows, lane);
  const float sk = stage_scale(sm, slot.index, lane);
  const float cb0 = tl.c0 * sk, cb1 = tl.c1 * sk;
  float mx0, mx1, a0, a1;
  u32 pa[kBlockKeys / 32][4];
  lane_max<false>(s, mx0, mx1, cb0, cb1, tl.len, t);
  row_max<false>(mx0, mx1, m0, m1, a0, a1, cb0, cb1);
  block_exp<false, true>(s, pa, m0, m1, l0, l1, a0, a1, cb0, cb1, tl.len, t);
  wgmma_fence();
  issue_pv(part, pa, k_rows + kKBytes, lp, ones, false);
  wgmma_commit();
  wgmma_wait<0>();
  add_o(o, part, a0, a1);
  if (lane == 0) mbar_arrive(&bar.empty[slot.index]);
  slot.advance();
}
