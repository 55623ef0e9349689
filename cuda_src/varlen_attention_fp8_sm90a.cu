// minimax_h3_varlen_attention_fp8 on Hopper (sm_90a, fp8_mma_form 3): the function of
// varlen_attention_fp8.cu, block for block, on wgmma with TMA loads. Same inputs (the
// quantization passes' q8, s_q, k8, s_k, v8t, s_v, mu in the workspace) and the same plan of
// work tiles (start, len, first query, head, segment), walked by a persistent grid.
//
// Numerics, as varlen_attention_fp8.cu: keys in blocks of BKV = 64 from the segment's start; per
// block S = q8 . k8^T scaled to log2 units (s_q * s_k * softmax_scale * log2 e), keys past the
// segment's end masked to -inf, the running max updated, P = e4m3(256 * 2^(S - m)), l summing
// the unquantized 2^(S - m), O = O * 2^(m_old - m) + P . V; at the end out = bf16(O * s_v /
// (256 l)) and lse (write_rows, varlen_attention_fp8_common.cuh). Except, by default, beyond a
// segment's first block: l sums the rounded P in the tensor core (L_IN_CORE), m enters with a
// margin (FOLD_SCALE) and is updated once per 128-key stage (STAGE_MAX), so that a stage's two
// blocks take one max; see their comments below and in the launch layer.
//
// The CTA: 1 + CONSUMERS warpgroups (CONSUMERS 2; 3 a measurement build). Warpgroup 0 gives its
// registers up and one of its threads issues the TMA loads: the tile's Q (BQ = 64 CONSUMERS
// rows x 128 bytes, one 128B-swizzled box of the q8 map over [tokens, heads * 128]) and a
// STAGES-deep ring of 128-key stages, each a K box (128 key rows of the k8 map) and a V^T box
// (128 channel rows x 128 keys of the v8t map over [heads * 128, v_pitch]). The consumer
// warpgroups each own 64 query rows and run the softmax loop over the two 64-key blocks of every
// stage. Barriers: full[s] (TMA bytes landed), empty[s] (all CONSUMER_WARPS consumer warps done
// with the stage), q_full / q_empty likewise for the Q tile.
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
// head dimension, as the MLP's 128-wide K slices; S_SPLIT 2 / 4 add 64- / 32-channel chains in
// FP32 instead), except in a segment of a single 64-key block (ONE_BLOCK_SYNC): there the
// reference's P grid holds the output to 0.005, which those sums break on some sets, so S comes
// from mma.sync, form 0's sums. P V goes to a 64-register partial in the tensor core, added to
// the FP32 O in registers: by default the partial runs on over PROMOTE_STAGES stages (1024
// keys; rescaled in registers where a warp's max moved) before O takes it, so no more than 1024
// keys meet inside the tensor core; with STAGE_MAX 0 each 64-key block's partial is zeroed and
// added with the rescale (O = O * alpha + partial): 64 keys.
//
// Schedules (launch constants): S128 1 / 2 (1 the default) compute a whole stage's S in one
// m64n128 group and pipeline the stage's wgmmas; S128 0 takes each 64-key block's S, softmax and
// P V in turn, and with OVERLAP 1 runs block j's softmax under block j - 1's P V; PINGPONG (with
// OVERLAP or S128) makes the two consumer warpgroups take turns issuing. All keep the block
// loop's arithmetic and order (with STAGE_MAX 0; the stage max lives in the S128 1 loop). The
// pipelined loops issue every wgmma on every path (stand-ins where there is nothing to
// compute): one issued under a condition had ptxas serialize them all.
// A wgmma reads its register A fragment (P) until a wait covers it: keep_p holds P's registers
// live until then (h3kernels/testing/ptx_checks.py checks every build's PTX for this).
//
// Rows past the segment's end: their Q rows (the next segment's, or TMA zeros past the last
// token) give finite S, are scaled by 0 and never written. K rows past the end are masked; V^T
// columns past the end are the V pass's zero padding (each segment padded to 128 keys), so P V
// stays finite. out and q carry no __restrict__: out may alias q, which the epilogue reads.
#include "hopper_common.cuh"
#include "varlen_attention_fp8_common.cuh"

// From h3kernels/_launch/varlen_attention_fp8_sm90a.py (NVRTC -D), which explains each value.
#if !defined(BQ) || !defined(BKV) || !defined(KSB) || !defined(HD) || !defined(STAGES) || !defined(TILE_INTS) || \
    !defined(PRODUCER_REGS) || !defined(CONSUMER_REGS) || !defined(OVERLAP) || !defined(PINGPONG) || !defined(S128) || \
    !defined(MAX_TREE) || !defined(S_SPLIT) || !defined(ONE_BLOCK_SYNC) || !defined(H3_MMA_FORM) || \
    !defined(FOLD_256) || !defined(FOLD_SCALE) || !defined(O_IN_CORE) || !defined(L_IN_CORE) || !defined(EXACT_L) || \
    !defined(MAX_AHEAD) || !defined(STAGED_OUT) || !defined(CONSUMERS) || !defined(Q_REGS) || !defined(STAGE_MAX) || \
    !defined(PROMOTE_STAGES)
#error "varlen_attention_fp8_sm90a.cu is built with the -D constants of h3kernels/_launch/varlen_attention_fp8_sm90a.py"
#endif
#if (CONSUMERS != 2 && CONSUMERS != 3) || BQ != 64 * CONSUMERS || BKV != 64 || KSB != 128 || HD != 128
#error "the warpgroup roles below assume 64 query rows per consumer warpgroup (2 or 3), 64-key blocks, 128-key stages and head dim 128"
#endif
#if (DBG_PERF & 64) && (PINGPONG || CONSUMERS != 2)
#error "DBG_PERF 64 idles the second of two consumer warpgroups, which takes no PINGPONG turns"
#endif
#if Q_REGS && !S128
#error "Q_REGS takes the S128 loops' S"
#endif
// CONSUMERS 3 (measured, not shipped): a third softmax warpgroup, 192-query tiles; at the 160
// registers four warpgroups leave each, only the 64-key loops (S128 0) with O in the tensor core fit
#if CONSUMERS == 3 && (S128 || PINGPONG || !O_IN_CORE)
#error "CONSUMERS 3 runs the block loop or OVERLAP (S128 0, PINGPONG 0) with O_IN_CORE"
#endif

#define THREADS (128 * (1 + CONSUMERS))  // the loading warpgroup and the consumers
#define CONSUMER_WARPS (4 * CONSUMERS)
#define STAGE_KEYS KSB          // keys per ring stage: one K scale block, one TMA box of K and of V^T
#define Q_BYTES (BQ * HD)
#define K_BYTES (STAGE_KEYS * HD)
#define STAGE_BYTES (2 * K_BYTES)  // K rows, then V^T rows (128 channels x 128 keys)
#define ONES_BYTES 1024            // after the ring: e4m3 1.0 in every byte, L_IN_CORE's B operand
static_assert(ONES_BYTES <= 4 * (THREADS - 128), "the consumer threads write the ones tile, a word each");
#define OUT_PITCH (2 * HD + 16)         // bytes per row of a warp's out staging: the 16 bytes of padding
                                        // make the fragment's 4-byte stores free of bank conflicts
#define OUT_WARP_BYTES (16 * OUT_PITCH)  // a consumer warp's 16 rows

