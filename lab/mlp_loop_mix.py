"""The static instruction mix of the Hopper MLP GEMMs (FC1, FC2 of cuda_src/mlp_fp8_sm90a.cu) from SASS, per kernel:
registers: cuobjdump's REG / STACK / LOCAL, ptxas's spill bytes and injected wgmma waits (C7517, `ours` only).
main loop: the shortest backward branch's body holding the most wgmma. Per k-step (BK of K over the tile, one
  consumer warp; an unrolled body is divided by its k-steps), on the path of an interior k-step (the body less the
  forward-branch regions that wait for all wgmma groups and hold none: the unit's last slice): by class, the wgmma
  and their commit groups, the wgmma waits in order, whether a wait or arrive sits between the wgmmas of one group
  (serialization), the instructions from a wait for all groups to the next wgmma (a drain), and the FP32
  instructions per accumulator register per 128 of K (the promotion).
epilogue: the code from the main loop's exit to the tile loop's back edge, less the split-tile combine (the first
  forward-branch region there holding a memory barrier or an atomic): classes, global and shared stores, MUFU,
  conversions.
feed: the producer's loop (instructions and TMA loads a k-step) and the bytes a CTA loads a k-step, per SM clock at
  the tensor rate.
estimate: a k-step's tensor clocks, 2 BM BN BK / (peak / SMs / clock); per scheduler (2 consumer warps) the loop's
  and the promotion's issue clocks (FP32 at 1.19 clocks), the epilogue's per tile (issue; the quarter-rate unit:
  MUFU and F2F (taken as one unit) at --mufu, F2FP at 4.19), against the tensor clocks, as ms at --m if not overlapped.

    python lab/mlp_loop_mix.py [--m 16384 --clock 1.83e9 --peak 1930e12] ours [--defines H3_STAGES=4 ...]
    python lab/mlp_loop_mix.py cubin FILE.cubin --function SUBSTRING [--bn 128 --wg-n 128 --k 5376 --n 28672]

`ours` builds cuda_src/mlp_fp8_sm90a.cu with this checkout's NVRTC (MlpBuild().defines() plus --defines);
`cubin` reads any cubin's kernel (another GEMM: its CTA tile --bm x --bn, a consumer warpgroup's columns --wg-n,
the GEMM's --k and --n for the per-tile figures; the defaults are FC1's). No GPU; needs cuobjdump
(lab/sass_diff.py finds it); the SASS parsing is lab/loop_mix.py's.
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lab.loop_mix import TARGET, functions, source_parsers  # noqa: E402
from lab.sass_diff import cuobjdump, sass_text  # noqa: E402

# (opcode prefix, class), first match wins: finer than loop_mix's CLASSES for a GEMM.
CLASSES = (("HGMMA", "wgmma"), ("QGMMA", "wgmma"), ("WARPGROUP", "wgmma wait/arrive"),
           ("SYNCS", "mbarrier"), ("BAR", "barrier"), ("MEMBAR", "barrier"), ("FENCE", "barrier"),
           ("UTMA", "TMA"), ("BRA", "branch"), ("BSSY", "branch"), ("BSYNC", "branch"), ("EXIT", "branch"),
           ("ULDC", "uniform"), ("R2UR", "uniform"), ("S2UR", "uniform"), ("VOTEU", "uniform"), ("U", "uniform"),
           ("FFMA", "FP32"), ("FMUL", "FP32"), ("FADD", "FP32"), ("FMNMX", "FP32"), ("FSETP", "FP32 compare"),
           ("FSEL", "FP32 compare"), ("MUFU", "MUFU"), ("F2F", "convert"), ("I2F", "convert"), ("F2I", "convert"),
           ("LDG", "global load"), ("STG", "global store"), ("ATOM", "global atomic"), ("RED", "global atomic"),
           ("LDSM", "shared"), ("STSM", "shared"), ("LDS", "shared"), ("STS", "shared"), ("LDC", "constant"),
           ("MOV", "move"), ("CS2R", "move"), ("S2R", "move"), ("SHFL", "shuffle"), ("IMAD", "integer"),
           ("IADD", "integer"), ("LOP", "integer"), ("ISETP", "integer"), ("SEL", "integer"), ("SHF", "integer"),
           ("LEA", "integer"), ("PRMT", "integer"), ("IABS", "integer"), ("VIADD", "integer"), ("PLOP", "integer"),
           ("P2R", "integer"), ("R2P", "integer"))
KERNELS = ("h3_mlp_fc1_wgmma", "h3_mlp_fc2_wgmma")  # stems: the entries are f"{stem}_n{width}"
CONSUMER_WARPS_PER_SCHEDULER = 2  # 8 consumer warps over the SM's 4 schedulers
FP32_CLOCKS = 1.19  # FFMA, clocks per warp instruction and scheduler (lab/sm90_pipe_rates.py)
F2FP_CLOCKS = 4.19  # F2FP e4m3x2, the same


def cls(op):
    return next((c for prefix, c in CLASSES if op.startswith(prefix)), "other")


def is_gmma(op):
    return op.startswith(("HGMMA", "QGMMA"))


def branches(code, labels):
    """[(address, target)] of every branch with a resolvable target."""
    out = []
    for addr, op, args in code:
        t = TARGET.search(args)
        if op.startswith("BRA") and t:
            out.append((addr, labels.get(t.group(1), addr + 1) if t.group(1) else int(t.group(2), 16)))
    return out


def span(code, lo, hi, skip=()):
    """The instructions in [lo, hi], less those in the [start, end) regions of skip."""
    return [(a, o, x) for a, o, x in code if lo <= a <= hi and not any(s <= a < e for s, e in skip)]


def shortest_loop(code, labels, what):
    """(start, end) of the shortest backward branch's body holding the most instructions `what` picks."""
    found = [(t, a, sum(1 for _, o, _ in span(code, t, a) if what(o))) for a, t in branches(code, labels) if t <= a]
    found = [f for f in found if f[2]]
    if not found:
        return None
    most = max(f[2] for f in found)
    start, end, _ = min((f for f in found if f[2] == most), key=lambda f: f[1] - f[0])
    return start, end


