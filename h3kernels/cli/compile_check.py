"""`python -m h3kernels compile_check [names...] [--arch A] [--sass] [--json PATH]`: compile every
cuda_src/*.cu (or the named ones) for sm_120a and sm_90 (a source of sm_90a instructions for
sm_90a only), no GPU needed. An --arch asked for holds for every source: a named one not built
for it is bad usage (exit 2), before anything compiles; without names, the sources not built for
it are listed (table head, the JSON's "not_built") and built for the other archs asked.

Prints the NVRTC version, then registers, static shared memory and spill bytes per kernel and
mma form. Exit 1 on a compile error, a compiler warning, any spill or stack frame, a wgmma that
ptxas serializes, or more static plus dynamic shared memory than a block of the arch may use. --sass also counts the matrix instructions in each cubin with nvdisasm. The cubins
are those of the build (the NVRTC that h3kernels compiles with), and nvdisasm must come from the
same CUDA major release: one of another major reads them wrongly or not at all, so a mismatch is
refused (exit 3) before anything compiles.
"""
import collections
import os
import re
import shutil
import subprocess
import sys
import secrets
import tempfile
from pathlib import Path

from h3kernels._launch.sources import archs_for, builds_for, every_arch, label
from h3kernels._runtime import compiler
from h3kernels.cli.output import finish
from h3kernels.cli.status import MissingNeed, UsageError

DEFAULT_ARCHS = ("sm_120a", "sm_90")
SM120_SMEM_LIMIT = 99 * 1024  # static + dynamic shared memory an SM120 block may use: 101376 bytes
SMEM_LIMIT = {"sm_90a": 227 * 1024}  # sm_90a-only sources: the H100/H200 block limit, 232448 bytes; others: SM120
_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")
_RELEASE = re.compile(r"release (\d+)\.(\d+)")
_MMA = re.compile(r"\b((?:QMMA|HMMA|IMMA|HGMMA|QGMMA)[A-Z0-9._]*)")



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


