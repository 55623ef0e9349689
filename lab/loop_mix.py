"""The instruction mix of an attention kernel's main loop, per exponential: how many instructions
of each class (FP32 FMA/MUL/ADD, min/max, MUFU, conversions, wgmma, the rest) one thread issues for
every score it exponentiates, read from SASS. The loop is the shortest backward branch's body that holds at
least half the MUFU.EX2 of the richest one; each score takes one EX2 there, so the counts over the EX2 count are per score
(the few EX2 of the row-maximum rescale make it a slight undercount).

    python lab/loop_mix.py ours [--defines K=V ...]        # the shipped Hopper attention kernel
    python lab/loop_mix.py cubin FILE.cubin --function SUBSTRING [--function ...]

`ours` builds cuda_src/varlen_attention_fp8_sm90a.cu with this checkout's NVRTC (its -D
constants: AttentionBuild().defines() plus --defines). `cubin` reads a function of any cubin, e.g.
one extracted from a wheel with `cuobjdump -xelf all`. Needs cuobjdump (lab/sass_diff.py finds it).
"""
import argparse
import collections
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lab.sass_diff import sass_text  # noqa: E402

LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
LABEL = re.compile(r"^\s*(\.L_x_\d+):")
TARGET = re.compile(r"`\((\.L_x_\d+)\)|^\s*(0x[0-9a-f]+)\s*$")  # a label (nvdisasm) or an address (cuobjdump)
CLASSES = (("HGMMA", "wgmma"), ("QGMMA", "wgmma"), ("BRA", "branch"), ("R2UR", "uniform"), ("S2UR", "uniform"),
           ("U", "uniform"), ("MUFU", "MUFU"), ("FFMA", "FMA"), ("FMUL", "FMUL"), ("FADD", "FADD"),
           ("FMNMX", "min/max"), ("F2FP", "convert"), ("F2F", "convert"), ("I2F", "convert"),
           ("SHFL", "shuffle"), ("FSETP", "compare"), ("FSEL", "select"), ("BAR", "barrier"),
           ("SYNCS", "barrier"), ("WARPGROUP", "barrier"), ("MOV", "move"), ("IMAD", "integer"),
           ("IADD", "integer"), ("LOP", "integer"), ("ISETP", "integer"), ("SEL", "integer"),
           ("LDS", "shared"), ("STS", "shared"), ("LDSM", "shared"), ("STSM", "shared"))


def functions(sass):
    """{function name: [(address, opcode, operands)]} and each function's labels {label: address}."""
    out, labels, name, pending = {}, {}, None, []
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            name = m.group(1)
            out[name], labels[name], pending = [], {}, []
            continue
        if name is None:
            continue
        lab = LABEL.match(line)
        if lab:
            pending.append(lab.group(1))
            continue
        ins = LINE.search(line)
        if ins:
            addr = int(ins.group(1), 16)
            for label in pending:
                labels[name][label] = addr
            pending = []
            out[name].append((addr, ins.group(3), ins.group(4)))
    return out, labels


def loops(code, labels):
    """[(start, end, EX2 count)] of every backward branch's body that holds a MUFU.EX2."""
    found = []
    for addr, op, args in code:
        t = TARGET.search(args)
        if not (op.startswith("BRA") and t):
            continue
        start = labels.get(t.group(1), addr + 1) if t.group(1) else int(t.group(2), 16)
        if start <= addr:
            ex2 = sum(1 for a, o, x in code if start <= a <= addr and o == "MUFU.EX2")
            if ex2:
                found.append((start, addr, ex2))
    return found


def hot_loop(code, labels):
    """The softmax's loop: of the loops holding at least half the most EX2 any loop holds, the
    shortest (an outer tile loop holds the same exponentials and its prologue and epilogue)."""
    found = loops(code, labels)
    if not found:
        return None
    most = max(n for _, _, n in found)
    start, end, _ = min((f for f in found if 2 * f[2] >= most), key=lambda f: f[1] - f[0])
    return start, end


def mix(code, span):
    counts = collections.Counter()
    for addr, op, _ in code:
        if span[0] <= addr <= span[1]:
            cls = next((c for prefix, c in CLASSES if op.startswith(prefix)), "other")
            counts["EX2" if op == "MUFU.EX2" else cls] += 1
    return counts


def report(name, code, labels):
    for start, end, n in loops(code, labels):
        print(f"  loop {start:#x}-{end:#x}: {n} EX2")
    span = hot_loop(code, labels)
    if span is None:
        print(f"{name[:100]}: no loop")
        return
    c = mix(code, span)
    ex2 = max(c["EX2"], 1)
    total = sum(c.values())
    print(f"{name[:100]}\n  loop {span[0]:#x}-{span[1]:#x}: {total} instructions, {c['EX2']} EX2 "
          f"({total / ex2:.2f} per EX2)")
    for cls, n in c.most_common():
        print(f"    {cls:<10} {n:6d}  {n / ex2:6.3f} per EX2")


def source_parsers(p):
    """The `ours [--defines ...]` and `cubin FILE --function ...` subcommands on parser p: (ours, cubin)."""
    sub = p.add_subparsers(dest="what", required=True)
    o = sub.add_parser("ours")
    o.add_argument("--defines", nargs="*", default=[])
    c = sub.add_parser("cubin")
    c.add_argument("file")
    c.add_argument("--function", action="append", required=True)
    return o, c


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source_parsers(p)
    a = p.parse_args()
    if a.what == "ours":
        from h3kernels._launch import varlen_attention_fp8_sm90a as hopper
        from h3kernels._runtime import compiler

        defines = {**hopper.AttentionBuild().defines(), **dict(d.split("=", 1) for d in a.defines)}
        cubin = compiler.compile_cubin("varlen_attention_fp8_sm90a", "sm_90a", defines, use_cache=False)[0]
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(cubin + b"\0" * (-len(cubin) % 8))
        sass, wanted = sass_text(f.name), None
    else:
        sass, wanted = sass_text(a.file), a.function
    code, labels = functions(sass)
    for name in code:
        if wanted is None or all(w in name for w in wanted):
            report(name, code[name], labels[name])


if __name__ == "__main__":
    main()