def forward_regions(code, labels, lo, hi):
    """[(first skipped address, target)] of the forward branches in [lo, hi] whose target is inside it."""
    step = code[1][0] - code[0][0]
    return sorted((a + step, t) for a, t in branches(code, labels) if lo <= a < t <= hi + step)


def gmma_groups(ins):
    """[[full wgmma opcode, ...] per commit group], whether a wait or arrive sits inside a group, and the
    chains (a wgmma that does not accumulate, `RZ, !UPT`, starts one): [[width N, depth K, count]]."""
    groups, cur, broken, chains = [], None, False, []
    for _, op, args in ins:
        if is_gmma(op):
            full = op + args.split()[0]  # loop_mix's LINE stops an opcode at the "x" of the shape
            cur = (cur or []) + [full]
            width, depth = map(int, re.search(r"\.64x(\d+)x(\d+)", full).groups())
            if "!UPT" in args or not chains:
                chains.append([width, depth, 0])
            chains[-1][2] += 1
            if "gsb0" in args:
                groups.append(cur)
                cur = None
        elif op.startswith("WARPGROUP") and cur:
            broken = True
    return groups, broken, chains


def waits(ins):
    return [int(m.group(1), 16) for _, op, args in ins if op.startswith("WARPGROUP.DEPBAR")
            for m in [re.search(r"0x([0-9a-f]+)", args)] if m]


def drains(ins):
    """Instructions from each wait for all wgmma groups to the next wgmma, around the loop."""
    out, n = [], len(ins)
    for i, (_, op, args) in enumerate(ins):
        if op.startswith("WARPGROUP.DEPBAR") and re.search(r"0x0\b", args):
            out.append(next((j for j in range(1, n) if is_gmma(ins[(i + j) % n][1])), n) - 1)
    return out


def table(counter, per=1.0, indent="    "):
    return "\n".join(f"{indent}{c:<18} {n / per:8.1f}" for c, n in counter.most_common())


def max_register(ins):
    regs = [int(r) for _, _, args in ins for r in re.findall(r"\bR(\d+)\b", args)]
    return f"R{max(regs)}" if regs else "-"


def res_usage(path):
    """{kernel: 'REG:n STACK:n LOCAL:n'} from cuobjdump -res-usage."""
    text = subprocess.run([cuobjdump(), "-res-usage", path], capture_output=True, text=True, check=True).stdout
    return {m.group(1): " ".join(re.findall(r"(?:REG|STACK|LOCAL):\d+", m.group(2)))
            for m in re.finditer(r"Function (\S+):\s*\n\s*(.*)", text)}


def ptxas_notes(log, name):
    """Spill bytes and the count of wgmma waits ptxas injected (C7517) for `name`, from ptxas -v."""
    block = log.split(f"Compiling entry function '{name}'", 1)[-1].split("Compiling entry function", 1)[0]
    frame = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", block)
    injected = len(re.findall(rf"C7517\).*?function '{name}'", log))
    return f"; ptxas: {frame.group(1)} / {frame.group(2)} bytes spilled (stores / loads), {injected} injected " \
           f"wgmma wait(s) (C7517)" if frame else ""