def source_names(names):
    """Command-line names -> stems of cuda_src/*.cu: `mlp_fp8`, `mlp_fp8.cu` and
    `cuda_src/mlp_fp8.cu` all name one source. Unknown names raise UsageError listing the known."""
    known = compiler.sources()
    if not names:
        return known
    stems = [Path(n).name[:-3] if Path(n).name.endswith(".cu") else Path(n).name for n in names]
    unknown = [n for n, s in zip(names, stems) if s not in known]
    if unknown:
        raise UsageError(f"unknown CUDA source{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                         f"known: {', '.join(known)} (in {compiler.source_dir()})")
    return list(dict.fromkeys(stems))


def plan(names, archs=None):
    """What to build: ({source: the archs it is built for here}, [each source not built for
    some arch asked for: dict(source, not_built_for, built_for)]). archs: those given with
    --arch, each to hold for every source (sm_90 holds for an sm_90a-only source as sm_90a), or
    None for DEFAULT_ARCHS, which hold as a pair (a source is built for those of the two it has).
    Named sources not built for an arch asked for raise one UsageError naming them all; without
    names, every source is built for the archs it has and the rest are returned."""
    asked = tuple(dict.fromkeys(archs or DEFAULT_ARCHS))
    named = bool(names)
    names = source_names(names)
    built = {n: archs_for(n, asked) for n in names}
    if archs:  # each arch asked for, one at a time: a source must have that arch or its sm_90a form
        lacking = {n: [a for a in asked if not archs_for(n, (a,))] for n in names}
    else:
        lacking = {n: list(asked) for n in names if not built[n]}
    not_built = [dict(source=n, not_built_for=miss, built_for=list(archs_for(n, every_arch())))
                 for n, miss in lacking.items() if miss]
    if named and not_built:
        raise UsageError("; ".join(f"{s['source']} is not built for {', '.join(s['not_built_for'])} (it is built "
                                   f"for {', '.join(s['built_for'])})" for s in not_built)
                         + ": name only sources built for the --arch asked, or ask for an arch they are built for")
    return {n: a for n, a in built.items() if a}, not_built


def nvrtc_version():
    return tuple(compiler.nvrtc().version)


def _nvdisasm_candidates():
    """Every nvdisasm this machine has: PATH, $CUDA_HOME/bin, /usr/local/cuda*/bin, NVIDIA's wheels."""
    seen = []
    found = shutil.which("nvdisasm")
    if found:
        seen.append(found)
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            seen.append(str(Path(os.environ[var]) / "bin" / "nvdisasm"))
    seen += sorted(str(p) for p in Path("/usr/local").glob("cuda*/bin/nvdisasm"))
    try:
        import nvidia

        for root in nvidia.__path__:
            seen += sorted(str(p) for p in Path(root).glob("*/bin/nvdisasm"))
    except ImportError:
        pass
    return [p for p in dict.fromkeys(seen) if os.path.isfile(p) and os.access(p, os.X_OK)]


def nvdisasm_version(path):
    """(major, minor) from `nvdisasm --version`, or None where it says no release."""
    try:
        text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = _RELEASE.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def nvdisasm_for(nvrtc_major):
    """(path, version) of an nvdisasm of the same CUDA major release as the NVRTC; MissingNeed
    saying what was found otherwise."""
    found = [(p, nvdisasm_version(p)) for p in _nvdisasm_candidates()]
    for path, version in found:
        if version and version[0] == nvrtc_major:
            return path, version
    seen = "; ".join(f"{p} (CUDA {'.'.join(map(str, v)) if v else 'version unknown'})" for p, v in found)
    hint = (f"pip install 'nvidia-cuda-nvdisasm=={nvrtc_major}.*' provides one" if nvrtc_major >= 13 else
            f"the nvidia-cuda-nvdisasm wheels are CUDA 13 and later: use a CUDA {nvrtc_major} toolkit's nvdisasm "
            f"(on PATH or in $CUDA_HOME/bin)")
    raise MissingNeed(f"--sass needs an nvdisasm of CUDA {nvrtc_major}, the release of the NVRTC that builds the "
                      f"kernels; found {seen or 'none'}. {hint}")


def nvdisasm_path():
    """An nvdisasm for the build's NVRTC, else any found, else None (lab/row_sass.py)."""
    try:
        return nvdisasm_for(nvrtc_version()[0])[0]
    except MissingNeed:
        found = _nvdisasm_candidates()
        return found[0] if found else None


def mma_instructions(cubin, tool):
    """Counter of matrix instructions in a cubin, read by the nvdisasm at `tool`. MissingNeed when
    that nvdisasm rejects the build's cubins as a whole: the H200's CUDA 13.0.85 nvdisasm calls
    NVRTC 13.0's cubins (CUDA ELF, ABI version 8) an "invalid ELF file"."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        done = subprocess.run([tool, "-c", f.name], capture_output=True, text=True)
    if done.returncode and "invalid ELF" in done.stderr:
        raise MissingNeed(f"--sass needs an nvdisasm that reads this NVRTC's cubins; {tool} says: "
                          f"{done.stderr.strip().splitlines()[-1]}")
    if done.returncode:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return collections.Counter(_MMA.findall(done.stdout))


def _nonce():
    """A device variable no kernel reads, new for every compilation. NVRTC 13.0 on the H200 was
    seen to return neither the ptxas report nor a cubin nvdisasm reads for a program that had
    been compiled before with the same options, by another process as well, even with an unused
    -D added; a variable changes the PTX itself, so each build is a new program."""
    n = secrets.randbits(63)
    return f"\n__device__ unsigned long long h3_compile_check_nonce = {n}ULL;\n"


def check(archs=None, names=None, out=None, sass=False):
    """Compiles and reports; returns a dict (the --json document) whose "ok" is the verdict.
    archs: as plan(). Raises UsageError for an unknown name or a named source not built for an
    arch asked for, MissingNeed when --sass has no matching nvdisasm."""
    out = out or sys.stdout
    todo, not_built = plan(names, archs)
    version = nvrtc_version()
    tool = nvdisasm_for(version[0]) if sass else None
    report = dict(command="compile_check", nvrtc=".".join(map(str, version)), sources_dir=str(compiler.source_dir()),
                  archs=list(dict.fromkeys(archs or DEFAULT_ARCHS)), nvdisasm=None, not_built=not_built, kernels=[],
                  failures=[])
    print(f"NVRTC {report['nvrtc']} (the build's), sources in {report['sources_dir']}", file=out)
    for s in not_built:
        print(f"not built for {', '.join(s['not_built_for'])}: {s['source']} (it is built for "
              f"{', '.join(s['built_for'])})", file=out)
    if tool:
        report["nvdisasm"] = dict(path=tool[0], version=".".join(map(str, tool[1])))
        print(f"nvdisasm {report['nvdisasm']['version']}: {tool[0]}", file=out)
    print(f"{'source':<28}{'arch':<9}{'build':<18}{'kernel':<32}{'regs':>5}{'smem':>8}{'stack':>6}{'spill':>7}",
          file=out)
    failures = report["failures"]
    for name, name_archs in todo.items():
        uses_mma = "mma_e4m3_16832(" in compiler.read_with_includes(name)[0]
        for arch in name_archs:
            # the builds that ship (sources._MODULES); a source without an mma builds one program
            # (NVRTC 13 returns no ptxas report for a repeat of it, seen on the H200)
            for build in builds_for(name, arch, uses_mma):
                what = f"{name} {arch} {label(build)}"
                try:
                    cubin, log, _ = compiler.compile_cubin(name, arch, build.defines(), ("-Xptxas=-v",),
                                                           use_cache=False, appended=_nonce())
                except compiler.CompileError as err:
                    failures.append(f"{what}: compile error")
                    print(err, file=out)
                    continue
                parsed = parse_ptxas(log)
                if "serialized" in log:  # "wgmma.mma_async instructions are serialized ...": most of the rate lost
                    failures.append(f"{what}: ptxas serializes wgmma")
                warnings = [ln.strip() for ln in log.splitlines() if "warn" in ln.lower()]
                if warnings:
                    failures.append(f"{what}: compiler warning: {warnings[0]}")
                if not parsed:
                    failures.append(f"{what}: no kernel found in the ptxas report")
                counts = None
                if sass:
                    try:
                        counts = dict(sorted(mma_instructions(cubin, tool[0]).items()))
                    except (OSError, subprocess.CalledProcessError) as err:
                        failures.append(f"{what}: nvdisasm failed: {str(err).splitlines()[0]}")
                for kernel, r in sorted(parsed.items()):
                    spill = r["spill_st"] + r["spill_ld"]
                    report["kernels"].append(dict(source=name, arch=arch, build=label(build),
                                                  form=getattr(build, "form", None), kernel=kernel, **r,
                                                  **({"mma": counts} if sass else {})))
                    print(f"{name:<28}{arch:<9}{label(build):<18}{kernel:<32}{r['regs']:>5}{r['smem']:>8}"
                          f"{r['stack']:>6}{spill:>7}", file=out)
                    if spill:
                        failures.append(f"{what} {kernel}: {spill} spill bytes")
                    if r["stack"]:  # every shipped kernel keeps its state in registers and shared memory
                        failures.append(f"{what} {kernel}: a {r['stack']}-byte stack frame")
                    smem = r["smem"] + build.dynamic_smem(kernel)
                    if smem > SMEM_LIMIT.get(arch, SM120_SMEM_LIMIT):
                        failures.append(f"{what} {kernel}: {smem} B static + dynamic smem")
                if counts is not None:
                    print(f"{'':<{28 + 9 + 18}}mma: " + (", ".join(f"{k} x{v}" for k, v in counts.items()) or "none"), file=out)
    for f in failures:
        print("FAIL", f, file=out)
    print(f"compile_check: {'FAILED' if failures else 'ok'} (NVRTC {report['nvrtc']})", file=out)
    report["ok"] = not failures
    return report


def add_arguments(p):
    p.add_argument("names", nargs="*", metavar="name",
                   help="CUDA sources to compile, as mlp_fp8 or mlp_fp8.cu (default: every cuda_src/*.cu)")
    p.add_argument("--arch", action="append", choices=every_arch(),
                   help="repeatable; default: sm_120a and sm_90 (sm_90 includes the sm_90a-only sources; sm_90a: "
                        "those alone). A named source not built for an arch asked for is bad usage (exit 2) naming "
                        "it and the archs it is built for; without names, such sources are listed and built for "
                        "the other archs asked")
    p.add_argument("--sass", action="store_true",
                   help="count matrix instructions with an nvdisasm of the build's CUDA major release")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON here")


def run(args):
    """The subcommand on parsed arguments; UsageError (exit 2) and MissingNeed (exit 3) propagate
    to h3kernels.cli.main, which reports them in one line."""
    report = check(args.arch, args.names, sass=args.sass)
    return finish(args.json, report, report["ok"])


def main(argv=None):
    """`python -m h3kernels.cli.compile_check`, the same as `python -m h3kernels compile_check`."""
    from h3kernels.cli import main as cli_main

    return cli_main(["compile_check", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
