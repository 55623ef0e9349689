"""python -m h3kernels {info,demo,check,bench,compile_check}: the command line."""
import argparse
import sys

from h3kernels.cli.output import PATH_OPTIONS, check_writable, finish, finish_missing
from h3kernels.cli.sizes import positive_rows, segment_set
from h3kernels.cli.status import FAILED, MISSING, OK, USAGE, MissingNeed, UsageError

PROG = "python -m h3kernels"
# The exit statuses, the same for every command (and examples/h3_block.py), are those of
# h3kernels.cli.status: OK 0, FAILED 1, USAGE 2, MISSING 3 (EPILOG says what each means).

EPILOG = f"""\
segment sets (demo, bench):
  a set is comma-separated segment lengths; NxK stands for K segments of N tokens;
  sets are separated by spaces:  --segments 4096,4096,4096,4096 16384  (or 4096x4 16384)

without a GPU:
  demo runs the CPU reference at the given sizes (at most 256 rows and a sum of squared
  segment lengths of 2 x 1024^2; larger sizes exit 2), check runs the Numba kernels in the
  CUDA simulator; both exit 3 instead with --gpu. bench exits 3.

--json PATH (every command), --csv PATH (bench):
  checked before any work: a path that cannot be written (no such directory, a directory,
  no permission) is bad usage (exit 2), which writes nothing. The JSON is written also
  when the command exits 1 or 3: "status" (ok, failed, missing) and "exit" say how it
  ended, and on exit 3 "reason" says what this machine lacks.

exit status:
  {OK}  success
  {FAILED}  a check failed (a result outside its bound, a compile error, a spill)
  {USAGE}  bad usage (unknown command, option or source name, malformed or too large sizes,
     an --arch a named source is not built for, an output path that cannot be written)
  {MISSING}  this machine lacks what the command needs: no CUDA GPU (bench; demo and check with
     --gpu; examples/h3_block.py), or for compile_check --sass no nvdisasm of the build's
     CUDA release
"""

NO_GPU = "No CUDA GPU found (torch.cuda.is_available() is False)"
GPU_NEED = "an sm_89, sm_90 or sm_120 GPU"


def gpu_available():
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def cmd_info(args):
    from h3kernels._runtime import compiler

    d, n, size = compiler.cache_usage()
    doc = dict(command="info", sources_dir=str(compiler.source_dir()), cache_dir=str(d), cached_cubins=n,
               cache_bytes=size, nvrtc=None, gpu=None)
    print(f"h3kernels sources: {doc['sources_dir']}")
    print(f"compile cache: {d} ({n} cubins, {size / 1e6:.1f} MB)")
    try:
        doc["nvrtc"] = ".".join(map(str, compiler.nvrtc().version))
        print(f"NVRTC: {doc['nvrtc']}")
    except Exception as err:  # the CLI still reports the rest
        print(f"NVRTC: not loaded ({type(err).__name__}: {err})")
    if not gpu_available():
        print("GPU: none found (torch.cuda.is_available() is False)")
        return finish(args.json, doc)
    import torch

    from h3kernels._runtime import targets

    i = torch.cuda.current_device()
    cc = torch.cuda.get_device_capability(i)
    arch = targets.arch_for(cc)
    forms = targets.offered_forms("mlp", i)
    chosen = targets.operator_form(i, -1)
    doc["gpu"] = dict(index=i, name=torch.cuda.get_device_name(i), compute_capability=list(cc), arch=arch,
                      mma_forms=list(targets.MMA_FORMS[arch]), forms=list(forms), mlp_form=chosen,
                      attention_form=chosen, family=targets.form_family(chosen))
    print(f"GPU {i}: {doc['gpu']['name']}, compute capability {cc[0]}.{cc[1]} -> {arch}")
    print(f"mma forms compiled for it: {targets.MMA_FORMS[arch]} (0 legacy e4m3 mma, 2 kind::mxf8f6f4)"
          + (f", and form {targets.WGMMA_FORM} (wgmma + TMA, sm_90a)" if targets.WGMMA_FORM in forms else ""))
    print(f"chosen by fp8_mma_form=-1: MLP form {chosen}, attention form {chosen} ({targets.form_family(chosen)})")
    return finish(args.json, doc)


def require_gpu_or_fall_back(args, what):
    gpu = gpu_available()
    if not gpu and args.gpu:
        raise MissingNeed(f"{NO_GPU}: {what} --gpu needs {GPU_NEED}.")
    return gpu


def cmd_demo(args):
    from h3kernels.cli import demo

    if require_gpu_or_fall_back(args, "demo"):
        return demo.run_gpu(args)
    return demo.run_cpu(args)


def cmd_check(args):
    from h3kernels.cli import check

    return check.run(require_gpu_or_fall_back(args, "check"), args.json)