// Measurement build (bench/hopper_attention.py --debug, never the launch layer's): DBG_STORE 1
// writes the scaled and masked S of the first 128 keys of each row to out (key k in channel
// k, bf16) instead of O, DBG_STORE 2 the unrounded 256 * 2^(S - m), so that a wrong fragment
// layout shows itself element by element (the block loop only: OVERLAP 0, S128 0).
#ifndef DBG_STORE
#define DBG_STORE 0
#endif
// Measurement builds (bench/hopper_attention.py --only probe, timing only, results garbage):
// DBG_PERF is a sum of flags: 1 loads K and V only for a CTA's first tile (later stages read
// what the ring holds), 2 replaces the softmax by a constant P, 4 issues no wgmma, 8 replaces each
// score's ex2 by a multiplication: which of the loads, the softmax, its special-function unit and
// the matrix products bounds the loop (docs/hopper.md, "What bounds the loop"); 16 runs each
// softmax twice (softmax_block), 32 leaves out the epilogue (what a short segment's tiles pay),
// 64 leaves the second consumer warpgroup idle (it only frees the stages and the Q tile), so that
// the first runs its rows alone: its stage time with no other warpgroup beside it (two consumers,
// no PINGPONG, whose turns the idle warpgroup would never take).
// 2 and 16 take the S128 loop's softmax one half at a time (MAX_AHEAD 0's order).
#ifndef DBG_PERF
#define DBG_PERF 0
#endif
// STAGE_MAX 1 (S128 1 with MAX_AHEAD): one running-max update per 128-key stage instead of one
// per 64-key block. Both halves' P take the stage's max, both halves' P V go onto one
// accumulator (the low half's issued, the high half's behind it with no wait between), and the
// partial and l take one rescale a stage: other P values than the 64-key blocks' (so other bits).
#if STAGE_MAX && (S128 != 1 || !MAX_AHEAD || (DBG_PERF & 18))
#error "STAGE_MAX takes S128 1's loop with both halves' maxima ahead"
#endif
// PROMOTE_STAGES n (with STAGE_MAX, O in registers): the P V partial runs on in the tensor core
// for n stages (rescaled in registers where a warp's max moved, as O_IN_CORE 2 does O), then
// joins the FP32 O: O_IN_CORE's fewer multiplications with its chains bounded to 128 n keys.
#if PROMOTE_STAGES && (!STAGE_MAX || O_IN_CORE)
#error "PROMOTE_STAGES bounds STAGE_MAX's partial chains, with O in registers"
#endif
// O_IN_CORE 1 (measured, not shipped): each block's P V accumulates onto O in the tensor core
// (O scaled by alpha in registers first) instead of into a zeroed partial added in FP32, so that
// a segment's whole P V chain meets inside the tensor core; 64 registers fewer. 2: the same, a
// warp skipping the scaling where every alpha is 1.
// S128 1 or 2: S of a whole 128-key stage in one wgmma group (m64n128k32, 4 k32 steps), its
// two 64-key halves then taken in order with the arithmetic above, and the stage's wgmmas
// software-pipelined (two orders: see the S128 loops). 0: one 64-key block at a time.
#if PINGPONG && !OVERLAP && !S128
#error "PINGPONG orders the issue of OVERLAP's or S128's schedule"
#endif
#if S128 && (OVERLAP || DBG_STORE)
#error "S128 has its own schedule (no OVERLAP) and no DBG_STORE"
#endif
#if (FOLD_256 || FOLD_SCALE || DBG_PERF) && DBG_STORE
#error "DBG_STORE shows the scaled S and the unbiased 2^(S - m)"
#endif
#if S_SPLIT != 1 && S_SPLIT != 2 && S_SPLIT != 4
#error "S_SPLIT is 1, 2 or 4"
#endif
#if H3_MMA_FORM != 0
#error "the one-block S path uses the legacy e4m3 mma.sync (form 0)"
#endif
#if O_IN_CORE && (S128 == 2 || DBG_STORE)
#error "O_IN_CORE takes the block loop's, OVERLAP's or S128 1's order"
#endif
#if (FOLD_SCALE != 0 && FOLD_SCALE != 1) || (L_IN_CORE != 0 && L_IN_CORE != 1) || (EXACT_L != 0 && EXACT_L != 1) || \
    (MAX_AHEAD != 0 && MAX_AHEAD != 1)
#error "FOLD_SCALE, L_IN_CORE, EXACT_L and MAX_AHEAD are 0 or 1"
#endif
#if FOLD_SCALE && !L_IN_CORE
#error "FOLD_SCALE's huge scores saturate P, which only l summed from the rounded P follows"
#endif
#if S_SPLIT != 1 && (OVERLAP || S128)
#error "S_SPLIT borrows the P V partial's registers, which OVERLAP and S128 keep in flight under S"
#endif

// The epilogue with out staged in shared memory (STAGED_OUT): epilogue_rows' arithmetic, but a
// warp's words of its 16 rows go into `stage` (its OUT_WARP_BYTES of shared memory) and leave
// as whole 256-byte rows, 16 bytes a lane, where the fragment's own stores (write_rows) put 8
// rows in every warp instruction (8 store wavefronts each: at 8 stages a tile the stores were
// the epilogue's cost). The lse's reads of q all come before the warp's first store to out.
template <class Acc>
__device__ __forceinline__ void write_rows_staged(Acc o, int row0, int end, int lane, float m0, float m1, float l0,
                                                  float l1, float lse_l0, float lse_l1,
                                                  const float* __restrict__ s_v, const float* __restrict__ mu,
                                                  const u16* q, u16* out, float* __restrict__ lse, int seg, int h,
                                                  int heads, i64 pitch, int tokens, int q_first, float softmax_scale,
                                                  u8* stage) {
  const int t = lane & 3, g = lane >> 2;
  u8* lane_stage = stage + g * OUT_PITCH + 4 * t;
  epilogue_rows<HD, true>(o, row0, end, t, m0, m1, l0, l1, lse_l0, lse_l1, s_v, mu, q, lse, seg, h, heads, pitch,
                          tokens, q_first, softmax_scale, [&](int half, int ct, u32 word) {
                            *reinterpret_cast<u32*>(lane_stage + half * 8 * OUT_PITCH + 16 * ct) = word;
                          });
  __syncwarp();
  const int first = row0 - g, c = lane & 15;  // the warp's first row; the lane's 16-byte column
  const bool vec = (reinterpret_cast<unsigned long long>(out) & 15) == 0;  // pitch * 2 bytes: a multiple of 256
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = 2 * i + (lane >> 4);
    const uint4 v = *reinterpret_cast<const uint4*>(stage + r * OUT_PITCH + 16 * c);
    if (first + r < end) {
      u16* dst = out + (i64)(first + r) * pitch + h * HD + 8 * c;
      if (vec) {
        *reinterpret_cast<uint4*>(dst) = v;
      } else {
        u32* d = reinterpret_cast<u32*>(dst);  // 4-byte aligned, as write_rows' stores
        d[0] = v.x;
        d[1] = v.y;
        d[2] = v.z;
        d[3] = v.w;
      }
    }
  }
  __syncwarp();  // the warp's next epilogue writes the stage again
}

// Named barriers 1 and 2 (0 is __syncthreads): the issue turns of consumer warpgroups 0 and 1
// with PINGPONG. A warpgroup waits for its turn (bar.sync, its 128 threads and the other's 128
// arrivals), issues its wgmmas, and passes the turn (bar.arrive on the other's barrier). The
// barrier numbers are immediates: with a register operand ptxas spilled 16-32 bytes in the
// S128 builds.
__device__ __forceinline__ void turn_wait(int consumer) {
  if (consumer == 0)
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
  else
    asm volatile("bar.sync 2, 256;\n" ::: "memory");
}
__device__ __forceinline__ void turn_pass(int consumer) {
  if (consumer == 0)
    asm volatile("bar.arrive 2, 256;\n" ::: "memory");
  else
    asm volatile("bar.arrive 1, 256;\n" ::: "memory");
}

