// What both MLP GEMM families (mlp_fp8.cu: mma.sync; mlp_fp8_sm90a.cu: wgmma) share: the
// persistent tile walk, the IEEE SiLU (mlp_fp8.cu's; the wgmma family takes the special-function
// unit's), FC1's column order and the y quantization's arithmetic (its codes: fp8_common.cuh's
// e4m3x4_from_bf16x4), whose one definition keeps y_q and y_scale bitwise equal between the
// families. (The epilogues' few lines stay in each kernel: as helpers they compiled to other
// instruction schedules.) Needs BM and GROUP_M from the including source (-D constants in
// mlp_fp8.cu, constexprs in mlp_fp8_sm90a.cu).
#pragma once
#include "fp8_common.cuh"

// The tile at position `tile` of the persistent walk: bands of GROUP_M m-tiles, m fastest inside
// a band, so that the tiles in flight share their operands in L2 (and, in the mma.sync FC2, the
// first tiles need the first rows of y that the producers quantize first).
__device__ __forceinline__ void tile_origin(int tile, int m_tiles, int n_tiles, int tile_n, int& m0, int& n0) {
  const int band = tile / (GROUP_M * n_tiles), first_m = band * GROUP_M;
  const int band_m = min(GROUP_M, m_tiles - first_m);
  const int in_band = tile - band * GROUP_M * n_tiles;
  m0 = (first_m + in_band % band_m) * BM;
  n0 = (in_band / band_m) * tile_n;
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

// The y column of prepacked FC1 gate column pg (8 gate rows, then their 8 up rows).
__device__ __forceinline__ int fc1_logical_column(int pg) { return (pg / 16) * 8 + (pg % 8); }

