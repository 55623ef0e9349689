"""SASS of two builds, compared: a kernel before and after a change that must keep its
instructions (a refactor of a shipped kernel). Each side is a checkout and a Python expression,
evaluated there with `compiler` imported, that returns (source stem, arch, defines dict):

    python lab/sass_diff.py --before /path/to/old:'("mlp_fp8_sm90a", "sm_90a", L.defines())' \
        --after .:'("mlp_fp8_sm90a", "sm_90a", CONFIG.defines())' \
        --setup-before 'from h3kernels._launch import mlp_fp8_sm90a as L' ...

Prints, per kernel, the instruction count of each side, whether the instruction texts are the
same in order (addresses and encodings stripped), and the opcode counts that differ. Needs
cuobjdump (the nvidia-cuda-cuobjdump wheel, or a CUDA toolkit's) on PATH or in $CUOBJDUMP.
"""
import argparse
import collections
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

_BUILD = r"""
import json, sys
from h3kernels._runtime import compiler
{setup}
source, arch, defines = {expr}
cubin, log, _ = compiler.compile_cubin(source, arch, defines, ("-Xptxas=-v",), use_cache=False)
open(sys.argv[1], "wb").write(cubin + b"\0" * (-len(cubin) % 8))  # an older loader dropped the last NUL
print(json.dumps(log))
"""


def cuobjdump():
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not found:
        wheels = glob.glob(os.path.join(sys.prefix, "lib", "python*", "site-packages", "nvidia", "*", "bin",
                                        "cuobjdump"))
        wheels += sorted(glob.glob("/usr/local/cuda*/bin/cuobjdump"))
        found = wheels[0] if wheels else None
    if not found:
        sys.exit("no cuobjdump: pip install nvidia-cuda-cuobjdump, or set $CUOBJDUMP")
    return found


def build(checkout, setup, expr, path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.abspath(checkout),
                                                                     os.environ.get("PYTHONPATH")])))
    env.pop("H3KERNELS_CACHE_DIR", None)
    run = subprocess.run([sys.executable, "-c", _BUILD.format(setup=setup, expr=expr), path], env=env,
                         capture_output=True, text=True, cwd=checkout)
    if run.returncode:
        sys.exit(f"build in {checkout} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def sass_text(path):
    """cuobjdump's SASS listing of a cubin file."""
    return subprocess.run([cuobjdump(), "-sass", path], capture_output=True, text=True, check=True).stdout


def sass(path):
    """{kernel: [instruction text, ...]} with addresses, encodings and the trailing ';' stripped."""
    text = sass_text(path)
    out, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"\s+Function : (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if m and cur is not None:
            cur.append(m.group(1))
    return out


def opcode(ins):
    ins = re.sub(r"^@!?U?P\w+\s+", "", ins)
    return ins.split()[0]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="CHECKOUT:EXPR")
    p.add_argument("--after", required=True, help="CHECKOUT:EXPR")
    p.add_argument("--setup-before", default="")
    p.add_argument("--setup-after", default="")
    p.add_argument("--show", type=int, default=12, help="differing lines to print per kernel")
    a = p.parse_args(argv)
    tmp = tempfile.mkdtemp()
    sides = {}
    for name, spec, setup in (("before", a.before, a.setup_before), ("after", a.after, a.setup_after)):
        checkout, expr = spec.split(":", 1)
        path = os.path.join(tmp, f"{name}.cubin")
        log = build(checkout, setup, expr, path)
        regs = re.findall(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", log, re.S)
        sides[name] = (sass(path), dict(regs), log)
    before, after = sides["before"][0], sides["after"][0]
    same_all = True
    for kernel in sorted(set(before) | set(after)):
        b, c = before.get(kernel, []), after.get(kernel, [])
        same = b == c
        same_all &= same
        rb, ra = sides["before"][1].get(kernel), sides["after"][1].get(kernel)
        print(f"{kernel}: {len(b)} -> {len(c)} instructions, registers {rb} -> {ra}, "
              f"{'the same instructions in order' if same else 'DIFFERENT'}")
        if not same:
            cb, ca = collections.Counter(map(opcode, b)), collections.Counter(map(opcode, c))
            moved = {k: (cb[k], ca[k]) for k in sorted(set(cb) | set(ca)) if cb[k] != ca[k]}
            print(f"  opcode counts that differ (before, after): {moved}")
            shown = 0
            for i, (x, y) in enumerate(zip(b, c)):
                if x != y and shown < a.show:
                    print(f"  {i}: {x!r} | {y!r}")
                    shown += 1
    return 0 if same_all else 1


if __name__ == "__main__":
    sys.exit(main())