// S of one 64-key block (4 k32 steps over the head dimension) into s, issued, not waited for.
__device__ __forceinline__ void issue_s(float (&s)[32], u32 q_rows, u32 k_rows) {
  if (DBG_PERF & 4) return;
  const u32 dq = wgmma_desc_lo(q_rows), dk = wgmma_desc_lo(k_rows);
#pragma unroll
  for (int k = 0; k < HD / 32; ++k) wgmma_m64n64k32_e4m3(s, wgmma_desc_at(dq, 32 * k), wgmma_desc_at(dk, 32 * k), k);
}

// s += d once d's wgmmas are waited for.
__device__ __forceinline__ void add_s(float (&s)[32], float (&d)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    fence_regs(d[i]);
    s[i] += d[i];
  }
}

// S of a segment's only 64-key block on mma.sync m16n8k32: varlen_attention_fp8.cu's steps
// (s_step_mma_sync), so the same S bits, from the same swizzled tiles; the m16n8 C registers of
// n8 tile nt are s[4 nt .. 4 nt + 3], the wgmma layout. q_rows: this warp's 16 query rows.
// The A fragment (the m16n8k32 mma.sync one, also the register A of wgmma) of k32 step ks of a
// warp's 16 Q rows (q_rows: its first, in the swizzled Q tile).
__device__ __forceinline__ void load_q_step(u32 (&qa)[4], u32 q_rows, int lane, int ks) {
  const int lq = lane >> 3, lr = lane & 7;  // ldmatrix: lane gives row lr of matrix lq
  ldmatrix_x4(q_rows + (swz128(lr + 8 * (lq & 1), lq >> 1) ^ (ks << 5)), qa[0], qa[1], qa[2], qa[3]);
}

__device__ __forceinline__ void compute_s_sync(float (&s)[32], u32 q_rows, u32 k_rows, int lane) {
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = 0.f;
#pragma unroll
  for (int ks = 0; ks < HD / 32; ++ks) {
    u32 qa[4];
    load_q_step(qa, q_rows, lane, ks);
    s_step_mma_sync<BKV>(*reinterpret_cast<float(*)[BKV / 8][4]>(s), qa, k_rows, ks, lane);
  }
}

// S of one 64-key block with at most HD / S_SPLIT of the head dimension summed inside the
// tensor core: each span goes to its own zeroed accumulator, and the spans are added in FP32
// (in order). Issued and waited for: s is ready for the softmax.
__device__ __forceinline__ void compute_s(float (&s)[32], u32 q_rows, u32 k_rows) {
  constexpr int steps = HD / 32 / S_SPLIT;  // k32 steps per span
  float d[S_SPLIT > 1 ? S_SPLIT - 1 : 1][32];  // spans 1.. (span 0 goes to s)
  const u32 dq = wgmma_desc_lo(q_rows), dk = wgmma_desc_lo(k_rows);
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < HD / 32; ++k) {
    float(&acc)[32] = k < steps ? s : d[k < steps ? 0 : k / steps - 1];
    wgmma_m64n64k32_e4m3(acc, wgmma_desc_at(dq, 32 * k), wgmma_desc_at(dk, 32 * k), k % steps);
  }
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int x = 0; x < S_SPLIT - 1; ++x) add_s(s, d[x]);
#pragma unroll
  for (int i = 0; i < 32; ++i) fence_regs(s[i]);
}

// P . V of one 64-key block into the zeroed partial `part`, issued, not waited for. v_keys: the
// block's first key column in the stage's V^T rows.
// L_IN_CORE and with_l (a constant at every call): also P . 1 into the zeroed lp, each row's sum
// of its rounded P (ones: the descriptor of the all-ones tile, whose every byte is 1.0, so that
// every K step reads ones from the same address).
// part_onto, l_onto (STAGE_MAX): part and lp continue their sums instead of starting anew.
__device__ __forceinline__ void issue_pv(float (&part)[64], const u32 (&pa)[BKV / 32][4], u32 v_keys, float (&lp)[4],
                                         u64 ones, bool with_l, bool part_onto = false, bool l_onto = false) {
  if (DBG_PERF & 4) return;
  const u32 dv = wgmma_desc_lo(v_keys);
#pragma unroll
  for (int kk = 0; kk < BKV / 32; ++kk) {
    wgmma_m64n128k32_e4m3_rs(part, pa[kk], wgmma_desc_at(dv, 32 * kk), O_IN_CORE || part_onto || kk > 0);
    if (L_IN_CORE && with_l) wgmma_m64n8k32_e4m3_rs(lp, pa[kk], ones, l_onto || kk > 0);
  }
}

// An accumulator in the wgmma layout (rows row0 / row1 by register bit 1) scaled by its rows'
// alphas. skip_held: alpha is 1 exactly where a row's max held, so a warp whose 16 rows all held
// skips the multiplications (the same bits), as most blocks of a long segment do.
__device__ __forceinline__ void scale_rows(float (&v)[64], float a0, float a1, bool skip_held) {
  if (skip_held && __all_sync(0xffffffffu, a0 == 1.f && a1 == 1.f)) return;
#pragma unroll
  for (int i = 0; i < 64; ++i) v[i] *= (i & 2) ? a1 : a0;
}

// The P V accumulator of a block: the zeroed partial, or with O_IN_CORE O itself, scaled here by
// the block's alpha first (O is not in flight then: every caller has waited for its last P V).
__device__ __forceinline__ float (&pv_target(float (&o)[64], float (&part)[64], float a0, float a1))[64] {
  if (O_IN_CORE) {
    scale_rows(o, a0, a1, O_IN_CORE == 2);
    return o;
  }
  return part;
}

// S of one 128-key stage (4 k32 steps of m64n128k32) into s_lo (keys 0-63: fragment registers
// 0-31) and s_hi (keys 64-127: registers 32-63), each laid out as issue_s's s; not waited for.
// Q_REGS: Q from the warp's registers qf (load_q), the A operand of the register form.
__device__ __forceinline__ void issue_s128(float (&s_lo)[32], float (&s_hi)[32], u32 q_rows, u32 k_rows,
                                           const u32 (&qf)[HD / 32][4]) {
  if (DBG_PERF & 4) return;
  const u32 dq = wgmma_desc_lo(q_rows), dk = wgmma_desc_lo(k_rows);
#pragma unroll
  for (int k = 0; k < HD / 32; ++k) {
    if (Q_REGS)
      wgmma_m64n128k32_e4m3_rs(s_lo, s_hi, qf[k], wgmma_desc_at(dk, 32 * k), k);
    else
      wgmma_m64n128k32_e4m3(s_lo, s_hi, wgmma_desc_at(dq, 32 * k), wgmma_desc_at(dk, 32 * k), k);
  }
}

// The warp's 16 Q rows as the A fragments of all four k32 steps (Q_REGS).
__device__ __forceinline__ void load_q(u32 (&qf)[HD / 32][4], u32 q_rows, int lane) {
#pragma unroll
  for (int ks = 0; ks < HD / 32; ++ks) load_q_step(qf[ks], q_rows, lane, ks);
}