def cmd_bench(args):
    if not args.rows and not args.segments:
        raise UsageError("nothing to time: give --rows and/or --segments")
    if not gpu_available():
        raise MissingNeed(f"{NO_GPU}: bench times the kernels, which need {GPU_NEED}.")
    from h3kernels.cli import bench

    return bench.run(args)


def cmd_compile_check(args):
    from h3kernels.cli import compile_check

    return compile_check.run(args)


def parser():
    from h3kernels.cli import compile_check

    p = argparse.ArgumentParser(prog=PROG, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="h3kernels: FP8 CUDA kernels for the MiniMax-H3 DiT.")
    sub = p.add_subparsers(dest="cmd", title="commands", metavar="command")

    def command(name, fn, help):
        c = sub.add_parser(name, help=help, description=help, epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        c.set_defaults(fn=fn, command_parser=c)  # main() reports a command's stray arguments with its usage
        return c

    def json_option(c):
        c.add_argument("--json", metavar="PATH", help="also write the results as JSON here")

    def gpu_option(c):
        c.add_argument("--gpu", action="store_true", help="need a GPU: exit 3 without one instead of running on the CPU")

    json_option(command("info", cmd_info, "device, arch, mma forms, NVRTC, compile cache"))
    d = command("demo", cmd_demo, "run both operators against the reference and time them (CPU: the reference "
                                  "alone, at the given sizes, stage by stage)")
    d.add_argument("--rows", type=positive_rows, nargs="+", metavar="M",
                   help="MLP rows (default: 16384 on a GPU, 8 on the CPU)")
    d.add_argument("--segments", type=segment_set, nargs="+", metavar="SET",
                   help="attention segment sets, 56 heads (default: 4096x4 on a GPU, 200,0,256 on the CPU)")
    gpu_option(d)
    json_option(d)
    c = command("check", cmd_check, "numeric acceptance of both operators on this device (exit 0: all pass; "
                                    "CPU: the Numba kernels in the CUDA simulator)")
    gpu_option(c)
    json_option(c)
    b = command("bench", cmd_bench, "time both operators, in each mma form they offer here, beside torch "
                                    "(torch.compile's FP8 MLP; bf16 SDPA), the FP8 attention peers where installed "
                                    "(FlashAttention-3, cuDNN) and the e4m3 ceiling of each form's family; the "
                                    "attention's accuracy beside the FP8 peers' (GPU)")
    b.add_argument("--rows", type=positive_rows, nargs="*", default=[16384], metavar="M",
                   help="MLP rows (default 16384; none: no MLP)")
    b.add_argument("--segments", type=segment_set, nargs="*", default=[[4096] * 4, [16384]], metavar="SET",
                   help="attention segment sets, 56 heads (default: 4096x4 16384; none: no attention)")
    json_option(b)
    b.add_argument("--csv", metavar="PATH", help="also write the rows as CSV here")
    cc = command("compile_check", cmd_compile_check,
                 "compile every CUDA source for sm_120a and sm_90 without a GPU: registers, shared memory, spills")
    compile_check.add_arguments(cc)
    return p


def parse(p, argv):
    """The parsed arguments; SystemExit from argparse after it printed a usage error (or --help).
    Arguments no option takes are reported by the command's own parser, with its usage: the
    top-level parser would show the top-level one."""
    args, stray = p.parse_known_args(argv)
    if stray:
        (args.command_parser if args.cmd else p).error(f"unrecognized arguments: {' '.join(stray)}")
    return args


def run(args):
    """The command on parsed arguments: its output paths checked first, then its work; returns
    its exit status. Bad usage raises UsageError; a missing need writes the --json document that
    says so, then raises MissingNeed."""
    for option in PATH_OPTIONS:
        check_writable(f"--{option}", getattr(args, option, None))
    try:
        return args.fn(args)
    except MissingNeed as err:
        finish_missing(args.json, args.cmd, str(err))
        raise


def main(argv=None):
    """Runs one command; returns its exit status (see EPILOG)."""
    p = parser()
    try:
        args = parse(p, argv)
    except SystemExit as stop:  # argparse: --help (0) or bad usage (2), already printed
        return stop.code if isinstance(stop.code, int) else USAGE
    if args.cmd is None:
        p.print_help(sys.stderr)
        print(f"\n{PROG}: error: no command given; choose one of the commands above", file=sys.stderr)
        return USAGE
    try:
        return run(args)
    except UsageError as err:
        print(f"{PROG} {args.cmd}: error: {err}", file=sys.stderr)
        return USAGE
    except MissingNeed as err:
        print(f"{PROG} {args.cmd}: {err}", file=sys.stderr)
        return MISSING


if __name__ == "__main__":
    sys.exit(main())
