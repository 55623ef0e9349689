"""python -m h3kernels {info,demo,check,bench}"""
import argparse
import sys


def gpu_available():
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def cmd_info(_args):
    from h3kernels._runtime import compiler as jit

    d, n, size = jit.cache_usage()
    print(f"h3kernels sources: {jit.source_dir()}")
    print(f"compile cache: {d} ({n} cubins, {size / 1e6:.1f} MB)")
    if not gpu_available():
        print("GPU: none found (torch.cuda.is_available() is False)")
        return 0
    import torch

    i = torch.cuda.current_device()
    cc = torch.cuda.get_device_capability(i)
    arch = jit.arch_for(cc)
    print(f"GPU {i}: {torch.cuda.get_device_name(i)}, compute capability {cc[0]}.{cc[1]} -> {arch}")
    print(f"mma forms compiled for it: {jit.MMA_FORMS[arch]} (0 legacy, 1 kind::f8f6f4, 2 kind::mxf8f6f4)")
    from h3kernels.mlp_fp8 import mma_form as mlp_form
    from h3kernels.varlen_attention_fp8 import mma_form as attention_form

    print(f"chosen: MLP form {mlp_form(i)} (fp8_mma_form=-1), attention form {attention_form(i)}")
    return 0


def cmd_demo(args):
    from h3kernels.cli import demo

    return demo.run_gpu(args) if gpu_available() else demo.run_cpu(args)


def cmd_check(_args):
    from h3kernels.cli import check

    return check.run(gpu_available())


def cmd_bench(args):
    if not gpu_available():
        print("No CUDA GPU found: bench times the kernels, which need an sm_89, sm_90 or sm_120 GPU.")
        return 1
    from h3kernels.cli import bench

    return bench.run(args)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m h3kernels")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="device, arch, mma forms, compile cache").set_defaults(fn=cmd_info)
    d = sub.add_parser("demo", help="run the operators at MiniMax-H3 sizes against the reference")
    d.add_argument("--rows", type=int, default=16384, help="MLP rows M on the GPU (default 16384)")
    d.add_argument("--segments", type=int, nargs="+", default=[4096, 4096, 4096, 4096],
                   help="attention segment lengths on the GPU (default 4 x 4096)")
    d.set_defaults(fn=cmd_demo)
    sub.add_parser("check", help="numeric acceptance of both operators on this device (exit 0: all pass)"
                   ).set_defaults(fn=cmd_check)
    b = sub.add_parser("bench", help="time both operators beside torch bf16 and the e4m3 mma.sync ceiling")
    b.add_argument("--rows", type=int, nargs="*", default=[16384], help="MLP rows M (default 16384)")
    b.add_argument("--segments", nargs="*", default=["4096,4096,4096,4096", "16384"],
                   help="attention segment lists, comma-separated lengths (default 4x4096 and 1x16384)")
    b.add_argument("--json", help="also write the rows as JSON here")
    b.add_argument("--csv", help="also write the rows as CSV here")
    b.set_defaults(fn=cmd_bench)
    a = p.parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
