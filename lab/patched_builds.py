"""Builds of the shipped kernels with their source text patched, for probes that must not live in
cuda_src/: a patch is a function of (main text, {header: text}) registered under a name, and a
Lab*Build carries that name (as the -D constant H3_LAB_PATCH, so that the loader and NVRTC see a
build of its own). Importing this module makes the compiler apply the patch of such a build
(uncached). Each patch checks that its anchors are in the text once, so a change of the shipped
source fails it loudly instead of probing something else.

    python lab/patched_builds.py mlp_gemm_time [its arguments]   # with LabMlpBuild(patch=...) in --builds
"""
import dataclasses
import runpy
import sys
from pathlib import Path

from h3kernels._launch.mlp_fp8_sm90a import MlpBuild
from h3kernels._launch.varlen_attention_fp8_sm90a import AttentionBuild
from h3kernels._runtime import compiler

PATCHES = {}
_compile_cubin = compiler.compile_cubin


def patch(name):
    def register(fn):
        PATCHES[name] = fn
        return fn
    return register


def edit(texts, name, *pairs):
    """texts[name] with each (anchor, new) of pairs applied in turn by replace_once."""
    for anchor, new in pairs:
        texts[name] = replace_once(texts[name], anchor, new, name)


def replace_once(text, anchor, new, where):
    if text.count(anchor) != 1:
        raise ValueError(f"{where}: anchor {anchor!r} found {text.count(anchor)} times")
    return text.replace(anchor, new)


def compile_cubin(name, arch, defines=None, extra=(), use_cache=True, backend=None, appended=""):
    which = (defines or {}).get("H3_LAB_PATCH")
    if not which:
        return _compile_cubin(name, arch, defines, extra, use_cache, backend, appended)
    main, headers = compiler.read_with_includes(name)
    headers = dict(headers)
    for one in which.split("+"):  # patches applied in turn
        main, headers = PATCHES[one](main, headers)
    options = compiler.options_for(arch, defines, extra)
    cubin, log = compiler.nvrtc(backend).compile(main + appended, f"{name}.cu", headers, options)
    return cubin, log, which


compiler.compile_cubin = compile_cubin  # compiler.kernel looks it up at each first load


@dataclasses.dataclass(frozen=True)
class LabMlpBuild(MlpBuild):
    patch: str = ""

    def defines(self):
        return {**super().defines(), **({"H3_LAB_PATCH": self.patch} if self.patch else {})}


@dataclasses.dataclass(frozen=True)
class LabAttentionBuild(AttentionBuild):
    patch: str = ""

    def defines(self):
        return {**super().defines(), **({"H3_LAB_PATCH": self.patch} if self.patch else {})}


@patch("mlp_no_epilogue")
def mlp_no_epilogue(main, headers):
    """The GEMMs' main loops alone: each tile's epilogue compiled in but never run (a test on its
    first sum that no real operand meets), so loads, wgmmas and promotion run as shipped."""
    h = "mlp_fp8_sm90a_gemm.cuh"
    headers[h] = replace_once(headers[h], "      epilogue(acc, m0 + 64 * consumer, n0);",
                              "      if (acc[0][0] == 1.2345e-30f) epilogue(acc, m0 + 64 * consumer, n0);", h)
    return main, headers


# the attention stage loop's timeline: clock64 at 8 points of each stage (lane 0 of each consumer
# warpgroup, the tiles of head 0 of segment 0, stages < 64), into h3_probe[cta][consumer][stage][point]
TIMELINE_POINTS = ("S ready", "row max", "low P", "low P V issued", "high P", "next keys", "P V waited",
                   "next S waited")


# The probes' buffer, h3_probe[cta][consumer][row][point] (132 CTAs, 2 consumers, 64 rows of 8
# points), and h3_probe_at(row, i, k): clock64 into point k of row i from `row` (null: not probed)
PROBE_C = ("__device__ unsigned long long h3_probe[132 * 2 * 64 * 8];\n"
           "__device__ __forceinline__ void h3_probe_at(unsigned long long* row, int i, int k) {\n"
           "  u64 c;\n"
           '  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");\n'
           "  if (row != nullptr && i < 64) row[i * 8 + k] = c;\n"
           "}\n")


