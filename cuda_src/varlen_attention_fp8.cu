// minimax_h3_varlen_attention_fp8: non-causal packed-varlen attention on e4m3 operands
// (docs/spec.md, Attention). Inputs come from the quantization passes
// (h3kernels/varlen_attention_fp8_quant.py):
//   q8, k8  e4m3 [tokens, heads, 128]     s_q f32 [tokens, heads]
//   s_k     f32 [key blocks, heads]       (128-key blocks from each segment's start)
//   v8t     e4m3 [heads, 128, v_pitch]    V transposed: channel rows, keys contiguous; segment
//           seg starts at column 128 x its first key block, its tail up to the next multiple of
//           128 is zero, and inside every 16-key group the keys are stored permuted (see 'Why the V
//           pass permutes keys' below; varlen_attention_fp8_quant.v_key_at)
//   s_v     f32 [segments, heads, 128]
// Softmax: one pass with the usual online max and O rescaling. P is quantized against each
// block's running max, which rounds differently from the reference in every block before the
// row's maximum: a numpy emulation puts that at rel L2 0.018 (200 keys) to 0.025 (4096 keys)
// against the reference on randn inputs, while its error against float64 attention stays the
// reference's own (the bound in h3kernels/testing/checks.py).
// A persistent grid walks the plan's work tiles (start, len, first query, head, segment, query
// end, first key block), longest segments first. A tile is 128 queries of one head: 8 warps of
// 16 query rows. Keys stream through a STAGES-deep cp.async ring of BKV-key blocks (K rows,
// then V^T rows).
//
// Per block a warp computes S = q8 . k8^T on mma m16n8k32 (Q as A fragments, K rows are the
// "col" B operand as stored), scales it to log2 units (s_q * s_k * softmax_scale * log2 e),
// masks keys past the segment's end, and feeds P = e4m3(256 * 2^(S - m)) straight from the S
// accumulators into the A operand of O += P . V; l sums the unquantized 2^(S - m).
// tests/test_varlen_attention_fp8.py emulates this file lane by lane in numpy.
// With lse non-null, each written row's log-sum-exp of the true scores goes to lse [heads, tokens]
// (row_lse and write_rows, varlen_attention_fp8_common.cuh): what merging partial attentions over
// several GPUs needs. out and q carry no __restrict__: out may alias q, which the epilogue reads.
#include "varlen_attention_fp8_common.cuh"

// The tile and thread constants come from h3kernels/_launch/varlen_attention_fp8.py (NVRTC -D),
// which explains each: BQ, BKV, KSB, HD, STAGES, THREADS, TILE_INTS, and the per-arch choices
// Q_IN_REGS and SKIP_SETTLED_RESCALE.
#if !defined(BQ) || !defined(BKV) || !defined(KSB) || !defined(HD) || !defined(STAGES) || !defined(THREADS) || \
    !defined(TILE_INTS) || !defined(Q_IN_REGS) || !defined(SKIP_SETTLED_RESCALE) || !defined(H3_MMA_FORM)
#error "varlen_attention_fp8.cu is built with the -D constants of h3kernels/_launch/varlen_attention_fp8.py"
#endif

#define Q_BYTES (BQ * HD)
#define K_BYTES (BKV * HD)
#define V_BYTES (HD * BKV)
#define STAGE_BYTES (K_BYTES + V_BYTES)
#define SMEM_BYTES (Q_BYTES + STAGES * STAGE_BYTES)

// Why the V pass permutes keys: the thread that ends up holding the A fragment of P
// must be the one that holds those probabilities in the S accumulator, or P would need
// shuffles. In the C layout lane (g, t) holds, per n8 tile of keys, keys 2t and 2t+1 of rows
// g and g+8. In the A layout (k32) its register r holds k-columns 4t..4t+3 (+16 for r >= 2) of
// row g (+8 for odd r). So a lane packs, per 16-key group, its keys {2t, 2t+1} of n8 tile 2u
// and {2t, 2t+1} of tile 2u+1, i.e. keys {2t, 2t+1, 8+2t, 9+2t}, into the A k-columns
// 4t..4t+3. The mma sums over k, so it is right as long as B's k-row 4t+b holds the same key:
// storage position p = 4t + b of each 16-key group holds key 2t + (b & 1) + 8 * (b >> 1).
// The lane then loads B with the same ldmatrix as any K-major operand.

// 64-byte rows (V^T, BKV keys): two rows share a 128-byte bank line, so rows 2i and 2i+1 take
// the line's two halves and (row / 2) % 4 permutes the four chunks within a half.
__device__ __forceinline__ u32 swz64(int row, int chunk) { return row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4); }

