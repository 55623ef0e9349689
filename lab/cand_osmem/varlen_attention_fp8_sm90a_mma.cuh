// The matrix products of varlen_attention_fp8_sm90a.cu's stage loop, issued on the wgmma
// wrappers of hopper_common.cuh, and the register updates that follow their waits.
#pragma once
#include "varlen_attention_fp8_sm90a_layout.cuh"

// S of one 128-key stage (4 k32 steps of m64n128k32, Q and K from shared memory) into s_lo
// (keys 0-63: fragment registers 0-31) and s_hi (keys 64-127: registers 32-63); not waited for.
__device__ __forceinline__ void issue_s128(float (&s_lo)[32], float (&s_hi)[32], u32 q_rows, u32 k_rows) {
  const u32 dq = wgmma_desc_lo(q_rows), dk = wgmma_desc_lo(k_rows);
#pragma unroll
  for (int k = 0; k < HD / 32; ++k)
    wgmma_m64n128k32_e4m3(s_lo, s_hi, wgmma_desc_at(dq, 32 * k), wgmma_desc_at(dk, 32 * k), k);
}

// The next stage's S when there is one; else a stand-in of the same shape on this stage's K
// rows (K . K^T), whose result is never read. A wgmma issued under a condition while others are
// in flight had ptxas serialize every wgmma of the function (C7515), so the loop issues one
// always. The stand-in reads no Q: the Q tile may be refilled for the next tile by then.
__device__ __forceinline__ void issue_next_s128(float (&s_lo)[32], float (&s_hi)[32], u32 q_rows, u32 next_k_rows,
                                                u32 k_rows, bool more) {
  issue_s128(s_lo, s_hi, more ? q_rows : k_rows, more ? next_k_rows : k_rows);
}

// P . V of one 64-key half into `part` (P from registers, V^T from shared memory: v_keys, the
// half's first key column in the stage's V^T rows), issued, not waited for. part_onto: continue
// part's sum (else the first k32 step overwrites it). with_l: also P . 1 into lp, each row's sum
// of its rounded P (ones: the descriptor of the all-ones tile, every K step reading the same
// bytes), continued with l_onto.
__device__ __forceinline__ void issue_pv(float (&part)[64], const u32 (&pa)[kBlockKeys / 32][4], u32 v_keys,
                                         float (&lp)[4], u64 ones, bool with_l, bool part_onto = false,
                                         bool l_onto = false) {
  const u32 dv = wgmma_desc_lo(v_keys);
#pragma unroll
  for (int kk = 0; kk < kBlockKeys / 32; ++kk) {
    wgmma_m64n128k32_e4m3_rs(part, pa[kk], wgmma_desc_at(dv, 32 * kk), part_onto || kk > 0);
    if (with_l) wgmma_m64n8k32_e4m3_rs(lp, pa[kk], ones, l_onto || kk > 0);
  }
}

// Keeps P's registers alive up to here: called after the wait that covers the P V wgmmas which
// read them. Without it the compiler counts P dead once the wgmma is issued and may give its
// registers to other values (the next stage's P, softmax temporaries) while the tensor core
// still reads them: PTX makes that undefined, and it gave NaN (e4m3 bytes 0x7f / 0xff).
// h3kernels/testing/ptx_checks.py checks the PTX for any such write.
__device__ __forceinline__ void keep_p(u32 (&pa)[kBlockKeys / 32][4]) {
#pragma unroll
  for (int kk = 0; kk < kBlockKeys / 32; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) fence_regs(pa[kk][r]);
}

// An accumulator in the wgmma layout (rows row0 / row1 by register bit 1) scaled by its rows'
// alphas. alpha is 1 exactly where a row's max held, so a warp whose 16 rows all held skips the
// multiplications (the same bits), as most stages of a long segment do.
__device__ __forceinline__ void scale_rows(float (&v)[64], float a0, float a1) {
  if (__all_sync(0xffffffffu, a0 == 1.f && a1 == 1.f)) return;
#pragma unroll
  for (int i = 0; i < 64; ++i) v[i] *= (i & 2) ? a1 : a0;
}

// The tensor core's row sums, once their wgmmas are waited for: lt = lt * alpha + P . 1 (lp
// registers 0 and 2: this lane's rows, the whole row's sum in every lane).
__device__ __forceinline__ void add_l(float& lt0, float& lt1, float (&lp)[4], float a0, float a1) {
#pragma unroll
  for (int i = 0; i < 4; ++i) fence_regs(lp[i]);
  lt0 = fmaf(lt0, a0, lp[0]);
  lt1 = fmaf(lt1, a1, lp[2]);
}

// O = O * c + part, once part's wgmmas are waited for (c: the rows' factors), O the lane's 64
// values in shared memory (o_lane: float4 j of the lane at o_lane[32 j], conflict-free), 0 before
// a tile's first join (first).
__device__ __forceinline__ void add_o(float4* o_lane, float (&part)[64], float c0, float c1, bool first) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    float4 v = first ? make_float4(0.f, 0.f, 0.f, 0.f) : o_lane[32 * j];
    float* e = &v.x;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = 4 * j + r;
      fence_regs(part[i]);  // the additions read part only after the wait
      e[r] = fmaf(e[r], (i & 2) ? c1 : c0, part[i]);
    }
    o_lane[32 * j] = v;
  }
}

// The lane's O back in registers (the epilogue's).
__device__ __forceinline__ void load_o(float (&o)[64], const float4* o_lane) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float4 v = o_lane[32 * j];
    o[4 * j] = v.x;
    o[4 * j + 1] = v.y;
    o[4 * j + 2] = v.z;
    o[4 * j + 3] = v.w;
  }
}

// S of one 64-key half (4 k32 steps of m64n64k32, Q and K from shared memory) into s; not
// waited for.
__device__ __forceinline__ void issue_s64(float (&s)[32], u32 q_rows, u32 k_rows) {
  const u32 dq = wgmma_desc_lo(q_rows), dk = wgmma_desc_lo(k_rows);
#pragma unroll
  for (int k = 0; k < HD / 32; ++k) wgmma_m64n64k32_e4m3(s, wgmma_desc_at(dq, 32 * k), wgmma_desc_at(dk, 32 * k), k);
}