def probed_run(set_name, build):
    """The attention kernel alone on bench_attention's set `set_name` (56 heads): (ms unprobed, ms with
    `build`'s probes, the probes of one run of it as int64 [132, 2, 64, 8]). Needs a GPU."""
    import cupy
    import numpy as np
    import torch
    from h3kernels._launch import varlen_attention_fp8_sm90a as hopper
    from h3kernels.testing.timing import attention_kernel_alone
    from h3kernels.timing import median_ms_batched
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from bench_attention import SETS, make_set
    s = make_set(dict(SETS)[set_name], 56, 0, torch.device("cuda"))
    args = (s["q"], s["k"], s["v"], s["cu"], s["cu_host"])
    plain = attention_kernel_alone(*args)
    probed = attention_kernel_alone(*args, build=build)
    t_plain = median_ms_batched(plain, batch=5, warmup=2, reps=7)
    t_probed = median_ms_batched(probed, batch=5, warmup=2, reps=7)
    mod = compiler.kernel(hopper.SOURCE, hopper.KERNEL, hopper.ARCH, build, 0).function.module
    size = 132 * 2 * 64 * 8 * 8
    buf = cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(int(mod.get_global_var("h3_probe")), size, mod), 0)
    buf.memset(0, size)
    cupy.cuda.Device().synchronize()
    probed()
    torch.cuda.synchronize()
    return t_plain, t_probed, cupy.ndarray((132, 2, 64, 8), dtype=cupy.uint64, memptr=buf).get().astype(np.int64)


def interior_phases(t, cta, wg, phases, wrap_from):
    """Appends to phases[k] (k = 1 .. 7) the cycles from point k - 1 to point k of every interior row
    of t[cta, wg] (probed_run's: a row not the first, whose points and the next row's first were
    all read), and to phases[0] those from its point wrap_from to the next row's point 0."""
    import numpy as np
    n = int(np.count_nonzero(t[cta, wg, :, 0]))
    for i in range(1, n - 1):
        row, nxt = t[cta, wg, i], t[cta, wg, i + 1]
        if np.all(row > 0) and nxt[0] > 0:
            for k in range(1, 8):
                phases[k].append(row[k] - row[k - 1])
            phases[0].append(nxt[0] - row[wrap_from])


@patch("attention_timeline")
def attention_timeline(main, headers):
    # the probed tiles are known by head and segment
    edit(headers, "varlen_attention_fp8_sm90a_tile.cuh",
         ("  int len;          // the segment's keys\n", "  int len;          // the segment's keys\n  int h, seg;\n"))
    edit(headers, "varlen_attention_fp8_sm90a_consumer.cuh",
         ("    Tile tl;\n", "    Tile tl;\n    tl.h = info.row[3];\n    tl.seg = info.row[4];\n"))
    probe = "    h3_probe_at(probe_row, st, {});\n".format
    after = lambda anchor, k: (anchor, anchor + probe(k))  # noqa: E731
    edit(headers, "varlen_attention_fp8_sm90a_stage_loop.cuh",
         ('#include "varlen_attention_fp8_sm90a_tile.cuh"\n', '#include "varlen_attention_fp8_sm90a_tile.cuh"\n' + PROBE_C),
         ("  float mo0 = neg_inf(), mo1 = neg_inf();  // the max O's values are at\n",
          "  float mo0 = neg_inf(), mo1 = neg_inf();  // the max O's values are at\n"
          "  unsigned long long* const probe_row = (threadIdx.x & 127) == 0 && tl.h == 0 && tl.seg == 0 &&\n"
          "      blockIdx.x < 132 ? h3_probe + (blockIdx.x * 2 + (threadIdx.x >> 7) - 1) * 512 : nullptr;\n"),
         after("      fence_regs(s_hi[i]);\n    }\n", 0),
         after("    row_max<true>(fmaxf(x0, y0), fmaxf(x1, y1), m0, m1, a0, a1, cb0, cb1);\n", 1),
         after("    block_exp<true, kExactL>(s, pa, m0, m1, l0, l1, a0, a1, cb0, cb1, valid, t);\n", 2),
         after("    issue_pv(part, pa, stage_base + kKBytes, lp, ones, true, chain_on);\n    wgmma_commit();\n", 3),
         after("    block_exp<true, kExactL>(s_hi, pb, m0, m1, l0, l1, 1.f, 1.f, cb0, cb1, valid - kBlockKeys, t);"
               "\n", 4),
         # the next keys' wait ends inside a block: its probe follows the brace
         after("      sk = stage_scale(sm, slot.index, lane);\n    }\n", 5),
         after("    wgmma_wait<1>();  // both halves' P V are done; the next S may still run\n", 6),
         ("    wgmma_wait<0>();\n  }\n}", "    wgmma_wait<0>();\n" + probe(7) + "  }\n}"))
    return main, headers


