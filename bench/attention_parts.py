"""Where the time of one minimax_h3_varlen_attention_fp8 call goes, measured in place (no profiler,
boost clocks): the whole call, the call with the quantization passes skipped (the kernel on the
previous call's workspace, plus host work), the passes alone and each pass, all as back-to-back
calls between one event pair; and the host time of a call and of its passes.

python bench/attention_parts.py [SET ...]      (bench_attention's set names; default 4x4096 1x16384)
"""
import sys

import torch

import h3kernels
from h3kernels._launch import varlen_attention_fp8 as launch
from h3kernels.testing.timing import attention_flops
from h3kernels.testing.timing import attention_quant_kernel_ms, median_ms_batched

from bench_attention import SETS, make_set
from bench_common import ceiling_tflops, host_ms, log


def parts(name, lens, ceil):
    s = make_set(lens, 56, 0, torch.device("cuda"))
    q, k, v, cu, cu_host = s["q"], s["k"], s["v"], s["cu"], s["cu_host"]
    out = torch.empty_like(q)
    op = lambda: h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu, out, cu_seqlens_host=cu_host)
    flops = attention_flops(lens, 56)
    op()
    torch.cuda.synchronize()
    whole = median_ms_batched(op, batch=4, warmup=1, reps=5)
    host = host_ms(op)
    real = launch.quant_launches
    launch.quant_launches = lambda *a, **kw: []
    try:
        kernel = median_ms_batched(op, batch=4, warmup=1, reps=5)
        kernel_host = host_ms(op)
    finally:
        launch.quant_launches = real
    passes, each = attention_quant_kernel_ms(q, k, v, cu, cu_host)
    pct = lambda ms: f"{flops / ms / 1e9 / ceil:.1%}" if ceil else "?"
    log(f"{name}: whole {whole:.3f} ms ({pct(whole)} of {ceil:.0f}); kernel-only call {kernel:.3f} ms "
        f"({pct(kernel)}); passes {passes:.3f} ms ({passes / whole:.1%}); whole - kernel - passes "
        f"{whole - kernel - passes:+.3f} ms")
    log(f"{name}: passes " + ", ".join(f"{n} {ms:.4f}" for n, ms in each.items()))
    log(f"{name}: host per call {host:.3f} ms, of which passes {host - kernel_host:.3f} ms")


def main():
    names = sys.argv[1:] or ["4x4096", "1x16384"]
    ceil = ceiling_tflops(torch.cuda.current_device(), 0)
    log(f"ceiling {ceil:.1f} TFLOP/s")
    for name in names:
        parts(name, dict(SETS)[name], ceil)


if __name__ == "__main__":
    main()
