// minimax_h3_varlen_attention_fp8 on Hopper (sm_90a, fp8_mma_form 3): the function of
// varlen_attention_fp8.cu, block for block, on wgmma with TMA loads. Same inputs (the
// quantization passes' q8, s_q, k8, s_k, v8t, s_v, mu in the workspace) and the same plan of
// work tiles (start, len, first query, head, segment), walked by a persistent grid.
//
// Numerics, as varlen_attention_fp8.cu: keys in blocks of BKV = 64 from the segment's start; per
// block S = q8 . k8^T scaled to log2 units (s_q * s_k * softmax_scale * log2 e), keys past the
// segment's end masked to -inf, the running max updated, P = e4m3(256 * 2^(S - m)), l summing
// the unquantized 2^(S - m), O = O * 2^(m_old - m) + P . V; at the end out = bf16(O * s_v /
// (256 l)) and lse (write_rows, varlen_attention_fp8_common.cuh).
//
// The CTA: three warpgroups. Warpgroup 0 gives its registers up and one of its threads issues
// the TMA loads: the tile's Q (128 rows x 128 bytes, one 128B-swizzled box of the q8 map over
// [tokens, heads * 128]) and a STAGES-deep ring of 128-key stages, each a K box (128 key rows of
// the k8 map) and a V^T box (128 channel rows x 128 keys of the v8t map over [heads * 128,
// v_pitch]). Warpgroups 1 and 2 each own 64 query rows and run the softmax loop over the two
// 64-key blocks of every stage. Barriers: full[s] (TMA bytes landed), empty[s] (all 8 consumer
// warps done with the stage), q_full / q_empty likewise for the Q tile.
//
// Operands: Q and K are K-major (head dim contiguous, exactly one 128-byte swizzled row), so
// S = Q K^T is wgmma m64n64k32 from shared memory in 4 k32 steps. P V takes P from registers
// (the A fragment of a warp is the m16n8k32 mma.sync one, and the S accumulator of a warp is the
// m16n8 C layout per n8 tile) and V^T from shared memory (keys contiguous: K-major). The V pass
// stores the keys of every 16-key group permuted so that a lane's S values are its A fragment
// as they stand (varlen_attention_fp8.cu, 'Why the V pass permutes keys'); the wgmma B
// operand reads storage order like ldmatrix does, so the same v8t serves both kernels.
//
// Accumulation: the e4m3 wgmma adds with about 14 bits below the largest magnitude
// (docs/hopper.md). S sums the 128 products of a row and key inside the tensor core (one
// head dimension, as the MLP's 128-wide K slices); P V of each 64-key block goes to a zeroed
// 64-register partial (2 k32 steps), added to the FP32 O in registers with the rescale
// (O = O * alpha + partial), so no more than 64 keys meet inside the tensor core.
//
// Rows past the segment's end: their Q rows (the next segment's, or TMA zeros past the last
// token) give finite S, are scaled by 0 and never written. K rows past the end are masked; V^T
// columns past the end are the V pass's zero padding (each segment padded to 128 keys), so P V
// stays finite. out and q carry no __restrict__: out may alias q, which the epilogue reads.
#include "hopper_common.cuh"
#include "varlen_attention_fp8_common.cuh"

// From h3kernels/_launch/varlen_attention_fp8_sm90a.py (NVRTC -D), which explains each value.
#if !defined(BQ) || !defined(BKV) || !defined(KSB) || !defined(HD) || !defined(STAGES) || !defined(TILE_INTS) || \
    !defined(PRODUCER_REGS) || !defined(CONSUMER_REGS)
#error "varlen_attention_fp8_sm90a.cu is built with the -D constants of h3kernels/_launch/varlen_attention_fp8_sm90a.py"
#endif
#if BQ != 128 || BKV != 64 || KSB != 128 || HD != 128
#error "the warpgroup roles below assume 128-query tiles, 64-key blocks, 128-key stages and head dim 128"
#endif

// Measurement build (bench/hopper_attention.py --debug, never the launch layer's): DBG_STORE 1
// writes the scaled and masked S of the first 128 keys of each row to out (key k in channel
// k, bf16) instead of O, DBG_STORE 2 the unrounded 256 * 2^(S - m), so that a wrong fragment
// layout shows itself element by element.
#ifdef DBG_STORE
#define DBG_KEYS(vals, it, hb)                                                                    \
  if ((it) == 0)                                                                                  \
    for (int i = 0; i < 32; ++i) {                                                                \
      const int row = (i & 2) ? row1 : row0, key = (hb) * BKV + 8 * (i >> 2) + 2 * t + (i & 1);   \
      if (row < end) out[(i64)row * pitch + h * HD + key] = bf16_from_f32((DBG_STORE == 2 ? 256.f : 1.f) * vals[i]); \
    }