# The attention's work tiles: clock64 at chosen points of each tile (lane 0 of each consumer
# warpgroup, a CTA's first 64 tiles), into h3_probe[cta][consumer][tile][point]. Each point: the
# header, the anchor, whether the probe goes before or after it, the anchor's indentation, and where
# the header's code holds the probe row under another name, that name.
TILE_PROBE_AT = {
    "tile start": ("consumer", "  // the loading warp's copy of the plan's row and s_v\n", "after", 4),
    "Q landed": ("consumer", "    q_slot.advance();\n", "after", 4),
    "Q quantized": ("consumer", "    named_barrier_sync<1, 256>();", "before", 4),
    "both consumers": ("consumer", "  // both consumers: they start every tile together\n", "after", 4),
    "stage loop": ("stage_loop", "  // the tile's first S; the later ones are issued a stage ahead\n", "after", 6),
    "first keys landed": ("stage_loop", "      sk = stage_scale(sm, slot.index, lane);\n      wgmma_fence();\n",
                          "before", 6),
    "first S issued": ("stage_loop", "      issue_s128(s, s_hi, a_q, stage_base);\n      wgmma_commit();\n",
                       "after", 6),
    "first S waited": ("stage_loop", "      if (tl.n_stages >= 2 && consumer == 1)", "before", 6),
    "half stage": ("stage_loop", "  // half a stage behind\n", "after", 6),
    "stages done": ("consumer", "    finish_tile(", "before", 4),
    "epilogue sums": ("epilogue", "  write_rows_staged([&]", "before", 2),  # the rows' l and its reciprocal
    "out staged": ("epilogue", "  __syncwarp();\n", "after", 2, "probe"),
    "out stored": ("epilogue", "  __syncwarp();  // the warp's next epilogue", "before", 2, "probe"),
    "epilogue done": ("consumer", " * kOutWarpBytes);\n", "after", 4),
}
TILE_POINTS = ("tile start", "Q landed", "Q quantized", "both consumers", "first S waited", "half stage",
               "stages done", "epilogue done")
TILE_POINTS_S = ("tile start", "Q quantized", "both consumers", "stage loop", "first keys landed", "first S issued",
                 "first S waited", "stages done")  # finer between the consumers' meeting and the first S
TILE_POINTS_E = ("tile start", "both consumers", "first S waited", "stages done", "epilogue sums", "out staged",
                 "out stored", "epilogue done")  # finer about the epilogue


