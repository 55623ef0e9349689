// The geometry of varlen_attention_fp8_sm90a.cu, its shared memory and barriers, and its one
// parameter struct (mirrored field by field in h3kernels/_launch/varlen_attention_fp8_sm90a.py).
#pragma once
#include "hopper_common.cuh"
#include "varlen_attention_fp8_common.cuh"

// From AttentionBuild.defines() (h3kernels/_launch/varlen_attention_fp8_sm90a.py), so that the
// host's tile, box and shared-memory sizes are the kernel's; EXACT_L is what differs between builds.
#if !defined(BQ) || !defined(BKV) || !defined(KSB) || !defined(HD) || !defined(RING_STAGES) || !defined(TILE_INTS) || \
    !defined(EXACT_L) || !defined(H3_MMA_FORM)
#error "varlen_attention_fp8_sm90a.cu is built with the -D constants of h3kernels/_launch/varlen_attention_fp8_sm90a.py"
#endif

constexpr int kConsumers = BQ / 64;       // softmax warpgroups of 64 query rows each
constexpr int kThreads = 128 * (1 + kConsumers);  // the loading warpgroup and the consumers
constexpr int kConsumerWarps = 4 * kConsumers;
constexpr int kBlockKeys = BKV;           // keys of one P fragment pair: half a stage
constexpr int kStageKeys = KSB;           // keys per ring stage: one K scale block, one TMA box of K and of V^T
constexpr int kStages = RING_STAGES;
constexpr int kQBytes = BQ * HD;          // the e4m3 Q tile the S wgmmas read
constexpr int kQStagedBytes = BQ * 2 * HD;  // the bf16 Q tile TMA stages for the consumers to quantize
constexpr int kKBytes = kStageKeys * HD;
constexpr int kStageBytes = 2 * kKBytes;  // K rows, then V^T rows (128 channels x 128 keys)
constexpr int kOnesBytes = 1024;          // after the ring: e4m3 1.0 in every byte, the B operand of P . 1
constexpr int kOutPitch = 2 * HD + 16;    // bytes per row of a warp's out staging: the 16 bytes of
                                          // padding make the fragment's 4-byte stores free of bank conflicts
constexpr int kOutWarpBytes = 16 * kOutPitch;  // a consumer warp's 16 rows
constexpr int kOutStageBytes = kConsumerWarps * kOutWarpBytes;
constexpr int kProducerRegs = 24;         // setmaxnreg: what the TMA warpgroup keeps
constexpr int kConsumerRegs = 240;        // and each softmax warpgroup takes: O, the P V partial, S, P
constexpr int kChainStages = 8;           // stages (1024 keys) a P V partial runs on in the tensor core
constexpr bool kExactL = EXACT_L;         // also the FP32 sum of the unrounded P, for the lse
constexpr int kLoaderLanes = 32;          // the loading warp: lane 0 issues the TMA loads

static_assert(BQ == 128 && BKV == 64 && KSB == 128 && HD == 128,
              "two consumer warpgroups of 64 query rows, 64-key halves of 128-key stages, head dim 128");
static_assert(H3_MMA_FORM == 0, "the one-block S path uses the legacy e4m3 mma.sync (form 0)");
static_assert(kProducerRegs * 128 + kConsumers * kConsumerRegs * 128 <= 65536, "setmaxnreg within the SM's registers");
static_assert(kOnesBytes <= 4 * (kThreads - 128), "the consumer threads write the ones tile, a word each");
static_assert(TILE_INTS + 1 <= kLoaderLanes && HD == 4 * kLoaderLanes,
              "a tile's slot: a word a lane, then s_v four values a lane");

// The kernel's one __grid_constant__ parameter: the three tensor maps, then the mma.sync kernel's
// parameters in its order less q8, s_q (this kernel quantizes Q itself), k8, v8t and v_pitch
// (which the maps carry). lse null: not wanted.
struct AttentionParams {
  TmaMap map_q, map_k, map_v;  // q (bf16) [tokens, heads * 256 bytes], k8 [tokens, heads * 128], v8t [heads * 128, v_pitch]
  const int* tiles;            // per tile: start, len, first query, head, segment, query end, first key block
  int n_tiles;
  const float* s_k;
  const float* s_v;
  u16* out;                    // may alias q
  int heads;
  float scale_log2;            // softmax_scale * log2(e)
  float* lse;
  const u16* q;
  const float* mu;
  int tokens;
  float softmax_scale;
  const int* q_bounds;         // each segment's query rows
};

// The consumers' fields of AttentionParams, as values read once at the kernel's start (the plan's
// rows, s_k, s_v and q_bounds reach them through the loading warp's shared memory). Read from the
// parameter where used instead, the fields were read again after every asm that clobbers memory:
// the tile loop lost its hoisted tests (out's alignment, lse's presence) and the exact-l build spilled.
struct Args {
  int n_tiles;
  u16* out;
  int heads;
  float scale_log2;
  float* lse;
  const u16* q;
  const float* mu;
  int tokens;
  float softmax_scale;
  __device__ __forceinline__ explicit Args(const AttentionParams& p)
      : n_tiles(p.n_tiles), out(p.out), heads(p.heads), scale_log2(p.scale_log2), lse(p.lse), q(p.q), mu(p.mu),
        tokens(p.tokens), softmax_scale(p.softmax_scale) {}
};

// What the loading warp reads of a work tile for the consumers, beside the tile's staged Q: the
// plan's row, its segment's first query row and the s_v of its segment and head, each an L2
// trip on the consumers' path otherwise (at a tile's start and in its epilogue). Two slots, by
// the parity of the CTA's tile: the next tile's is written while this one's epilogue still reads
// its s_v. Lane i of the loading warp writes word i of the first TILE_INTS + 1 (`words`).
struct TileInfo {
  union {
    struct {
      int row[TILE_INTS];  // the plan's columns
      int q_first;         // the segment's first query row (the lse's stand-in row for rows past it)
    };
    int words[TILE_INTS + 1];
  };
  float s_v[HD];
};

// Dynamic shared memory, from the first 1024-byte boundary (the 128B swizzle's tiles): the e4m3
// Q tile, the ring of stages, the ones tile, the consumer warps' out staging, the staged bf16 Q;
// and in static shared memory the tile slots and each ring stage's K scale.
struct SharedMap {
  u32 q, ring, ones, q_staged;  // shared addresses
  u8* out_stage;
  TileInfo* info;   // [2]
  float* stage_sk;  // [kStages]: s_k of the stage's key block and head, written with its loads
  __device__ __forceinline__ u32 stage(int i) const { return ring + i * kStageBytes; }
};

// full[s]: the stage's TMA bytes landed and its s_k written (one arrival, the producer's, plus
// the bytes); empty[s]: every consumer warp is done with it (kConsumerWarps arrivals); q_full /
// q_empty likewise for the staged bf16 Q and the tile's slot, which the loading warp's 32 lanes
// fill (32 arrivals) and every consumer thread releases once it has read the Q (not after the
// tile's last S).
struct Barriers {
  u64* full;
  u64* empty;
  u64* q_full;
  u64* q_empty;
};