// The next stage's S (issue_s128) when there is one (more); else a stand-in of the same shape
// on this stage's K rows (K . K^T), whose result is never read. A wgmma issued under a condition
// while others are in flight had ptxas serialize every wgmma of the function (C7515), so the
// S128 loops issue one always. The stand-in reads no Q from shared memory: the Q tile may be
// refilled by then (with Q_REGS its A operand is the registers' Q, whatever the tile holds).
__device__ __forceinline__ void issue_next_s128(float (&s_lo)[32], float (&s_hi)[32], u32 q_rows, u32 next_k_rows,
                                                u32 k_rows, bool more, const u32 (&qf)[HD / 32][4]) {
  issue_s128(s_lo, s_hi, more ? q_rows : k_rows, more ? next_k_rows : k_rows, qf);
}

// Keeps P's registers alive up to here: called after the wait that covers the P V wgmmas which
// read them. Without it the compiler counts P dead once the wgmma is issued and may give its
// registers to other values (the next block's P, softmax temporaries) while the tensor core
// still reads them: PTX makes that undefined, and it gave NaN (e4m3 bytes 0x7f / 0xff).
__device__ __forceinline__ void keep_p(u32 (&pa)[BKV / 32][4]) {
#pragma unroll
  for (int kk = 0; kk < BKV / 32; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) fence_regs(pa[kk][r]);
}

// O = O * alpha + part, once part's wgmmas are waited for (with O_IN_CORE the tensor core has
// added the block to O already); with_l: the tensor core's row sums lt = lt * alpha + the block's
// P . 1 (lp registers 0 and 2: this lane's rows, the whole row's sum in every lane).
// In parts: add_l (the row sums) and add_o (O = O * c + part, c the rows' factors).
__device__ __forceinline__ void add_l(float& l0, float& l1, float (&lp)[4], float a0, float a1) {
#pragma unroll
  for (int i = 0; i < 4; ++i) fence_regs(lp[i]);
  l0 = fmaf(l0, a0, lp[0]);
  l1 = fmaf(l1, a1, lp[2]);
}

__device__ __forceinline__ void add_o(float (&o)[64], float (&part)[64], float c0, float c1) {
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    fence_regs(part[i]);  // the additions read part only after the wait
    o[i] = fmaf(o[i], (i & 2) ? c1 : c0, part[i]);
  }
}

__device__ __forceinline__ void add_block(float (&o)[64], float (&part)[64], float a0, float a1, float& l0,
                                          float& l1, float (&lp)[4], bool with_l) {
  if (L_IN_CORE && with_l) add_l(l0, l1, lp, a0, a1);
  if (O_IN_CORE) {
#pragma unroll
    for (int i = 0; i < 64; ++i) fence_regs(o[i]);
  } else {
    add_o(o, part, a0, a1);
  }
}

// Keys from `valid` on (this lane's fragment) to -inf; only a segment's last block has any.
__device__ __forceinline__ void mask_keys(float (&v)[32], int valid, int t) {
  if (valid < BKV) {  // CTA-uniform
#pragma unroll
    for (int i = 0; i < 32; ++i)
      if (8 * (i >> 2) + 2 * t + (i & 1) >= valid) v[i] = neg_inf();
  }
}

// The softmax step of one 64-key block, varlen_attention_fp8.cu's arithmetic in its order: S
// (s, this lane's fragment: register i at row g + 8 ((i / 2) % 2), key 8 (i / 4) + 2t + i % 2)
// scaled by cb to log2 units, keys from `valid` on masked, the running max (m) and, with SUM_L,
// the sum (l) updated, alpha = 2^(m_old - m) returned in a, and P = e4m3(256 * 2^(S - m)) packed as the A
// fragments of the block's two k32 steps. s[4 nt + r] is the mma.sync C register r of n8 tile
// nt, so the packing is the mma.sync kernel's. dbg(s, 1) sees the masked S, dbg(s, 2) 2^(S - m).
// In parts: lane_max_ (the mask, this lane's maxima), row_max_ (the rows' maxima across lanes,
// m and alpha) and block_exp_ (l's rescale and sum, P); softmax_block_ runs them in turn. The
// S128 loop (MAX_AHEAD) takes both halves' lane maxima, then both row maxima, so that their
// reductions and shuffles overlap instead of running one after the other; the values are the
// same (fmaxf is exact, and the high half still takes the max after the low half's).

// This lane's maxima of its two rows' (masked, with FOLD unscaled) scores in the block.
template <bool FOLD, class Dbg>
__device__ __forceinline__ void lane_max_(float (&s)[32], float& mx0, float& mx1, float cb0, float cb1, int valid,
                                          int t, Dbg dbg) {
  // FOLD (FOLD_SCALE): s stays unscaled: the block maximum of the scaled scores is cb times the
  // unscaled one (cb >= 0, and rounding is monotonic), and each score's scaling joins its
  // subtraction of m in one FFMA (block_exp_); keys past the end are masked again after it (cb may be 0).
  if (!FOLD) {
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] *= (i & 2) ? cb1 : cb0;
  }
  mask_keys(s, valid, t);
  dbg(s, 1);
#if MAX_TREE
  // The same maxima (fmaxf is exact, so any order gives them) in 4 dependent steps, not 16
  float r0[8], r1[8];
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    r0[q] = fmaxf(s[4 * q], s[4 * q + 1]);
    r1[q] = fmaxf(s[4 * q + 2], s[4 * q + 3]);
  }
#pragma unroll
  for (int w = 4; w >= 1; w >>= 1)
#pragma unroll
    for (int q = 0; q < w; ++q) {
      r0[q] = fmaxf(r0[q], r0[q + w]);
      r1[q] = fmaxf(r1[q], r1[q + w]);
    }
  mx0 = r0[0];
  mx1 = r1[0];
#else
  mx0 = mx1 = neg_inf();
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    if (i & 2)
      mx1 = fmaxf(mx1, s[i]);
    else
      mx0 = fmaxf(mx0, s[i]);
  }
#endif
}

// The rows' maxima across their 4 lanes, the running max m updated and alpha = 2^(m_old - m).
template <bool FOLD>
__device__ __forceinline__ void row_max_(float mx0, float mx1, float& m0, float& m1, float& a0, float& a1,
                                         float cb0, float cb1) {
  row_maxima(mx0, mx1);
  // With FOLD, a block with every key masked gives -inf * cb, or NaN where cb = 0: fmaxf keeps m
  mx0 = fmaxf(m0, FOLD ? mx0 * cb0 : mx0);
  mx1 = fmaxf(m1, FOLD ? mx1 * cb1 : mx1);
  // Block 0 always has key 0, so mx is finite from here on and alpha = 2^-inf = 0 at first.
  a0 = ex2(m0 - mx0);
  a1 = ex2(m1 - mx1);
  m0 = mx0;
  m1 = mx1;
}

template <bool FOLD, class Dbg>
__device__ __forceinline__ void block_max_(float (&s)[32], float& m0, float& m1, float& a0, float& a1, float cb0,
                                           float cb1, int valid, int t, Dbg dbg) {
  float mx0, mx1;
  lane_max_<FOLD>(s, mx0, mx1, cb0, cb1, valid, t, dbg);
  row_max_<FOLD>(mx0, mx1, m0, m1, a0, a1, cb0, cb1);
}