def tile_probes(main, headers, points):
    """The probes of `points` (8 names of TILE_PROBE_AT, in the order the tile passes them)."""
    edit(headers, "varlen_attention_fp8_sm90a_tile.cuh",
         ("  float c0, c1;", "  unsigned long long* probe;\n  float c0, c1;"),
         ("struct Tile {", PROBE_C + "\nstruct Tile {"))
    row = ("    unsigned long long* const probe_row = (threadIdx.x & 127) == 0 && blockIdx.x < 132 && nth < 64\n"
           "        ? h3_probe + ((blockIdx.x * 2 + consumer) * 64 + nth) * 8 : nullptr;\n")
    edit(headers, "varlen_attention_fp8_sm90a_consumer.cuh",
         ("    Tile tl;", "    Tile tl;\n    tl.probe = probe_row;"),
         ("    const TileInfo& info", row + "    const TileInfo& info"))
    # write_rows_staged takes the tile's probe row (a defaulted parameter: nothing else changes)
    edit(headers, "varlen_attention_fp8_sm90a_epilogue.cuh",
         ("float softmax_scale, u8* stage) {", "float softmax_scale, u8* stage, unsigned long long* probe = nullptr) {"),
         ("p.softmax_scale, stage);", "p.softmax_scale, stage, tl.probe);"))
    for k, name in enumerate(points):
        where, anchor, side, indent, *var = TILE_PROBE_AT[name]
        row = var[0] if var else "probe_row" if where == "consumer" else "tl.probe"
        probe = f"{' ' * indent}h3_probe_at({row}, 0, {k});\n"
        edit(headers, f"varlen_attention_fp8_sm90a_{where}.cuh",
             (anchor, probe + anchor if side == "before" else anchor + probe))
    return main, headers


@patch("tile_timeline")
def tile_timeline(main, headers):
    return tile_probes(main, headers, TILE_POINTS)


@patch("tile_timeline_s")
def tile_timeline_s(main, headers):
    return tile_probes(main, headers, TILE_POINTS_S)


@patch("tile_timeline_e")
def tile_timeline_e(main, headers):
    return tile_probes(main, headers, TILE_POINTS_E)