// Key block j of the tile's segment into a ring stage: BKV K rows (keys past the segment's end
// zero-filled: they may lie past the last token) and the 128 V^T rows of the same keys (the
// V pass zero-pads each segment to a multiple of 128 keys, so those bytes always exist).
__device__ __forceinline__ void load_kv(u32 stage, const u8* __restrict__ kseg, const u8* __restrict__ vseg,
                                        i64 k_pitch, i64 v_pitch, int j, int len) {
#pragma unroll
  for (int i = 0; i < (BKV * HD / 16) / THREADS; ++i) {
    const int idx = threadIdx.x + i * THREADS, row = idx >> 3, chunk = idx & 7;
    const int key = j * BKV + row;
    const bool ok = key < len;
    cp_async_16(stage + swz128(row, chunk), kseg + (ok ? key * k_pitch : 0) + chunk * 16, ok ? 16 : 0);
  }
#pragma unroll
  for (int i = 0; i < (HD * BKV / 16) / THREADS; ++i) {
    const int idx = threadIdx.x + i * THREADS, row = idx >> 2, chunk = idx & 3;
    cp_async_16(stage + K_BYTES + swz64(row, chunk), vseg + row * v_pitch + j * BKV + chunk * 16, 16);
  }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    h3_varlen_attention_fp8(const int* __restrict__ tiles, int n_tiles, const u8* __restrict__ q8,
                            const float* __restrict__ s_q, const u8* __restrict__ k8, const float* __restrict__ s_k,
                            const u8* __restrict__ v8t, const float* __restrict__ s_v,
                            u16* out, int heads, i64 v_pitch, float scale_log2,
                            float* __restrict__ lse, const u16* q, const float* __restrict__ mu,
                            int tokens, float softmax_scale, const int* __restrict__ q_bounds) {
  extern __shared__ __align__(128) u8 smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int lq = lane >> 3, lr = lane & 7;  // ldmatrix: lane gives row lr of matrix lq
  const u32 q_smem = smem_u32(smem), ring = q_smem + Q_BYTES;
  const i64 pitch = (i64)heads * HD;  // elements between consecutive tokens of q8, k8, out

  for (int tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    const int* w = tiles + (i64)tile * TILE_INTS;
    // the segment's queries end at w[5]: start + len when queries and keys are the same tokens,
    // elsewhere when this rank's queries meet another rank's keys (the ring); its V^T columns
    // start at key block w[6]
    const int start = w[0], len = w[1], q0 = w[2], h = w[3], seg = w[4], end = w[5], kb0 = w[6];
    const int n_blocks = (len + BKV - 1) / BKV;
    const int n_iter = n_blocks;
    const u8* kseg = k8 + (i64)start * pitch + h * HD;
    const u8* vseg = v8t + (i64)h * HD * v_pitch + (i64)kb0 * KSB;

    // Prologue: the Q tile rides in the first cp.async group with block 0.
#pragma unroll
    for (int i = 0; i < (BQ * HD / 16) / THREADS; ++i) {
      const int idx = threadIdx.x + i * THREADS, row = idx >> 3, chunk = idx & 7;
      const int tok = q0 + row;
      const bool ok = tok < end;
      cp_async_16(q_smem + swz128(row, chunk), q8 + (ok ? tok * pitch + h * HD : 0) + chunk * 16, ok ? 16 : 0);
    }
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < n_iter)
        load_kv(ring + s * STAGE_BYTES, kseg, vseg, pitch, v_pitch, s % n_blocks, len);
      cp_async_commit();
    }

    const int row0 = q0 + warp * 16 + g, row1 = row0 + 8;  // this lane's two query rows
    // log2(e) * softmax_scale * s_q per row; rows past the segment give S = 0 and are not written
    const float c0 = row0 < end ? s_q[(i64)row0 * heads + h] * scale_log2 : 0.f;
    const float c1 = row1 < end ? s_q[(i64)row1 * heads + h] * scale_log2 : 0.f;

    // A fragments of this warp's 16 query rows, k32 step ks: ldmatrix matrices (rows 0-7 | 8-15)
    // x (chunk 2ks | 2ks+1) are registers 0..3 of the A layout. Chunk 2ks + x of a row is chunk
    // x with bit ks << 5 flipped in the swizzled offset.
    const u32 q_frag = swz128(warp * 16 + lr + 8 * (lq & 1), lq >> 1);
#if Q_IN_REGS
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    u32 qf[HD / 32][4];
#pragma unroll
    for (int ks = 0; ks < HD / 32; ++ks)
      ldmatrix_x4(q_smem + (q_frag ^ (ks << 5)), qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3]);
#endif

    float o[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; ++i)
#pragma unroll
      for (int r = 0; r < 4; ++r) o[i][r] = 0.f;
    float m0 = neg_inf(), m1 = neg_inf(), l0 = 0.f, l1 = 0.f;  // l: this lane's share of the row sum
    // s_k of each iteration's block is loaded one iteration ahead: read where it is used, the load's
    // latency stalled every warp of the CTA between the QK^T and the softmax of every block.
    const float* sk_col = s_k + (i64)kb0 * heads + h;
    float sk_next = sk_col[0];