// m: the max after this block (block_max_'s); a: its alpha.
template <bool FOLD, bool SUM_L, class Dbg>
__device__ __forceinline__ void block_exp_(float (&s)[32], u32 (&pa)[BKV / 32][4], float m0, float m1, float& l0,
                                           float& l1, float a0, float a1, float cb0, float cb1, int valid, int t,
                                           Dbg dbg) {
  if (SUM_L) {  // else add_block takes l's rescale and sum (L_IN_CORE)
    l0 *= a0;
    l1 *= a1;
  }
  // FOLD_256: P's 2^8 bias in the exponent, 256 * 2^(S - m) = 2^(S - (m - 8)) (m - 8 is exact),
  // one FADD per score where the bias costs an FMUL more; l then sums 256 times the unbiased
  // values (write_rows takes l / 256).
  const float bias = FOLD_256 ? 8.f : 0.f;
  // FOLD: the FFMA leaves the maximum's own argument the rounding error of its unrounded
  // product, up to half an ulp of m, which for huge scores (queries scaled by 1e30) is 2^(+-huge).
  // So e lies a margin below m - bias, |m| 2^-22 (at least twice m's ulp, beyond both roundings):
  // the maximum's argument is then at least bias, and where |m| is huge, 2^(huge) = inf, which
  // P's conversion saturates to 448, and l (P . 1 of the rounded P) agrees with it. Below
  // |m| = 2^12 the margin is under 2^-10.
  const float e0 = FOLD ? fmaf(fabsf(m0), -0x1p-22f, m0 - bias) : m0 - bias;
  const float e1 = FOLD ? fmaf(fabsf(m1), -0x1p-22f, m1 - bias) : m1 - bias;
  if (FOLD) {
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = (i & 2) ? fmaf(s[i], cb1, -e1) : fmaf(s[i], cb0, -e0);
    mask_keys(s, valid, t);
  }
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const float x = FOLD ? s[i] : s[i] - ((i & 2) ? e1 : e0);
    s[i] = (DBG_PERF & 8) ? x * 0.0625f : ex2(x);
    if (!SUM_L)
      continue;
    const float p = FOLD ? fminf(s[i], 0x1p64f) : s[i];  // the margin's inf (huge scores) kept finite
    if (i & 2)
      l1 += p;
    else
      l0 += p;
  }
  dbg(s, 2);
#pragma unroll
  for (int kk = 0; kk < BKV / 32; ++kk) {
    const float* p = s + 16 * kk;  // n8 tiles 4kk .. 4kk + 3: keys 32kk .. 32kk + 31
    pa[kk][0] = pack_p<FOLD_256 ? 1 : 256>(p[0], p[1], p[4], p[5]);
    pa[kk][1] = pack_p<FOLD_256 ? 1 : 256>(p[2], p[3], p[6], p[7]);
    pa[kk][2] = pack_p<FOLD_256 ? 1 : 256>(p[8], p[9], p[12], p[13]);
    pa[kk][3] = pack_p<FOLD_256 ? 1 : 256>(p[10], p[11], p[14], p[15]);
  }
}

template <bool FOLD, bool SUM_L, class Dbg>
__device__ __forceinline__ void softmax_block_(float (&s)[32], u32 (&pa)[BKV / 32][4], float& m0, float& m1,
                                              float& l0, float& l1, float& a0, float& a1, float cb0, float cb1,
                                              int valid, int t, Dbg dbg) {
  if (DBG_PERF & 2) {
#pragma unroll
    for (int kk = 0; kk < BKV / 32; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) pa[kk][r] = 0x38383838u;  // e4m3 1.0
    a0 = a1 = 1.f;
    l0 += 1.f;
    l1 += 1.f;
    m0 = m1 = 0.f;
    return;
  }
  block_max_<FOLD>(s, m0, m1, a0, a1, cb0, cb1, valid, t, dbg);
  block_exp_<FOLD, SUM_L>(s, pa, m0, m1, l0, l1, a0, a1, cb0, cb1, valid, t, dbg);
}

// DBG_PERF 16: a second, independent softmax of the same block beside each one (its P folded in
// by XOR, so that it is not dropped): twice the softmax's work on two chains per warp, which
// tells a throughput-bound loop (twice the time) from a latency-bound one (less).
// FOLD, SUM_L: the scaling folded into the FFMA, and l summed in FP32 from the unrounded P; by
// default the build's FOLD_SCALE, and SUM_L where O or the lse takes that sum (without L_IN_CORE,
// or with EXACT_L); a one-block tile takes <false, true>, unfolded with l in FP32 (its P on the
// reference's grid).
#define SUM_L_DEFAULT (!L_IN_CORE || EXACT_L)
// The S128 1 loop's order of the softmax parts (MAX_AHEAD); DBG_PERF 2 and 16 live in
// softmax_block, so their probes time the one-half-at-a-time order
#define MAX_AHEAD_ON (MAX_AHEAD && !(DBG_PERF & 18))
template <bool FOLD = FOLD_SCALE, bool SUM_L = SUM_L_DEFAULT, class Dbg>
__device__ __forceinline__ void softmax_block(float (&s)[32], u32 (&pa)[BKV / 32][4], float& m0, float& m1,
                                              float& l0, float& l1, float& a0, float& a1, float cb0, float cb1,
                                              int valid, int t, Dbg dbg) {
  if (DBG_PERF & 16) {
    float s2[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s2[i] = s[i] * 1.0001f;
    u32 p2[BKV / 32][4];
    float n0 = m0, n1 = m1, k0 = l0, k1 = l1, b0, b1;
    softmax_block_<FOLD, SUM_L>(s2, p2, n0, n1, k0, k1, b0, b1, cb0, cb1, valid, t, dbg);
    softmax_block_<FOLD, SUM_L>(s, pa, m0, m1, l0, l1, a0, a1, cb0, cb1, valid, t, dbg);
#pragma unroll
    for (int kk = 0; kk < BKV / 32; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) pa[kk][r] ^= p2[kk][r];
    l0 += k0 * 1e-30f;
    l1 += k1 * 1e-30f;
    a0 += b0 * 1e-30f;
    a1 += b1 * 1e-30f;
    return;
  }
  softmax_block_<FOLD, SUM_L>(s, pa, m0, m1, l0, l1, a0, a1, cb0, cb1, valid, t, dbg);
}

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
  const u32 q_smem = base, ring = base + Q_BYTES, ones = ring + STAGES * STAGE_BYTES;
  [[maybe_unused]] u8* const out_stage = smem_raw + (ones + ONES_BYTES - smem_u32(smem_raw));  // STAGED_OUT
  const int wg = threadIdx.x >> 7;
  // the first ONES_BYTES / 4 consumer threads, a word each (all of them with two consumers)
  if (L_IN_CORE && threadIdx.x >= 128 && threadIdx.x < 128 + ONES_BYTES / 4) {
    *(u32*)(smem_raw + (ones - smem_u32(smem_raw)) + 4 * (threadIdx.x - 128)) = 0x38383838u;  // e4m3 1.0
    fence_proxy_async_shared();
  }
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
          if ((DBG_PERF & 1) && tile != (int)blockIdx.x) {
            mbar_arrive(&full[stage]);
            if (++stage == STAGES) {
              stage = 0;
              phase ^= 1;
            }
            continue;
          }
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
    int stage = 0;  // the ring stage of the next block's keys, and its full barrier's phase
    u32 phase = 0, q_phase = 0;
    float part[64];  // one 64-key block's P V (the first k32 step overwrites it)
    float lp[4] = {0.f, 0.f, 0.f, 0.f};  // with L_IN_CORE its P . 1
    const u64 ones_desc = wgmma_desc(ones);
#pragma unroll
    for (int i = 0; i < 64; ++i) part[i] = 0.f;
#if PINGPONG
    if (consumer == 1) turn_pass(consumer);  // warpgroup 0 issues first
#endif
    for (int tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
      const int* w = tiles + (i64)tile * TILE_INTS;
      const int len = w[1], q0 = w[2], h = w[3], seg = w[4];
      const int end = q_bounds[seg + 1], kb0 = block_offset[seg];
      const int n_stages = (len + STAGE_KEYS - 1) / STAGE_KEYS;
      const int n_blocks = (len + BKV - 1) / BKV;
#if DBG_PERF & 64
      if (consumer == 1) {
        mbar_wait(&q_full, q_phase);
        q_phase ^= 1;
        for (int st = 0; st < n_stages; ++st) {
          mbar_wait(&full[stage], phase);
          if (lane == 0) mbar_arrive(&empty[stage]);
          if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
          }
        }
        if (lane == 0) mbar_arrive(&q_empty);
        continue;
      }
#endif
      const bool one_block = ONE_BLOCK_SYNC && n_blocks == 1;  // CTA-uniform: S on mma.sync, l in FP32
      const int row0 = q0 + 64 * consumer + 16 * warp + g, row1 = row0 + 8;  // this lane's two query rows
      // log2(e) * softmax_scale * s_q per row; rows past the segment give S = 0 and are not written
      const float c0 = row0 < end ? s_q[(i64)row0 * heads + h] * scale_log2 : 0.f;
      const float c1 = row1 < end ? s_q[(i64)row1 * heads + h] * scale_log2 : 0.f;
      // s_k of each stage, read one stage ahead (its latency would stall the softmax)
      const float* sk_col = s_k + (i64)kb0 * heads + h;
      float sk = 0.f, sk_next = sk_col[0];

      float o[64];  // O: row0 / row1, channel 8 (i / 4) + 2t + i % 2 (wgmma fragment layout)
#pragma unroll
      for (int i = 0; i < 64; ++i) o[i] = 0.f;
      float m0 = neg_inf(), m1 = neg_inf(), l0 = 0.f, l1 = 0.f;  // l: this lane's share of the row sum
      float lt0 = 0.f, lt1 = 0.f;  // L_IN_CORE: the row sums of the rounded P (tensor core), whole in each lane
      [[maybe_unused]] float mo0 = neg_inf(), mo1 = neg_inf();  // PROMOTE_STAGES: the max O's values are at
      const u32 a_q = q_smem + consumer * 64 * HD;
      float s[32];
      u32 pa[BKV / 32][4];
      float a0, a1;  // the rescale of the block whose P V is pending
      mbar_wait(&q_full, q_phase);
      q_phase ^= 1;
      u32 qf[HD / 32][4];  // Q_REGS: this warp's Q rows, S's register A operand
      if (Q_REGS) load_q(qf, a_q + 16 * warp * HD, lane);
      // block j: keys 64 j .. of the segment, in stage j / 2 of the tile (K rows 64 (j % 2) ..,
      // V^T key columns 64 (j % 2) ..); a stage is freed after the P V of its last block
#if DBG_STORE
      auto dbg = [&](const float (&v)[32], int which, int j) {
        if (which != DBG_STORE || j >= STAGE_KEYS / BKV) return;
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const int row = (i & 2) ? row1 : row0, key = j * BKV + 8 * (i >> 2) + 2 * t + (i & 1);
          if (row < end) out[(i64)row * pitch + h * HD + key] = bf16_from_f32((DBG_STORE == 2 ? 256.f : 1.f) * v[i]);
        }
      };
