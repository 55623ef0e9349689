// What a consumer thread of varlen_attention_fp8_sm90a.cu knows of its work tile and carries
// through the tile's keys.
#pragma once
#include "varlen_attention_fp8_sm90a_layout.cuh"

struct Tile {
  int len;          // the segment's keys
  int end;          // the segment's query rows end here: rows at or past it are not written
  int n_stages;     // 128-key stages
  int row0, row1;   // this lane's two query rows (row1 = row0 + 8)
  float c0, c1;     // softmax_scale log2(e) s_q of each row (0 past the segment: S = 0 there)
};

// A lane's two rows pass between the tile's parts as separate values: O (o[64]: row0 / row1,
// channel 8 (i / 4) + 2t + i % 2, the wgmma fragment layout), the running maxima m0 / m1 in log2
// units, l0 / l1 the FP32 sums of the unrounded P (this lane's share) and lt0 / lt1 the tensor
// core's sums of the rounded P (the whole row in each lane). (Gathered in a struct, they cost the
// loop instructions and the exact-l build a spill.)

// The K scale of ring stage `index`, read by lane 0 alone (the lane that later releases the
// stage, so the read is ordered before the release in one thread) and shuffled to the warp.
__device__ __forceinline__ float stage_scale(const SharedMap& sm, int index, int lane) {
  return __shfl_sync(0xFFFFFFFFu, lane == 0 ? sm.stage_sk[index] : 0.f, 0);
}
