// minimax_h3_varlen_attention_fp8 on Hopper (sm_90a, fp8_mma_form 3): the function of
// varlen_attention_fp8.cu on wgmma with TMA loads. Same inputs (the quantization passes' k8, s_k,
// v8t, s_v, mu in the workspace) but Q in bf16, quantized here per tile with the Q pass's
// arithmetic (varlen_attention_fp8_sm90a_q.cuh: the same q8 and s_q bits), and the same plan of
// work tiles (start, len, first query, head, segment, query end, first key block), walked by a
// persistent grid of one CTA per SM.
// docs/kernels/attention_sm90.md describes the kernel for a maintainer.
//
// Numerics (docs/spec.md, Attention): S = q8 . k8^T scaled to log2 units (s_q * s_k *
// softmax_scale * log2 e), keys past the segment's end masked to -inf, P = e4m3(2^(S - m + 8)),
// O = sum of P V rescaled to the running max m, out = bf16(O * s_v / (256 l)) and the lse
// (epilogue_rows, varlen_attention_fp8_common.cuh). Here, beyond a segment of one 64-key block:
// m is updated once per 128-key stage; the scaling joins the subtraction of m in one FFMA with a
// margin (block_exp); P V runs on in the tensor core for 1024 keys before joining the FP32 O; l
// is the tensor core's sum of the rounded P (the exact-l build also sums the unrounded P in FP32
// for the lse). A segment of one 64-key block computes S on mma.sync (one_block_tile).
//
// The CTA: three warpgroups. Warpgroup 0 gives its registers up and one of its warps loads
// (produce): per tile a slot of what the consumers read of it (the plan's row, s_v), the tile's
// bf16 Q (128 query rows of one head) and a 4-deep ring of 128-key stages, each a K box, a V^T
// box and its K scale. Warpgroups 1 and 2 each own 64 query rows (consume): they quantize them
// into the e4m3 Q tile (quantize_q_rows), release the staged rows (so the next tile's Q loads
// under this tile), and run the stage loop (stage_loop): per stage, S in one m64n128 wgmma group
// issued a stage ahead, the stage's softmax, the P V of its two 64-key halves, then the epilogue
// (finish_tile) through a shared-memory staging of out.
//
// Operands: Q and K are K-major (head dim contiguous, one 128-byte swizzled row), so S = Q K^T
// reads both from shared memory. P V takes P from registers (the A fragment of a warp is the
// m16n8k32 mma.sync one, and the S accumulator of a warp is the m16n8 C layout per n8 tile) and
// V^T from shared memory (keys contiguous). The V pass stores the keys of every 16-key group
// permuted so that a lane's S values are its A fragment as they stand (varlen_attention_fp8.cu,
// 'Why the V pass permutes keys'); the wgmma B operand reads storage order as ldmatrix does, so
// the same v8t serves both kernels.
//
// Invariants: every path issues the same wgmmas (stand-ins where there is nothing to compute):
// one issued under a condition while others were in flight made ptxas serialize them all. A
// wgmma reads its register A fragment (P) until a wait covers it: keep_p holds P's registers
// live until then (h3kernels/testing/ptx_checks.py checks the PTX). Rows past the segment's end:
// their Q rows (the next segment's, or TMA zeros past the last token) give finite S, are scaled
// by 0 and never written. K rows past the end are masked; V^T columns past the end are the V
// pass's zero padding (each segment padded to 128 keys), so P V stays finite. out and q carry
// no __restrict__: out may alias q, which the epilogue reads.
#include "varlen_attention_fp8_sm90a_consumer.cuh"
#include "varlen_attention_fp8_sm90a_producer.cuh"

extern "C" __global__ void __launch_bounds__(kThreads, 1)
    h3_varlen_attention_fp8_wgmma(const __grid_constant__ AttentionParams params) {
  const Args p(params);
  extern __shared__ u8 smem_raw[];
  __shared__ __align__(8) u64 full[kStages], empty[kStages], q_full, q_empty;
  __shared__ __align__(16) TileInfo info[2];
  __shared__ float stage_sk[kStages];
  const u32 base = (smem_u32(smem_raw) + 1023u) & ~1023u;  // the 128B swizzle needs 1024-byte tiles
  SharedMap sm;
  sm.q = base;
  sm.ring = base + kQBytes;
  sm.ones = sm.ring + kStages * kStageBytes;
  sm.out_stage = smem_raw + (sm.ones + kOnesBytes - smem_u32(smem_raw));
  sm.q_staged = sm.ones + kOnesBytes + kOutStageBytes;
  sm.info = info;
  sm.stage_sk = stage_sk;
  const Barriers bar{full, empty, &q_full, &q_empty};
  const int wg = threadIdx.x >> 7;
  // the first kOnesBytes / 4 consumer threads, a word each
  if (threadIdx.x >= 128 && threadIdx.x < 128 + kOnesBytes / 4) {
    *(u32*)(smem_raw + (sm.ones - smem_u32(smem_raw)) + 4 * (threadIdx.x - 128)) = 0x38383838u;  // e4m3 1.0
    fence_proxy_async_shared();
  }
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumerWarps);
    }
    mbar_init(&q_full, kLoaderLanes);
    mbar_init(&q_empty, 128 * kConsumers);
    mbar_init_fence();
  }
  __syncthreads();
  if (wg == 0) {
    regs_dealloc<kProducerRegs>();
    if (threadIdx.x < kLoaderLanes) produce(params, sm, bar, threadIdx.x);
  } else {
    regs_alloc<kConsumerRegs>();
    consume(p, sm, bar, wg - 1);
  }
}