#else
      auto dbg = [](const float (&)[32], int, int) {};
#endif
      [[maybe_unused]] const auto nodbg = [](const float (&)[32], int) {};  // the pipelined loops' softmax
      // Each block in turn: S, its softmax, its P V; the two consumer warpgroups interleave.
      // sync_s: S on mma.sync (compute_s_sync), for a segment of one block.
      auto block = [&](int j, bool sync_s) {
        if ((j & 1) == 0) {
          sk = sk_next;
          if (j / 2 + 1 < n_stages) sk_next = sk_col[(i64)(j / 2 + 1) * heads];
          mbar_wait(&full[stage], phase);
        }
        const u32 k_rows = ring + stage * STAGE_BYTES + (j & 1) * BKV * HD;
        if (sync_s)
          compute_s_sync(s, a_q + 16 * warp * HD, k_rows, lane);
        else
          compute_s(s, a_q, k_rows);
        if (j == n_blocks - 1 && lane == 0) mbar_arrive(&q_empty);  // the tile's last read of Q
        auto show = [&](const float (&v)[32], int which) { dbg(v, which, j); };
        if (sync_s)  // l summed in FP32 from the unrounded P, as the reference: this P is on its grid
          softmax_block<false, true>(s, pa, m0, m1, l0, l1, a0, a1, c0 * sk, c1 * sk, len - j * BKV, t, show);
        else
          softmax_block(s, pa, m0, m1, l0, l1, a0, a1, c0 * sk, c1 * sk, len - j * BKV, t, show);
        float(&acc)[64] = pv_target(o, part, a0, a1);
        wgmma_fence();
        issue_pv(acc, pa, ring + stage * STAGE_BYTES + K_BYTES + (j & 1) * BKV, lp, ones_desc, !sync_s);
        wgmma_commit();
        wgmma_wait<0>();
        add_block(o, part, a0, a1, lt0, lt1, lp, !sync_s);
        if ((j & 1) || j == n_blocks - 1) {  // the stage's last block
          if (lane == 0) mbar_arrive(&empty[stage]);
          if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
          }
        }
      };
#if !OVERLAP && !S128
      // The one-block tile apart from the loop: a branch inside it cost the loop 7% (H200).
      if (one_block) {
        block(0, true);
      } else {
#pragma unroll 1
        for (int j = 0; j < n_blocks; ++j) block(j, false);
      }
#else
      if (one_block) {  // as above, apart from the pipelined loop
        block(0, true);
      } else {
      // The ring stepped past stage st (its index left in cur); where a next stage follows, its
      // s_k read and its keys waited for, before the issue turn (a wait on the TMA must not hold
      // the other warpgroup). Returns whether one follows.
      [[maybe_unused]] const auto next_stage = [&](int st, int& cur) {
        cur = stage;
        if (++stage == STAGES) {
          stage = 0;
          phase ^= 1;
        }
        const bool more = st + 1 < n_stages;
        if (more) {
          sk = sk_next;
          if (st + 2 < n_stages) sk_next = sk_col[(i64)(st + 2) * heads];
          mbar_wait(&full[stage], phase);
        }
        return more;
      };
#if S128 == 2
      // As S128 1, with the next stage's S issued before the high half's P V, so that the wait
      // after them takes S only: the high half's P V then runs under the next stage's low-half
      // softmax, and O takes its partial after that softmax (O still takes the partials in
      // block order: the low half's of stage st after the high half's of stage st - 1).
      float s_hi[32];
      u32 pb[BKV / 32][4];
      float b0 = 0.f, b1 = 0.f;  // the high half's rescale
      bool prev_hi = false;      // a high half's P V is pending (issued in the previous stage)
      int prev_stage = 0;        // that stage, freed once its P V is done
#pragma unroll 1
      for (int st = 0; st < n_stages; ++st) {
        const u32 stage_base = ring + stage * STAGE_BYTES;
        if (st == 0) {  // the tile's first S; the later ones are issued a stage ahead
          sk = sk_next;
          if (n_stages > 1) sk_next = sk_col[heads];
          mbar_wait(&full[stage], phase);
          wgmma_fence();
          issue_s128(s, s_hi, a_q, stage_base, qf);
          wgmma_commit();
          wgmma_wait<0>();
        }
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          fence_regs(s[i]);
          fence_regs(s_hi[i]);
        }
        if (st == n_stages - 1 && lane == 0) mbar_arrive(&q_empty);  // the tile's last S is done
        const int valid = len - st * STAGE_KEYS;
        const bool has_hi = valid > BKV;
        softmax_block(s, pa, m0, m1, l0, l1, a0, a1, c0 * sk, c1 * sk, valid, t, nodbg);
        wgmma_wait<0>();  // the previous stage's high-half P V
        keep_p(pb);
        if (prev_hi) add_block(o, part, b0, b1, lt0, lt1, lp, true);
        if (st > 0 && lane == 0) mbar_arrive(&empty[prev_stage]);
        wgmma_fence();
        issue_pv(part, pa, stage_base + K_BYTES, lp, ones_desc, true);
        wgmma_commit();
        // no keys past the end: P 0, m and l as they were
        softmax_block(s_hi, pb, m0, m1, l0, l1, b0, b1, c0 * sk, c1 * sk, valid - BKV, t, nodbg);
        wgmma_wait<0>();
        keep_p(pa);
        add_block(o, part, a0, a1, lt0, lt1, lp, true);
        prev_hi = has_hi;
        const bool more = next_stage(st, prev_stage);
#if PINGPONG
        turn_wait(consumer);
#endif
        wgmma_fence();
        issue_next_s128(s, s_hi, a_q, ring + stage * STAGE_BYTES, stage_base, more, qf);
        wgmma_commit();
        issue_pv(part, pb, stage_base + K_BYTES + BKV, lp, ones_desc, true);  // P 0 without a high half
        wgmma_commit();
#if PINGPONG
        turn_pass(consumer);
#endif
        wgmma_wait<1>();  // the next S is done; the high half's P V may still run
      }
      wgmma_wait<0>();
      keep_p(pb);
      if (prev_hi) add_block(o, part, b0, b1, lt0, lt1, lp, true);
      if (n_stages > 0 && lane == 0) mbar_arrive(&empty[prev_stage]);
