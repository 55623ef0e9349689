// The epilogue of varlen_attention_fp8_sm90a.cu: out = bf16(O s_v / (256 l)) and the lse of a
// lane's two rows (epilogue_rows, varlen_attention_fp8_common.cuh), out staged in shared memory.
#pragma once
#include "varlen_attention_fp8_sm90a_tile.cuh"

// A warp's 16 staged rows to out, whole 256-byte rows, 16 bytes a lane; VEC: out is 16-byte
// aligned (its pitch is a multiple of 256 bytes, so every row is), else 4-byte stores (out is
// 4-byte aligned, as write_rows' stores need). Two instantiations, so that the test of out's
// alignment is taken once, not in every row's store.
template <bool VEC>
__device__ __forceinline__ void store_staged_rows(const u8* stage, u16* out, int first, int end, int h, i64 pitch,
                                                  int lane) {
  const int c = lane & 15;  // the lane's 16-byte column
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = 2 * i + (lane >> 4);
    const uint4 v = *reinterpret_cast<const uint4*>(stage + r * kOutPitch + 16 * c);
    if (first + r < end) {
      u16* dst = out + (i64)(first + r) * pitch + h * HD + 8 * c;
      if constexpr (VEC) {
        *reinterpret_cast<uint4*>(dst) = v;
      } else {
        u32* d = reinterpret_cast<u32*>(dst);
        d[0] = v.x;
        d[1] = v.y;
        d[2] = v.z;
        d[3] = v.w;
      }
    }
  }
}

// epilogue_rows' arithmetic, but a warp's words of its 16 rows go into `stage` (its
// kOutWarpBytes of shared memory) and leave as whole rows (store_staged_rows), where the
// fragment's own stores put 8 rows in every warp instruction (8 store wavefronts each: at 8
// stages a tile the stores were the epilogue's cost). The lse's reads of q all come before the
// warp's first store to out, which may alias q.
template <class Acc>
__device__ __forceinline__ void write_rows_staged(Acc o, int row0, int end, int lane, float m0, float m1, float l0,
                                                  float l1, float lse_l0, float lse_l1, const float* sv,
                                                  const float* __restrict__ mu, const u16* q, u16* out,
                                                  float* __restrict__ lse, int h, i64 pitch, int tokens, int q_first,
                                                  float softmax_scale, u8* stage) {
  const int t = lane & 3, g = lane >> 2;
  u8* lane_stage = stage + g * kOutPitch + 4 * t;
  epilogue_rows<HD, true, true>(o, row0, end, t, m0, m1, l0, l1, lse_l0, lse_l1, sv, mu, q, lse, h, pitch, tokens,
                                q_first, softmax_scale, [&](int half, int ct, u32 word) {
                            *reinterpret_cast<u32*>(lane_stage + half * 8 * kOutPitch + 16 * ct) = word;
                          });
  __syncwarp();
  const int first = row0 - g;  // the warp's first row
  if ((reinterpret_cast<unsigned long long>(out) & 15) == 0)
    store_staged_rows<true>(stage, out, first, end, h, pitch, lane);
  else
    store_staged_rows<false>(stage, out, first, end, h, pitch, lane);
  __syncwarp();  // the warp's next epilogue writes the stage again
}

// The rows' sums, then out and the lse. O divides by the tensor core's sum of the rounded P
// (lt, biased by 2^8 like P), except in a one-block tile, whose P is on the reference's grid and
// whose l is the FP32 sum of the unrounded P (shares of each lane: row_sums). The exact-l build
// (the build for a call that wants the lse) also keeps that FP32 sum in the stage loop, for the
// lse alone, which the contract defines on the unrounded sum: O still divides by lt, so out keeps
// its bits. Exact scalings by 1/256.
__device__ __forceinline__ void finish_tile(float (&o)[64], const Args& p, float& m0, float& m1, float& l0, float& l1,
                                            float& lt0, float& lt1, const Tile& tl, bool one_block,
                                            int lane, i64 pitch, const TileInfo& info, u8* stage) {
  const int h = info.row[3], seg = info.row[4];  // read again here: kept across the tile, one was spilled
  const bool tensor_l = !one_block;
  if (!tensor_l || (kExactL && p.lse != nullptr)) row_sums(l0, l1);
  const float o_l0 = tensor_l ? lt0 * (1.f / 256.f) : l0 * (1.f / 256.f);
  const float o_l1 = tensor_l ? lt1 * (1.f / 256.f) : l1 * (1.f / 256.f);
  const float lse_l0 = tensor_l && !kExactL ? o_l0 : l0 * (1.f / 256.f);
  const float lse_l1 = tensor_l && !kExactL ? o_l1 : l1 * (1.f / 256.f);
  write_rows_staged([&](int ct, int i) { return o[4 * ct + i]; }, tl.row0, tl.end, lane, m0, m1, o_l0, o_l1,
                    lse_l0, lse_l1, info.s_v, p.mu + ((i64)seg * p.heads + h) * HD, p.q, p.out, p.lse, h, pitch,
                    p.tokens, info.q_first, p.softmax_scale, stage);
}
