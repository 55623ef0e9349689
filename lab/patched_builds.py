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


@patch("attention_timeline")
def attention_timeline(main, headers):
    h = "varlen_attention_fp8_sm90a_stage_loop.cuh"
    t = headers[h]
    t = replace_once(t, '#include "varlen_attention_fp8_sm90a_tile.cuh"\n',
                     '#include "varlen_attention_fp8_sm90a_tile.cuh"\n'
                     "__device__ unsigned long long h3_probe[132 * 2 * 64 * 8];\n"
                     "__device__ __forceinline__ void h3_probe_at(unsigned long long* row, int st, int k) {\n"
                     "  u64 c;\n"
                     '  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");\n'
                     "  if (row != nullptr && st < 64) row[st * 8 + k] = c;\n"
                     "}\n", h)
    t = replace_once(t, "  float mo0 = neg_inf(), mo1 = neg_inf();  // the max O's values are at\n",
                     "  float mo0 = neg_inf(), mo1 = neg_inf();  // the max O's values are at\n"
                     "  unsigned long long* const probe_row = (threadIdx.x & 127) == 0 && tl.h == 0 && tl.seg == 0 &&\n"
                     "      blockIdx.x < 132 ? h3_probe + (blockIdx.x * 2 + (threadIdx.x >> 7) - 1) * 512 : nullptr;\n", h)
    probe = "    h3_probe_at(probe_row, st, {});\n".format
    for anchor, k in (("      fence_regs(s_hi[i]);\n    }\n", 0),
                      ("    row_max<true>(fmaxf(x0, y0), fmaxf(x1, y1), m0, m1, a0, a1, cb0, cb1);\n", 1),
                      ("    block_exp<true, kExactL>(s, pa, m0, m1, l0, l1, a0, a1, cb0, cb1, valid, t);\n", 2),
                      ("    issue_pv(part, pa, stage_base + kKBytes, lp, ones, true, chain_on);\n    wgmma_commit();\n", 3),
                      ("    block_exp<true, kExactL>(s_hi, pb, m0, m1, l0, l1, 1.f, 1.f, cb0, cb1, valid - kBlockKeys, t);\n",
                       4),
                      ("    wgmma_wait<1>();  // both halves' P V are done; the next S may still run\n", 6)):
        t = replace_once(t, anchor, anchor + probe(k), h)
    # the next keys' wait and the stage's last wait end inside a block: their probes follow its brace
    t = replace_once(t, "      mbar_wait(&bar.full[slot.index], slot.phase);\n    }\n    wgmma_fence();\n",
                     "      mbar_wait(&bar.full[slot.index], slot.phase);\n    }\n" + probe(5) + "    wgmma_fence();\n", h)
    t = replace_once(t, "    wgmma_wait<0>();\n  }\n}", "    wgmma_wait<0>();\n" + probe(7) + "  }\n}", h)
    headers[h] = t
    return main, headers


if __name__ == "__main__":
    # python lab/patched_builds.py SCRIPT [args]: runs lab/SCRIPT.py with the Lab builds in its namespace
    script = Path(__file__).resolve().parent / f"{sys.argv[1]}.py"
    sys.argv = [str(script)] + sys.argv[2:]
    sys.path.insert(0, str(script.parent))
    runpy.run_path(str(script), init_globals=dict(LabMlpBuild=LabMlpBuild, LabAttentionBuild=LabAttentionBuild),
                   run_name="__main__")