#pragma unroll 1
    for (int it = 0; it < n_iter; ++it) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();  // iteration it's block is visible to all; the stage of iteration it - 1 is free
      const int next = it + STAGES - 1;
      if (next < n_iter)
        load_kv(ring + (next % STAGES) * STAGE_BYTES, kseg, vseg, pitch, v_pitch, next % n_blocks, len);
      cp_async_commit();
      const int j = it;
      const float sk = sk_next;
      if (it + 1 < n_iter) sk_next = sk_col[(i64)((it + 1) * BKV / KSB) * heads];

      const u32 k_base = ring + (it % STAGES) * STAGE_BYTES, v_base = k_base + K_BYTES;
      float s[BKV / 8][4];
#pragma unroll
      for (int i = 0; i < BKV / 8; ++i)
#pragma unroll
        for (int r = 0; r < 4; ++r) s[i][r] = 0.f;
#if Q_IN_REGS
#pragma unroll
#else
#pragma unroll 1
#endif
      for (int ks = 0; ks < HD / 32; ++ks) {
#if Q_IN_REGS
        const u32(&qa)[4] = qf[ks];
#else
        u32 qa[4];
        ldmatrix_x4(q_smem + (q_frag ^ (ks << 5)), qa[0], qa[1], qa[2], qa[3]);
#endif
        s_step_mma_sync<BKV>(s, qa, k_base, ks, lane);
      }

      // S in log2 units; keys past the segment's end -> -inf (P = 0 there)
      const float cb0 = c0 * sk, cb1 = c1 * sk;
      const int valid = len - j * BKV;
      float mx0 = m0, mx1 = m1;
#pragma unroll
      for (int nt = 0; nt < BKV / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          s[nt][e] *= cb0;
          s[nt][2 + e] *= cb1;
        }
      }
      if (valid < BKV) {  // warp-uniform: only a segment's last block has keys to mask
#pragma unroll
        for (int nt = 0; nt < BKV / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if (nt * 8 + 2 * t + e >= valid) s[nt][e] = s[nt][2 + e] = neg_inf();
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < BKV / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          mx0 = fmaxf(mx0, s[nt][e]);
          mx1 = fmaxf(mx1, s[nt][2 + e]);
        }
      }
      row_maxima(mx0, mx1);
      // Block 0 always has key 0, so mx is finite from here on and alpha = 2^-inf = 0 at first.
      const float a0 = ex2(m0 - mx0), a1 = ex2(m1 - mx1);
      m0 = mx0;
      m1 = mx1;
      l0 *= a0;
      l1 *= a1;
      // once the maxima settle, alpha = 1 in the whole warp: skip the multiplications
      if (!SKIP_SETTLED_RESCALE || __any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) {
#pragma unroll
        for (int i = 0; i < HD / 8; ++i) {
          o[i][0] *= a0;
          o[i][1] *= a0;
          o[i][2] *= a1;
          o[i][3] *= a1;
        }
      }
#pragma unroll
      for (int nt = 0; nt < BKV / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          s[nt][e] = ex2(s[nt][e] - m0);
          s[nt][2 + e] = ex2(s[nt][2 + e] - m1);
          l0 += s[nt][e];
          l1 += s[nt][2 + e];
        }
      }

      // All of P is packed before the PV mmas, so the 32 S registers die before O is touched.
      u32 pa[BKV / 32][4];
#pragma unroll
      for (int kk = 0; kk < BKV / 32; ++kk) {
        const float(*p)[4] = s + 4 * kk;  // the four n8 tiles of keys 32kk .. 32kk + 31
        pa[kk][0] = pack_p(p[0][0], p[0][1], p[1][0], p[1][1]);
        pa[kk][1] = pack_p(p[0][2], p[0][3], p[1][2], p[1][3]);
        pa[kk][2] = pack_p(p[2][0], p[2][1], p[3][0], p[3][1]);
        pa[kk][3] = pack_p(p[2][2], p[2][3], p[3][2], p[3][3]);
      }
#pragma unroll
      for (int kk = 0; kk < BKV / 32; ++kk) {
#pragma unroll
        for (int cp = 0; cp < HD / 16; ++cp) {
          u32 b[2][2];
          ldmatrix_x4(v_base + swz64(cp * 16 + lr + 8 * (lq >> 1), 2 * kk + (lq & 1)), b[0][0], b[0][1], b[1][0],
                      b[1][1]);
          mma_e4m3_16832(o[2 * cp], pa[kk], b[0]);
          mma_e4m3_16832(o[2 * cp + 1], pa[kk], b[1]);
        }
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // the ring and the Q tile are reused by the next tile

    row_sums(l0, l1);
    write_rows<HD>([&](int ct, int r) { return o[ct][r]; }, row0, end, t, m0, m1, l0, l1, l0, l1, s_v, mu, q, out,
                   lse, seg, h, heads, pitch, tokens, q_bounds[seg], softmax_scale);
  }
}