#elif S128
      // Stage st (keys 128 st ..): its S in one group; the softmax of the low half (block 2 st);
      // its P V issued, and the high half's softmax (block 2 st + 1) run while it is in the
      // tensor core; O takes the low partial; the high half's P V issued with the next stage's S
      // behind it, and O takes the high partial while that S runs. Blocks in the model's order,
      // each with the arithmetic of softmax_block and add_block: bitwise the block loop's result.
      // A stage whose high half lies past the segment's end (a last stage of 64 keys or fewer)
      // runs that half with every key masked (P 0, m and l unchanged) and its P V on the zero
      // padding, so that every path issues the same wgmmas; O does not take that partial, as
      // the block loop has no such block.
      float s_hi[32];
      u32 pb[BKV / 32][4];
      [[maybe_unused]] float b0, b1;  // the high half's rescale (without STAGE_MAX)
      // The high half's P V (onto: continuing the low half's accumulators) and the next stage's S
      // (a stand-in past the last), two groups issued in the warpgroup's turn.
      const auto issue_hi_and_next_s = [&](float (&acc)[64], u32 stage_base, bool onto, bool more) {
#if PINGPONG
        turn_wait(consumer);
#endif
        wgmma_fence();
        issue_pv(acc, pb, stage_base + K_BYTES + BKV, lp, ones_desc, true, onto, onto);
        wgmma_commit();
        issue_next_s128(s, s_hi, a_q, ring + stage * STAGE_BYTES, stage_base, more, qf);
        wgmma_commit();
#if PINGPONG
        turn_pass(consumer);
#endif
      };
#pragma unroll 1
      for (int st = 0; st < n_stages; ++st) {
        const u32 stage_base = ring + stage * STAGE_BYTES;
        if (st == 0) {  // the tile's first S; the later ones are issued a stage ahead
          sk = sk_next;
          if (n_stages > 1) sk_next = sk_col[heads];
          mbar_wait(&full[stage], phase);
          wgmma_fence();
          issue_s128(s, s_hi, a_q, stage_base, qf);
          wgmma_commit();
          wgmma_wait<0>();
        }
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          fence_regs(s[i]);
          fence_regs(s_hi[i]);
        }
        if (st == n_stages - 1 && lane == 0) mbar_arrive(&q_empty);  // the tile's last S is done
        const int valid = len - st * STAGE_KEYS;  // keys of the segment from this stage's first
        [[maybe_unused]] const bool has_hi = valid > BKV;  // CTA-uniform
        const float cb0 = c0 * sk, cb1 = c1 * sk;
#if STAGE_MAX
        // One max for the stage: both halves' lane maxima, one row reduction, both halves' P
        // against it; the high half's P V continues the low half's accumulators (no wait between:
        // wgmmas of one warpgroup onto the same registers run in issue order); O and l take the
        // stage's alpha once, after both. A stage with no high half adds P 0 times the padding.
        float x0, x1, y0, y1;
        lane_max_<FOLD_SCALE>(s, x0, x1, cb0, cb1, valid, t, nodbg);
        lane_max_<FOLD_SCALE>(s_hi, y0, y1, cb0, cb1, valid - BKV, t, nodbg);  // no keys: -inf
        row_max_<FOLD_SCALE>(fmaxf(x0, y0), fmaxf(x1, y1), m0, m1, a0, a1, cb0, cb1);
        block_exp_<FOLD_SCALE, SUM_L_DEFAULT>(s, pa, m0, m1, l0, l1, a0, a1, cb0, cb1, valid, t, nodbg);
#if PROMOTE_STAGES
        // the chain's first stage starts part anew; a later one rescales it where a row's max moved
        const bool chain_on = st % PROMOTE_STAGES != 0;
        if (chain_on) scale_rows(part, a0, a1, true);
        float(&acc)[64] = part;
#else
        const bool chain_on = false;
        float(&acc)[64] = pv_target(o, part, a0, a1);
#endif
        wgmma_fence();
        issue_pv(acc, pa, stage_base + K_BYTES, lp, ones_desc, true, chain_on);
        wgmma_commit();
        block_exp_<FOLD_SCALE, SUM_L_DEFAULT>(s_hi, pb, m0, m1, l0, l1, 1.f, 1.f, cb0, cb1, valid - BKV, t, nodbg);
        int cur;
        const bool more = next_stage(st, cur);
        issue_hi_and_next_s(acc, stage_base, true, more);
        wgmma_wait<1>();  // both halves' P V are done; the next S may still run
        keep_p(pa);
        keep_p(pb);
#if PROMOTE_STAGES
        add_l(lt0, lt1, lp, a0, a1);
        if ((st + 1) % PROMOTE_STAGES == 0 || !more) {  // the chain joins O, at O's max (mo) till now
          const float f0 = ex2(mo0 - m0), f1 = ex2(mo1 - m1);  // 0 at the first: mo is -inf
          mo0 = m0;
          mo1 = m1;
          add_o(o, part, f0, f1);
        }
#else
        add_block(o, part, a0, a1, lt0, lt1, lp, true);
#endif
#else
#if MAX_AHEAD_ON
        // Both halves' maxima first (their reductions and shuffles overlap), then each half's P
        float x0, x1, y0, y1;
        lane_max_<FOLD_SCALE>(s, x0, x1, cb0, cb1, valid, t, nodbg);
        lane_max_<FOLD_SCALE>(s_hi, y0, y1, cb0, cb1, valid - BKV, t, nodbg);  // no keys: -inf, m kept, b 1
        row_max_<FOLD_SCALE>(x0, x1, m0, m1, a0, a1, cb0, cb1);
        const float mlo0 = m0, mlo1 = m1;  // the max after the low half, which its P takes
        row_max_<FOLD_SCALE>(y0, y1, m0, m1, b0, b1, cb0, cb1);
        block_exp_<FOLD_SCALE, SUM_L_DEFAULT>(s, pa, mlo0, mlo1, l0, l1, a0, a1, cb0, cb1, valid, t, nodbg);
