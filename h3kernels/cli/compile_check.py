"""python -m h3kernels.compile_check: compile every cuda_src/*.cu for sm_120a and sm_90 (a source
of sm_90a instructions for sm_90a only), no GPU needed.

Prints registers, static shared memory and spill bytes per kernel and mma form. Exits non-zero
on a compile error, on any spill, on a wgmma that ptxas serializes, or on more shared memory than
a block of the arch may use.
With --sass it compiles through cuda-python's NVRTC 13 (nvidia-cuda-nvrtc) and counts the
matrix instructions in each cubin with the nvidia-cuda-nvdisasm wheel's nvdisasm, which does
not read the cubins of NVRTC 12.
"""
import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from h3kernels._launch.sources import archs_for, defines_for, dynamic_smem
from h3kernels._runtime import compiler as jit

SM120_SMEM_LIMIT = 99 * 1024  # static + dynamic shared memory an SM120 block may use: 101376 bytes
SMEM_LIMIT = {"sm_90a": 227 * 1024}  # sm_90a-only sources: the H100/H200 block limit, 232448 bytes; others: SM120
_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_ptxas(log):
    """{kernel: dict(regs, smem, stack, spill_st, spill_ld)} from an -Xptxas=-v log."""
    out, cur = {}, None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            cur = out.setdefault(m.group(1), dict(regs=0, smem=0, stack=0, spill_st=0, spill_ld=0))
            continue
        if cur is None:
            continue
        m = _SPILL.search(line)
        if m:
            cur.update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        m = _USED.search(line)
        if m:
            cur.update(regs=int(m.group(1)), smem=int(m.group(2) or 0))
    return out


def nvdisasm_path():
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia

        for root in nvidia.__path__:
            for cand in Path(root).glob("*/bin/nvdisasm"):
                return str(cand)
    except ImportError:
        pass
    return None


_MMA = re.compile(r"\b((?:QMMA|HMMA|IMMA|HGMMA|QGMMA)[A-Z0-9._]*)")


def mma_instructions(cubin):
    """Counter of matrix instructions in a cubin, via nvdisasm."""
    tool = nvdisasm_path()
    if tool is None:
        raise FileNotFoundError("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout
    return collections.Counter(_MMA.findall(text))


def check(archs=("sm_120a", "sm_90"), names=None, out=None, sass=False):
    out = out or sys.stdout
    failures = []
    backend = "cuda-python" if sass else None
    print(f"NVRTC {'.'.join(map(str, jit.nvrtc(backend).version))}, sources in {jit.source_dir()}", file=out)
    print(f"{'source':<24}{'arch':<9}{'form':>5}  {'kernel':<28}{'regs':>5}{'smem':>8}{'stack':>6}{'spill':>7}",
          file=out)
    for name in names or jit.sources():
        # A source without an mma builds the same program for every form; NVRTC 13 then returns
        # no ptxas report for the repeats (seen on the H200), so it is checked once.
        uses_mma = "mma_e4m3_16832(" in jit.read_with_includes(name)[0]
        for arch in archs_for(name, archs):
            for form in jit.MMA_FORMS[arch] if uses_mma else (0,):
                try:
                    cubin, log, _ = jit.compile_cubin(name, arch, defines_for(name, arch, form), ("-Xptxas=-v",),
                                                      use_cache=False, backend=backend)
                except jit.CompileError as err:
                    failures.append(f"{name} {arch} form {form}: compile error")
                    print(err, file=out)
                    continue
                parsed = parse_ptxas(log)
                if "serialized" in log:  # "wgmma.mma_async instructions are serialized ...": most of the rate lost
                    failures.append(f"{name} {arch} form {form}: ptxas serializes wgmma")
                if not parsed:
                    failures.append(f"{name} {arch} form {form}: no kernel found in the ptxas report")
                for kernel, r in sorted(parsed.items()):
                    spill = r["spill_st"] + r["spill_ld"]
                    print(f"{name:<24}{arch:<9}{form:>5}  {kernel:<28}{r['regs']:>5}{r['smem']:>8}"
                          f"{r['stack']:>6}{spill:>7}", file=out)
                    if spill:
                        failures.append(f"{name} {arch} form {form} {kernel}: {spill} spill bytes")
                    smem = r["smem"] + dynamic_smem(name).get(kernel, 0)
                    if smem > SMEM_LIMIT.get(arch, SM120_SMEM_LIMIT):
                        failures.append(f"{name} {arch} form {form} {kernel}: {smem} B static + dynamic smem")
                if sass:
                    try:
                        counts = mma_instructions(cubin)
                        print(f"{'':<24}{'':<9}{'':>5}  mma: " + (", ".join(f"{k} x{v}" for k, v in
                              sorted(counts.items())) or "none"), file=out)
                    except (OSError, subprocess.CalledProcessError) as err:
                        print(f"{'':<40}SASS not read: {str(err).splitlines()[0]}", file=out)
    for f in failures:
        print("FAIL", f, file=out)
    print("compile_check:", "FAILED" if failures else "ok", file=out)
    return not failures


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m h3kernels.compile_check", description=__doc__.splitlines()[0])
    p.add_argument("--arch", action="append", choices=sorted(jit.MMA_FORMS), help="default: sm_120a and sm_90")
    p.add_argument("--sass", action="store_true", help="count matrix instructions with nvdisasm")
    p.add_argument("sources", nargs="*", help="stems of cuda_src/*.cu (default: all)")
    a = p.parse_args(argv)
    return 0 if check(tuple(a.arch or ("sm_120a", "sm_90")), a.sources or None, sass=a.sass) else 1


if __name__ == "__main__":
    sys.exit(main())