# Q quantized by the loading warpgroup's three idle warps instead of the consumers: a consumer's 64
# rows of the next tile as soon as that consumer has waited for its last S of this tile (the last
# stage's stand-in S reads no Q), so that a tile's start holds no quantization (1100-1750 cycles a
# tile, lab/tile_timeline.py). s_q through shared memory; a consumer waits for its rows on named
# barrier 3 + c (an mbarrier's phase, kept across the tile, spilled in the exact-l build); three
# tile slots (the loader now runs up to two tiles ahead of an epilogue). The warpgroup's 40
# registers hold no division (its slow path is a call, which spilled): lab/q_by_loader_check.py
# checks the arithmetic that replaces it. Each consumer thread arrives on q8_free once a tile, after
# its last S (a tile of no keys, which no plan makes, would not). Not yet run on a GPU.
Q_BY_LOADER_C = r"""
constexpr float kInv448 = 1.f / 448.f;  // RN(1 / 448)

// RN(a / s) for a finite a and a normal s > 0, by integer steps (no call to a division's slow
// path); +-Inf past the largest float
__device__ __forceinline__ float div_rn_exact(float a, float s) {
  const u32 ab = __float_as_uint(a), sb = __float_as_uint(s);
  const u32 sign = ab & 0x80000000u;
  u32 ma = ab & 0x7FFFFFu, ms = (sb & 0x7FFFFFu) | 0x800000u;
  int e = (int)((ab >> 23) & 0xFFu);
  if (e == 0) {  // a zero or subnormal a
    if (ma == 0u) return a;
    const int shift = __clz(ma) - 8;
    ma <<= shift;
    e = 1 - shift;
  }
  ma |= 0x800000u;
  e += 127 - (int)((sb >> 23) & 0xFFu);  // the quotient's biased exponent when ma >= ms
  if (ma < ms) {
    ma <<= 1;
    --e;
  }
  u32 q = 0u;  // 24 bits of the quotient's significand and a rounding bit
#pragma unroll 1
  for (int i = 0; i < 25; ++i) {
    q <<= 1;
    if (ma >= ms) {
      ma -= ms;
      q |= 1u;
    }
    ma <<= 1;
  }
  u32 sticky = ma;
  if (e <= 0) {  // a subnormal quotient: k more bits go below its last place
    const int k = min(1 - e, 26);
    sticky |= q & ((1u << k) - 1u);
    q >>= k;
    e = 0;
  }
  u32 m = q >> 1;  // to nearest, ties to even; a carry out of a subnormal makes it normal
  if ((q & 1u) && (sticky != 0u || (m & 1u))) ++m;
  if (m == 0x1000000u) {
    m >>= 1;
    ++e;
  }
  if (e >= 255) return __uint_as_float(sign | 0x7F800000u);
  return __uint_as_float(sign | (e > 0 ? ((u32)e << 23) | (m & 0x7FFFFFu) : m));
}

// RN(a / s) of a row that the fast path does not take, up to the e4m3 code: an infinite s (an
// infinite amax) gives +-0 and NaN for an infinite a; an s below kMinFastScale is scaled with a by
// 2^64, exactly, into div_rn_exact's range. (A zero or NaN s gives zero codes before this.)
__device__ __forceinline__ float quotient_rare(float a, float s) {
  if (s == __int_as_float(0x7f800000))
    return __uint_as_float(fabsf(a) == s ? 0x7fffffffu : __float_as_uint(a) & 0x80000000u);
  return s < kMinFastScale ? div_rn_exact(a * 0x1p64f, s * 0x1p64f) : div_rn_exact(a, s);
}

// e4m3x4_from_bf16x4's codes by quotient_rare
__device__ __forceinline__ u32 e4m3x4_rare(u32 lo, u32 hi, float s) {
  if (!(s > 0.f)) return 0u;  // a zero row (and, as in the reference, a NaN row) quantizes to 0
  const auto pair = [&](u32 w) {
    return (u32)e4m3x2_from_f32(quotient_rare(__uint_as_float(w << 16), s),
                                quotient_rare(__uint_as_float(w & 0xFFFF0000u), s));
  };
  return pair(lo) | pair(hi) << 16;
}

// Rows 8 pass .. 8 pass + 7 of a consumer's 64: lane l takes quarter l % 4 (32 channels, four
// 16-byte pieces, in an order rotated by the row: the loads two lanes to a bank group, the 8-byte
// stores of the codes one) of row l / 4, read twice (the amax, then the codes: held between
// them, the row spilled the loop's state in the warpgroup's 40 registers)
__device__ __forceinline__ void quantize_rows_lean(u32 staged, u32 q8, float* s_q, int pass) {
  // the lane read here (volatile): read once outside the loop of passes, its pieces' offsets were
  // kept across it and spilled the loop's state
  int lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  const int r = lane >> 2, qt = lane & 3;
  const int row = 8 * pass + r;
  const u32 src = staged + row * 2 * HD + qt * 64;
  u32 m = 0u;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint4 w = lds128(src + (((k + r) & 3) << 4));
    m = abs_max2(abs_max2(abs_max2(abs_max2(m, w.x), w.y), w.z), w.w);
  }
  m = __vmaxu2(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
  m = __vmaxu2(m, __shfl_xor_sync(0xFFFFFFFFu, m, 2));
  // s = RN(amax / 448) and inv = RN(1 / s) without a division (whose slow path is a call): the
  // product by RN(1 / 448) with one correction, and one Newton step from rcp.approx, exact wherever
  // s is in the fast range (lab/q_by_loader_check.py); the rare rows divide by integer steps
  const float amax = __uint_as_float(max(m & 0xFFFFu, m >> 16) << 16);
  const float q = __fmul_rn(amax, kInv448);
  float s = __fmaf_rn(__fmaf_rn(-q, 448.f, amax), kInv448, q);
  // piece k's 8 codes: chunk 4 qt + (k + r) % 4 of the row's 16, the 128-byte swizzle
  const auto at = [&](int k) {
    const int chunk = 4 * qt + ((k + r) & 3);
    return q8 + row * HD + ((((chunk >> 1) ^ (row & 7))) << 4) + (chunk & 1) * 8;
  };
  if (__all_sync(0xFFFFFFFFu, s >= kMinFastScale && s < __int_as_float(0x7f800000))) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(s));
    const float inv = __fmaf_rn(__fmaf_rn(-s, y, 1.f), y, y);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint2 codes = e4m3x8(lds128(src + (((k + r) & 3) << 4)), s, inv);
      asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(at(k)), "r"(codes.x), "r"(codes.y) : "memory");
    }
  } else {  // rare: integer divisions
    s = amax < __int_as_float(0x7f800000) ? div_rn_exact(amax, 448.f) : amax;
#pragma unroll 1
    for (int k = 0; k < 4; ++k) {
      const uint4 v = lds128(src + (((k + r) & 3) << 4));
      asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(at(k)), "r"(e4m3x4_rare(v.x, v.y, s)),
                   "r"(e4m3x4_rare(v.z, v.w, s))
                   : "memory");
    }
  }
  if (qt == 0) s_q[row] = s;
}

// Threads 32-127, warps qw = 0..2: per tile, once its bf16 Q has landed (q_full), each consumer's
// 64 rows once that consumer is done with its previous rows (q8_free[c]): passes qw, qw + 3, qw + 6
// of its 8 passes of 8 rows; then named barrier 3 + c. The staging is released (q_empty) when both
// halves are read. Every thread arrives itself. The same codes and s_q as quantize_q_rows.
__device__ __forceinline__ void quantize_tiles(const AttentionParams& p, const SharedMap& sm, const Barriers& bar) {
  const int qw = (threadIdx.x >> 5) - 1;
  u32 phase = 0;
  for (int nth = 0;; ++nth, phase ^= 1) {
    if (blockIdx.x + nth * gridDim.x >= p.n_tiles) break;
    mbar_wait(bar.q_full, phase);
#pragma unroll 1
    for (int c = 0; c < kConsumers; ++c) {
      mbar_wait(&bar.q8_free[c], phase ^ 1);
#pragma unroll 1
      for (int pass = qw; pass < 8; pass += 3)
        quantize_rows_lean(sm.q_staged + c * 64 * 2 * HD, sm.q + c * 64 * HD, sm.s_q + 64 * c, pass);
      fence_proxy_async_shared();
      asm volatile("bar.arrive %0, 224;\n" ::"r"(3 + c) : "memory");
    }
    mbar_arrive(bar.q_empty);
  }
}
"""