def analyse(name, code, labels, g, a, notes=""):
    """Prints the main loop, epilogue, feed and estimate of one kernel. g: bm, bn (CTA tile), wg_n (one consumer
    warpgroup's columns), bk, k, n (the GEMM)."""
    print(f"{name[:110]}: {len(code)} instructions; {notes}")
    loop = shortest_loop(code, labels, is_gmma)
    if loop is None:
        print("  no wgmma loop")
        return
    lo, hi = loop
    regions = forward_regions(code, labels, lo, hi)
    last_only = [r for r in regions if 0 in waits(span(code, r[0], r[1] - 1))
                 and not any(is_gmma(o) for _, o, _ in span(code, r[0], r[1] - 1))]
    path = span(code, lo, hi, last_only)
    groups, broken, chains = gmma_groups(path)
    # a chain sums width / 2 registers a thread over depth x count of K; a k-step is wg_n / 2 registers over bk
    ksteps = sum(w * d * n for w, d, n in chains) / (g["wg_n"] * g["bk"])
    acc_units = ksteps * g["wg_n"] / 2  # accumulator registers x (k-steps of bk)
    c = collections.Counter(cls(o) for _, o, _ in path)
    fp32 = c["FP32"]
    shapes = collections.Counter(op for grp in groups for op in grp)
    print(f"  main loop {lo:#x}-{hi:#x}: {len(span(code, lo, hi))} instructions, {ksteps:g} k-step(s) of BK = "
          f"{g['bk']}; an interior k-step: {len(path) / ksteps:.1f}"
          + (f" (less the last slice's {', '.join(f'{s:#x}-{e:#x}' for s, e in last_only)})" if last_only else ""))
    for s, e in regions:
        r = collections.Counter(cls(o) for _, o, _ in span(code, s, e - 1))
        print(f"    conditional {s:#x}-{e:#x}: {sum(r.values())} ({', '.join(f'{k} {v}' for k, v in r.most_common(4))})"
              + (": the unit's last slice" if (s, e) in last_only else ""))
    d = drains(path)
    print(f"    wgmma {sum(shapes.values()) / ksteps:g} a k-step ({', '.join(f'{v} {k}' for k, v in shapes.items())} "
          f"a body) in commit groups of {'/'.join(str(len(grp)) for grp in groups)}; waits (DEPBAR.LE gsb0, n) "
          f"{waits(path)}; {'a wait or arrive INSIDE a group: serialized' if broken else 'none inside a group'}; "
          + (f"{len(d) / ksteps:g} drain(s) a k-step (waits for all groups), {sum(d) / len(d):.0f} instructions from "
             f"each to the next wgmma" if d else "no drain"))
    print(f"    FP32 {fp32 / ksteps:.1f} a k-step = {fp32 / acc_units:.2f} per accumulator register "
          f"({g['wg_n'] // 2} a thread) per {g['bk']} of K; highest register {max_register(span(code, lo, hi))}")
    print(table(c, ksteps))

    # the tile loop: the shortest backward branch's body that strictly holds the main loop
    outer = [(t, br) for br, t in branches(code, labels) if t < lo and br > hi]
    tile_end = min(outer, key=lambda f: f[1] - f[0])[1] if outer else code[-1][0]
    split = [r for r in forward_regions(code, labels, hi + 1, tile_end)
             if any(o.startswith(("MEMBAR", "ATOM", "RED")) for _, o, _ in span(code, r[0], r[1] - 1))][:1]
    epi = span(code, hi + 1, tile_end, split)
    e = collections.Counter(cls(o) for _, o, _ in epi)
    ops = collections.Counter(o for _, o, _ in epi)
    mufu = {o: n for o, n in ops.items() if o.startswith("MUFU")}
    conv = {o: n for o, n in ops.items() if o.startswith(("F2F", "I2F", "F2I"))}
    stores = {o: n for o, n in ops.items() if o.startswith(("STG", "STS", "STSM", "UTMASTG"))}
    print(f"  epilogue {hi + 16:#x}-{tile_end:#x}: {len(epi)} instructions a tile and consumer warp"
          + (f" (less the split-tile combine {split[0][0]:#x}-{split[0][1]:#x}, "
             f"{len(span(code, split[0][0], split[0][1] - 1))})" if split else "")
          + f", {len(epi) / (g['wg_n'] // 2):.1f} per accumulator register; stores {stores}, global loads "
          f"{e['global load']}; MUFU {mufu}; conversions {conv}; highest register {max_register(epi)}")
    print(table(e))

    clk_step = 2 * g["bm"] * g["bn"] * g["bk"] / (a.peak / a.sms / a.clock)
    producer = shortest_loop(code, labels, lambda o: o.startswith("UTMALDG"))
    stage = (g["bm"] + g["bn"]) * g["bk"]
    if producer:
        p = span(code, *producer)
        print(f"  feed: producer loop {producer[0]:#x}-{producer[1]:#x}, {len(p)} instructions, "
              f"{sum(1 for _, o, _ in p if o.startswith('UTMALDG'))} TMA loads a pass; a CTA k-step loads {stage} "
              f"bytes = {stage / clk_step:.1f} bytes an SM clock at the tensor rate "
              f"({stage / clk_step * a.sms * a.clock / 1e12:.1f} TB/s over {a.sms} SMs, before any multicast)")

    # issue estimate per scheduler: 2 consumer warps share it
    w = CONSUMER_WARPS_PER_SCHEDULER
    loop_issue = w * (len(path) + (FP32_CLOCKS - 1) * fp32) / ksteps
    promo = w * FP32_CLOCKS * fp32 / ksteps
    epi_issue = w * (len(epi) + (FP32_CLOCKS - 1) * (e["FP32"] + e["FP32 compare"]))
    slow = sum(n for o, n in ops.items() if o.startswith(("MUFU", "F2F.", "I2F", "F2I")))
    epi_slow = w * (a.mufu * slow + F2FP_CLOCKS * sum(n for o, n in ops.items() if o.startswith("F2FP")))
    slices = g["k"] // g["bk"]
    tile_clk = slices * clk_step
    tiles_per_sm = -(-a.m // g["bm"]) * (g["n"] // g["bn"]) / a.sms
    ms = lambda clocks: clocks * tiles_per_sm / a.clock * 1e3  # noqa: E731
    print(f"  estimate: a k-step {clk_step:.0f} tensor clocks ({g['bm']}x{g['bn']}x{g['bk']}); per scheduler the "
          f"loop issues {loop_issue:.0f} ({loop_issue / clk_step:.0%}), the promotion {promo:.0f} "
          f"({promo / clk_step:.0%}, {ms(promo * slices):.2f} ms at M = {a.m} if not overlapped)")
    print(f"    a tile: {slices} k-steps, {tile_clk:.0f} tensor clocks ({ms(tile_clk):.2f} ms at M = {a.m}, "
          f"{tiles_per_sm:.1f} tiles an SM); epilogue issue {epi_issue:.0f} ({epi_issue / tile_clk:.1%}), "
          f"quarter-rate unit {epi_slow:.0f} ({slow} MUFU/F2F a warp; {epi_slow / tile_clk:.1%}): "
          f"{ms(max(epi_issue, epi_slow)):.2f} ms if not overlapped")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", type=int, default=16384, help="rows, for the milliseconds")
    p.add_argument("--sms", type=int, default=132)
    p.add_argument("--clock", type=float, default=1.83e9, help="SM clock, Hz")
    p.add_argument("--peak", type=float, default=1930e12, help="dense e4m3 wgmma FLOP/s of the whole GPU")
    p.add_argument("--mufu", type=float, default=8.15, help="clocks per MUFU (and F2F) warp instruction")
    _, c = source_parsers(p)
    for arg, default in (("--bm", 128), ("--bn", 256), ("--wg-n", 256), ("--bk", 128), ("--k", 5376),
                         ("--n", 28672)):
        c.add_argument(arg, type=int, default=default)
    a = p.parse_args()
    if a.what == "cubin":
        code, labels = functions(sass_text(a.file))
        usage = res_usage(a.file)
        g = dict(bm=a.bm, bn=a.bn, wg_n=a.wg_n, bk=a.bk, k=a.k, n=a.n)
        for name in code:
            if all(f in name for f in a.function):
                analyse(name, code[name], labels[name], g, a, usage.get(name, ""))
        return
    from h3kernels._launch import mlp_fp8_sm90a as L
    from h3kernels._runtime import compiler
    from h3kernels.constants import FC1_OUT, FFN, HIDDEN

    defines = {**L.MlpBuild().defines(), **dict(d.split("=", 1) for d in a.defines)}
    cubin, log, _ = compiler.compile_cubin(L.SOURCE, L.ARCH, defines, ("-Xptxas=-v",), use_cache=False)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin + b"\0" * (-len(cubin) % 8))
    code, labels = functions(sass_text(f.name))
    usage = res_usage(f.name)
    for stem, k, n in ((KERNELS[0], HIDDEN, FC1_OUT), (KERNELS[1], FFN, HIDDEN)):
        for width in L.WIDTHS:
            name = L.gemm_kernel(stem, width)
            g = dict(bm=L.BM, bn=width, wg_n=width, bk=L.BK, k=k, n=n)
            analyse(name, code[name], labels[name], g, a, usage.get(name, "") + ptxas_notes(log, name))


if __name__ == "__main__":
    main()