#endif

#define THREADS 384             // 3 warpgroups
#define CONSUMER_WARPS 8
#define STAGE_KEYS KSB          // keys per ring stage: one K scale block, one TMA box of K and of V^T
#define Q_BYTES (BQ * HD)
#define K_BYTES (STAGE_KEYS * HD)
#define STAGE_BYTES (2 * K_BYTES)  // K rows, then V^T rows (128 channels x 128 keys)

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    h3_varlen_attention_fp8_wgmma(const __grid_constant__ TmaMap map_q, const __grid_constant__ TmaMap map_k,
                                  const __grid_constant__ TmaMap map_v, const int* __restrict__ tiles, int n_tiles,
                                  const int* __restrict__ block_offset, const float* __restrict__ s_q,
                                  const float* __restrict__ s_k, const float* __restrict__ s_v, u16* out, int heads,
                                  float scale_log2, float* __restrict__ lse, const u16* q,
                                  const float* __restrict__ mu, int tokens, float softmax_scale,
                                  const int* __restrict__ q_bounds) {
  extern __shared__ u8 smem_raw[];
  __shared__ __align__(8) u64 full[STAGES], empty[STAGES], q_full, q_empty;
  const u32 base = (smem_u32(smem_raw) + 1023u) & ~1023u;  // the 128B swizzle needs 1024-byte tiles
  const u32 q_smem = base, ring = base + Q_BYTES;
  const int wg = threadIdx.x >> 7;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], CONSUMER_WARPS);
    }
    mbar_init(&q_full, 1);
    mbar_init(&q_empty, CONSUMER_WARPS);
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    regs_dealloc<PRODUCER_REGS>();
    if (threadIdx.x == 0) {
      tma_prefetch_map(&map_q);
      tma_prefetch_map(&map_k);
      tma_prefetch_map(&map_v);
      int stage = 0;
      u32 phase = 0, q_phase = 0;
      for (int tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
        const int* w = tiles + (i64)tile * TILE_INTS;
        const int start = w[0], len = w[1], q0 = w[2], h = w[3], seg = w[4];
        const int kb0 = block_offset[seg];
        mbar_wait(&q_empty, q_phase ^ 1);  // the previous tile's last S is done
        q_phase ^= 1;
        mbar_arrive_expect_tx(&q_full, Q_BYTES);
        tma_load_2d(q_smem, &map_q, h * HD, q0, &q_full);
#pragma unroll 1
        for (int j = 0; j * STAGE_KEYS < len; ++j) {
          mbar_wait(&empty[stage], phase ^ 1);
          mbar_arrive_expect_tx(&full[stage], STAGE_BYTES);
          const u32 dst = ring + stage * STAGE_BYTES;
          tma_load_2d(dst, &map_k, h * HD, start + j * STAGE_KEYS, &full[stage]);
          tma_load_2d(dst + K_BYTES, &map_v, (kb0 + j) * KSB, h * HD, &full[stage]);
          if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    }
  } else {
    regs_alloc<CONSUMER_REGS>();
    const int consumer = wg - 1, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
    const int g = lane >> 2, t = lane & 3;
    const i64 pitch = (i64)heads * HD;  // elements between consecutive tokens of out and q
    int stage = 0;
    u32 phase = 0, q_phase = 0;
    float part[64];  // one 64-key block's P V (the first k32 step overwrites it)
#pragma unroll
    for (int i = 0; i < 64; ++i) part[i] = 0.f;
    for (int tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
      const int* w = tiles + (i64)tile * TILE_INTS;
      const int len = w[1], q0 = w[2], h = w[3], seg = w[4];
      const int end = q_bounds[seg + 1], kb0 = block_offset[seg];
      const int n_stages = (len + STAGE_KEYS - 1) / STAGE_KEYS, n_blocks = (len + BKV - 1) / BKV;
      const int row0 = q0 + 64 * consumer + 16 * warp + g, row1 = row0 + 8;  // this lane's two query rows
      // log2(e) * softmax_scale * s_q per row; rows past the segment give S = 0 and are not written
      const float c0 = row0 < end ? s_q[(i64)row0 * heads + h] * scale_log2 : 0.f;
      const float c1 = row1 < end ? s_q[(i64)row1 * heads + h] * scale_log2 : 0.f;
      const float* sk_col = s_k + (i64)kb0 * heads + h;
      float sk_next = sk_col[0];

      float o[64];  // O: row0 / row1, channel 8 (i / 4) + 2t + i % 2 (wgmma fragment layout)
#pragma unroll
      for (int i = 0; i < 64; ++i) o[i] = 0.f;
      float m0 = neg_inf(), m1 = neg_inf(), l0 = 0.f, l1 = 0.f;  // l: this lane's share of the row sum
      const u32 a_q = q_smem + consumer * 64 * HD;
      mbar_wait(&q_full, q_phase);
      q_phase ^= 1;

#pragma unroll 1
      for (int it = 0; it < n_stages; ++it) {
        const float sk = sk_next;
        if (it + 1 < n_stages) sk_next = sk_col[(i64)(it + 1) * heads];
        mbar_wait(&full[stage], phase);
        const u32 k_base = ring + stage * STAGE_BYTES, v_base = k_base + K_BYTES;
        const float cb0 = c0 * sk, cb1 = c1 * sk;
#pragma unroll 1
        for (int hb = 0; hb < STAGE_KEYS / BKV; ++hb) {
          const int j = it * (STAGE_KEYS / BKV) + hb;  // the 64-key block
          if (j >= n_blocks) break;  // CTA-uniform: a segment's last stage may hold one block
          float s[32];
          wgmma_fence();
#pragma unroll
          for (int k = 0; k < HD / 32; ++k)
            wgmma_m64n64k32_e4m3(s, wgmma_desc(a_q + 32 * k), wgmma_desc(k_base + hb * BKV * HD + 32 * k), k);
          wgmma_commit();
          wgmma_wait<0>();
#pragma unroll
          for (int i = 0; i < 32; ++i) fence_regs(s[i]);
          if (j == n_blocks - 1 && lane == 0) mbar_arrive(&q_empty);  // the tile's last read of Q

          // S in log2 units; keys past the segment's end -> -inf (P = 0 there)
          const int valid = len - j * BKV;
#pragma unroll
          for (int i = 0; i < 32; ++i) s[i] *= (i & 2) ? cb1 : cb0;
          if (valid < BKV) {  // CTA-uniform: only a segment's last block has keys to mask
#pragma unroll
            for (int i = 0; i < 32; ++i)
              if (8 * (i >> 2) + 2 * t + (i & 1) >= valid) s[i] = neg_inf();
          }
#if DBG_STORE == 1
          DBG_KEYS(s, it, hb)
#endif
          float mx0 = m0, mx1 = m1;
#pragma unroll
          for (int i = 0; i < 32; ++i) {
            if (i & 2)
              mx1 = fmaxf(mx1, s[i]);
            else
              mx0 = fmaxf(mx0, s[i]);
          }
#pragma unroll
          for (int x = 1; x < 4; x <<= 1) {  // the 4 lanes of a row
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
          }
          // Block 0 always has key 0, so mx is finite from here on and alpha = 2^-inf = 0 at first.
          const float a0 = ex2(m0 - mx0), a1 = ex2(m1 - mx1);
          m0 = mx0;
          m1 = mx1;
          l0 *= a0;
          l1 *= a1;
#pragma unroll
          for (int i = 0; i < 32; ++i) {
            s[i] = ex2(s[i] - ((i & 2) ? m1 : m0));
            if (i & 2)
              l1 += s[i];
            else
              l0 += s[i];
          }
#if DBG_STORE == 2
          DBG_KEYS(s, it, hb)
#endif
          // P as the A fragments of the two k32 steps: n8 tiles 4kk .. 4kk + 3 of keys 32kk ..
          // 32kk + 31, s[4 nt + r] being the mma.sync C register r of n8 tile nt
          u32 pa[BKV / 32][4];
#pragma unroll
          for (int kk = 0; kk < BKV / 32; ++kk) {
            const float* p = s + 16 * kk;
            pa[kk][0] = pack_p(p[0], p[1], p[4], p[5]);
            pa[kk][1] = pack_p(p[2], p[3], p[6], p[7]);
            pa[kk][2] = pack_p(p[8], p[9], p[12], p[13]);
            pa[kk][3] = pack_p(p[10], p[11], p[14], p[15]);
          }
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < BKV / 32; ++kk)
            wgmma_m64n128k32_e4m3_rs(part, pa[kk], wgmma_desc(v_base + hb * BKV + 32 * kk), kk);
          wgmma_commit();
          wgmma_wait<0>();
#pragma unroll
          for (int i = 0; i < 64; ++i) {
            fence_regs(part[i]);
            o[i] = fmaf(o[i], (i & 2) ? a1 : a0, part[i]);
          }
        }
        if (lane == 0) mbar_arrive(&empty[stage]);
        if (++stage == STAGES) {
          stage = 0;
          phase ^= 1;
        }
      }
#ifndef DBG_STORE
      write_rows<HD>([&](int ct, int r) { return o[4 * ct + r]; }, row0, end, t, m0, m1, l0, l1, s_v, mu, q, out,
                     lse, seg, h, heads, pitch, tokens, q_bounds[seg], softmax_scale);
#endif
    }
  }
}