@patch("q_by_loader")
def q_by_loader(main, headers):
    edit(headers, "varlen_attention_fp8_sm90a_layout.cuh",
         ("  float* stage_sk;  // [kStages]: s_k of the stage's key block and head, written with its loads\n",
          "  float* stage_sk;  // [kStages]: s_k of the stage's key block and head, written with its loads\n"
          "  float* s_q;  // [BQ]\n"),
         ("  u64* q_empty;\n", "  u64* q_empty;\n  u64* q8_free;\n"),
         # the quantizing warps' registers (at 24 they spilled 68 bytes), from the consumers'
         ("constexpr int kProducerRegs = 24; ", "constexpr int kProducerRegs = 40; "),
         ("constexpr int kConsumerRegs = 240;", "constexpr int kConsumerRegs = 232;"))
    edit(headers, "varlen_attention_fp8_sm90a_producer.cuh",
         ("    TileInfo& info = sm.info[nth & 1];", "    TileInfo& info = sm.info[nth % 3];"))
    headers["varlen_attention_fp8_sm90a_producer.cuh"] += Q_BY_LOADER_C
    edit(headers, "varlen_attention_fp8_sm90a_consumer.cuh",
         ("  PipelineState<1> q_slot;\n", ""),
         ("    const TileInfo& info = sm.info[nth & 1];", "    const TileInfo& info = sm.info[nth % 3];"),
         ("""    mbar_wait(bar.q_full, q_slot.phase);
    q_slot.advance();
    const float sq = quantize_q_rows(sm.q_staged + consumer * 64 * 2 * HD, sm.q + consumer * 64 * HD, warp, lane);
    // every thread's reads of the staged rows and of the previous tile's slot are done: the next
    // tile's may land (each thread arrives after its own reads, so that no warp-level ordering
    // is assumed)
    mbar_arrive(bar.q_empty);
    fence_proxy_async_shared();
    named_barrier_sync<1, 256>();  // both consumers: they start every tile together
    // s_q of rows g and g + 8 (lanes 2 g and 2 g + 16 quantized them); rows past the segment
    // give S = 0 and are not written
    const float sq0 = __shfl_sync(0xFFFFFFFFu, sq, 2 * g), sq1 = __shfl_sync(0xFFFFFFFFu, sq, 2 * g + 16);
""", """    // its rows quantized: named barrier 3 + consumer, whose 96 quantizing threads arrive (no phase
    // to keep: an mbarrier's spilled in the exact-l build); ids as constants (a run-time id moved
    // the stage loop's descriptors between its wgmmas)
    if (consumer == 0)
      named_barrier_sync<3, 224>();
    else
      named_barrier_sync<4, 224>();
    named_barrier_sync<1, 256>();  // both consumers: they start every tile together
    const float sq0 = sm.s_q[64 * consumer + 16 * warp + g], sq1 = sm.s_q[64 * consumer + 16 * warp + g + 8];
"""))
    edit(headers, "varlen_attention_fp8_sm90a_stage_loop.cuh",
         ("      wgmma_wait<0>();\n      if (tl.n_stages >= 2 && consumer == 1)",
          "      wgmma_wait<0>();\n      if (tl.n_stages == 1) mbar_arrive(&bar.q8_free[consumer]);\n"
          "      if (tl.n_stages >= 2 && consumer == 1)"),
         ("    wgmma_wait<0>();\n  }\n}", "    wgmma_wait<0>();\n"
          "    if (st + 2 == tl.n_stages) mbar_arrive(&bar.q8_free[consumer]);  // its last S read Q\n  }\n}"))
    edit(headers, "varlen_attention_fp8_sm90a_one_block.cuh",
         ("  lane_max<false>(s, mx0, mx1, cb0, cb1, tl.len, t);\n",
          "  lane_max<false>(s, mx0, mx1, cb0, cb1, tl.len, t);\n"
          "  mbar_arrive(&bar.q8_free[(threadIdx.x >> 7) - 1]);  // S's Q reads are done\n"))
    m = {"main": main}
    edit(m, "main",
         ("  __shared__ __align__(16) TileInfo info[2];\n",
          "  __shared__ __align__(16) TileInfo info[3];\n"
          "  __shared__ __align__(8) u64 q8_free[kConsumers];\n"
          "  __shared__ float s_q[BQ];\n"),
         ("  sm.stage_sk = stage_sk;\n", "  sm.stage_sk = stage_sk;\n  sm.s_q = s_q;\n"),
         ("  const Barriers bar{full, empty, &q_full, &q_empty};",
          "  const Barriers bar{full, empty, &q_full, &q_empty, q8_free};"),
         ("    mbar_init(&q_empty, 128 * kConsumers);\n",
          "    mbar_init(&q_empty, 96);\n    for (int c = 0; c < kConsumers; ++c) {\n"
          "      mbar_init(&q8_free[c], 128);\n    }\n"),
         ("    if (threadIdx.x < kLoaderLanes) produce(params, sm, bar, threadIdx.x);\n",
          "    if (threadIdx.x < kLoaderLanes) produce(params, sm, bar, threadIdx.x);\n"
          "    else quantize_tiles(params, sm, bar);\n"))
    return m["main"], headers


if __name__ == "__main__":
    # python lab/patched_builds.py SCRIPT [args]: runs lab/SCRIPT.py with the Lab builds in its namespace
    script = Path(__file__).resolve().parent / f"{sys.argv[1]}.py"
    sys.argv = [str(script)] + sys.argv[2:]
    sys.path.insert(0, str(script.parent))
    runpy.run_path(str(script), init_globals=dict(LabMlpBuild=LabMlpBuild, LabAttentionBuild=LabAttentionBuild),
                   run_name="__main__")
