"""Times the FC1+SwiGLU GEMM alone at M=16384 (prepared arguments, rotated inputs) against the
e4m3 mma.sync ceiling and torch._scaled_mm of the same shape, all in one run.

python bench/bench_fc1.py [--rows 16384]"""
import argparse

import torch

from h3kernels import dispatch, mlp_fp8, mma_ceiling
from h3kernels.shapes import FC1_OUT, FFN, HIDDEN
from h3kernels.timing import median_ms


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=16384)
    m = p.parse_args().rows
    e4 = torch.float8_e4m3fn
    sets = [(torch.randn(m, HIDDEN, device="cuda").clamp(-400, 400).to(e4), torch.rand(m, device="cuda") * 1e-2)
            for _ in range(3)]
    w = torch.randn(FC1_OUT, HIDDEN, device="cuda").clamp(-400, 400).to(e4)
    ws = torch.rand(FC1_OUT, device="cuda") * 1e-2
    y = torch.empty(m, FFN, dtype=torch.bfloat16, device="cuda")
    call = dispatch.Call(dict(a_q=sets[0][0], y=y))
    form = mlp_fp8.mma_form(call.device_id)
    cur = {}
    setup = lambda i: cur.update(a=sets[i % 3])
    fc1 = lambda: mlp_fp8._launch_fc1(call, cur["a"][0], cur["a"][1], w, ws, y, m, form)
    ms = median_ms(fc1, warmup=3, reps=20, setup=setup)
    flops = 2 * m * HIDDEN * FC1_OUT
    one = torch.ones(1, device="cuda")
    sm = median_ms(lambda: torch._scaled_mm(cur["a"][0], w.t(), one, one, out_dtype=torch.bfloat16),
                   warmup=3, reps=20, setup=setup)
    ceil = mma_ceiling.measure_tflops(call.device_id, form)
    t = flops / ms / 1e9
    print(f"FC1 M={m}: {ms:.3f} ms = {t:.0f} TFLOP/s; e4m3 mma.sync ceiling {ceil:.0f} TFLOP/s "
          f"({t / ceil:.0%}); torch._scaled_mm same GEMM {sm:.3f} ms = {flops / sm / 1e9:.0f} TFLOP/s")


if __name__ == "__main__":
    main()