#else
        softmax_block(s, pa, m0, m1, l0, l1, a0, a1, cb0, cb1, valid, t, nodbg);
#endif
        float(&acc)[64] = pv_target(o, part, a0, a1);
        wgmma_fence();
        issue_pv(acc, pa, stage_base + K_BYTES, lp, ones_desc, true);
        wgmma_commit();
        // no keys past the end: P 0, m and l as they were
#if MAX_AHEAD_ON
        block_exp_<FOLD_SCALE, SUM_L_DEFAULT>(s_hi, pb, m0, m1, l0, l1, b0, b1, cb0, cb1, valid - BKV, t, nodbg);
#else
        softmax_block(s_hi, pb, m0, m1, l0, l1, b0, b1, cb0, cb1, valid - BKV, t, nodbg);
#endif
        wgmma_wait<0>();
        keep_p(pa);
        add_block(o, part, a0, a1, lt0, lt1, lp, true);
        int cur;
        const bool more = next_stage(st, cur);
        // Two groups, each issued on every path (stand-ins where there is nothing to compute)
        float(&acc_hi)[64] = pv_target(o, part, b0, b1);  // without a high half b is 1 exactly
        issue_hi_and_next_s(acc_hi, stage_base, false, more);  // P 0 without a high half
        wgmma_wait<1>();  // the high half's P V is done; the next S may still run
        keep_p(pb);
        if (has_hi) add_block(o, part, b0, b1, lt0, lt1, lp, true);
#endif
        if (!more) wgmma_wait<0>();  // the last stage's stand-in S reads its K rows
        if (lane == 0) mbar_arrive(&empty[cur]);  // the stage's last reads are done
        wgmma_wait<0>();
      }
#else
      // S of block j is issued with the P V of block j - 1 behind it, and the softmax of block
      // j runs while that P V is in the tensor core. The same arithmetic in the same order as
      // above (bitwise the same result): O takes block j - 1's partial with its own alpha.
      int pv_stage = stage;  // the stage of the block whose P V is pending
      if (O_IN_CORE) a0 = a1 = 1.f;  // block -1's alpha: O (zero) stays as it is
#pragma unroll
      for (int kk = 0; kk < BKV / 32; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) pa[kk][r] = 0u;  // block -1: no keys
#pragma unroll 1
      for (int j = 0; j < n_blocks; ++j) {
        if ((j & 1) == 0) {
          sk = sk_next;
          if (j / 2 + 1 < n_stages) sk_next = sk_col[(i64)(j / 2 + 1) * heads];
          mbar_wait(&full[stage], phase);
        }
        // with O_IN_CORE: O scaled by block j - 1's alpha, before the turn (the other warpgroup waits through a turn)
        float(&acc)[64] = pv_target(o, part, a0, a1);
#if PINGPONG
        turn_wait(consumer);
#endif
        wgmma_fence();
        issue_s(s, a_q, ring + stage * STAGE_BYTES + (j & 1) * BKV * HD);
        wgmma_commit();
        issue_pv(acc, pa, ring + pv_stage * STAGE_BYTES + K_BYTES + ((j + 1) & 1) * BKV, lp, ones_desc, true);  // j = 0: P 0
        wgmma_commit();
#if PINGPONG
        turn_pass(consumer);  // the other warpgroup's wgmmas queue behind these
#endif
        wgmma_wait<1>();  // S of block j is done; block j - 1's P V may still run
#pragma unroll
        for (int i = 0; i < 32; ++i) fence_regs(s[i]);
        if (j == n_blocks - 1 && lane == 0) mbar_arrive(&q_empty);  // the tile's last read of Q
        u32 pn[BKV / 32][4];
        float a0n, a1n;
        softmax_block(s, pn, m0, m1, l0, l1, a0n, a1n, c0 * sk, c1 * sk, len - j * BKV, t, nodbg);
        wgmma_wait<0>();
        keep_p(pa);  // block j - 1's P V read pa until here: pn must not take its registers
        if (j > 0) {
          add_block(o, part, a0, a1, lt0, lt1, lp, true);
          if (((j - 1) & 1) && lane == 0) mbar_arrive(&empty[pv_stage]);  // block j - 1 ended its stage
        }
#pragma unroll
        for (int kk = 0; kk < BKV / 32; ++kk)
#pragma unroll
          for (int r = 0; r < 4; ++r) pa[kk][r] = pn[kk][r];
        a0 = a0n;
        a1 = a1n;
        pv_stage = stage;
        if (j & 1) {
          if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
      // the last block's P V; it ends its stage
      float(&acc)[64] = pv_target(o, part, a0, a1);
      wgmma_fence();
      issue_pv(acc, pa, ring + pv_stage * STAGE_BYTES + K_BYTES + ((n_blocks - 1) & 1) * BKV, lp, ones_desc, true);
      wgmma_commit();
      wgmma_wait<0>();
      add_block(o, part, a0, a1, lt0, lt1, lp, true);
      if (lane == 0) mbar_arrive(&empty[pv_stage]);
      if (((n_blocks - 1) & 1) == 0) {  // a stage of one block: not yet stepped past
        if (++stage == STAGES) {
          stage = 0;
          phase ^= 1;
        }
      }
#endif
      }
#endif
#if !DBG_STORE
      // O's l and the lse's, whole rows: the FP32 sums of the unrounded P (biased by 2^8 with
      // FOLD_256; each lane holds a share), or with L_IN_CORE the tensor core's sums of the
      // rounded P (always biased; each lane holds the whole), except in a one-block tile. EXACT_L
      // (the build for an lse) keeps both, the lse taking the FP32 one. Exact scalings.
      const bool tensor_l = L_IN_CORE && !one_block;
      if (!tensor_l || (EXACT_L && lse != nullptr)) row_sums(l0, l1);
      constexpr float fp32_scale = FOLD_256 ? 1.f / 256.f : 1.f;
      const float o_l0 = tensor_l ? lt0 * (1.f / 256.f) : l0 * fp32_scale;
      const float o_l1 = tensor_l ? lt1 * (1.f / 256.f) : l1 * fp32_scale;
      const float lse_l0 = tensor_l && !EXACT_L ? o_l0 : l0 * fp32_scale;
      const float lse_l1 = tensor_l && !EXACT_L ? o_l1 : l1 * fp32_scale;
      // DBG_PERF 32 writes only for an improbable value, which keeps O, m and l live (a warp-wide
      // vote: write_rows shuffles across the warp)
      if (!(DBG_PERF & 32) || __any_sync(0xffffffffu, o[0] == 1234.5f && o_l0 == 1234.5f))
#if STAGED_OUT
        write_rows_staged([&](int ct, int r) { return o[4 * ct + r]; }, row0, end, lane, m0, m1, o_l0, o_l1, lse_l0,
                          lse_l1, s_v, mu, q, out, lse, seg, h, heads, pitch, tokens, q_bounds[seg], softmax_scale,
                          out_stage + (4 * consumer + warp) * OUT_WARP_BYTES);
#else
        write_rows<HD>([&](int ct, int r) { return o[4 * ct + r]; }, row0, end, t, m0, m1, o_l0, o_l1, lse_l0,
                       lse_l1, s_v, mu, q, out, lse, seg, h, heads, pitch, tokens, q_bounds[seg], softmax_scale);
#endif
#endif
    }
#if PINGPONG
    if (consumer == 0) turn_wait(consumer);  // warpgroup 1's last pass: every arrival has its wait
#endif
  }
}
