"""Times the MLP's two wgmma GEMMs alone, per build of cuda_src/mlp_fp8_sm90a.cu, on the operands
one public call leaves in its workspaces (real activations, not random bytes), and checks that
every build gives the shipped build's y and out bit for bit.

    python lab/mlp_gemm_time.py [--rows 16384 4096 256] [--builds "MlpBuild()" "MlpBuild(group_m=8)"]
                                [--widths 256 224] [--rounds 3] [--json out.jsonl] [--label NAME]

Each figure: the median of back-to-back launches between CUDA events (median_ms_batched), in ms,
with its TFLOP/s; with --rounds, the median over rounds that take every variant in turn.
--widths forces both GEMMs' tile width (MlpBuild's tile_width; a width whose split differs from
the shipped plan's may differ in the last bits, which the bitwise column then shows). The builds
are MlpBuild expressions (h3kernels/_launch/mlp_fp8_sm90a.py); a checkout whose MlpBuild lacks a
field fails on that expression alone (a forced width needs MlpBuild.tile_width)."""
import argparse
import dataclasses
import json
import statistics

import torch

from h3kernels._launch import mlp_fp8_sm90a as hopper
from h3kernels._launch.mlp_fp8_sm90a import MlpBuild  # noqa: F401 (the --builds expressions)
from h3kernels.cli.compile_check import SMEM_LIMIT
from h3kernels.testing.inputs import make_mlp_weights, make_row_inputs
from h3kernels.testing.poison import poisoned_mlp_workspaces
from h3kernels.testing.timing import median_ms_batched, mlp_gemm_flops, mlp_gemms_alone


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[16384, 4096, 256])
    p.add_argument("--builds", nargs="+", default=["MlpBuild()"])
    p.add_argument("--widths", type=int, nargs="+", default=[0], help="tile widths to force (0: the plan's)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--json")
    p.add_argument("--label", default="")
    a = p.parse_args()
    gate, residual, w1, w2, q1, s1, q2, s2 = make_mlp_weights(max(a.rows), 50)
    del w1, w2
    rows = []
    for m in a.rows:
        x, wn, sc, sh, idx = make_row_inputs(m, 50, device="cuda", seed=m)
        args = (x, wn, sc, sh, idx, gate, residual[:m], q1, s1, q2, s2)
        ws = poisoned_mlp_workspaces(m)
        _, fc2 = mlp_gemms_alone(*args, ws)  # the shipped build: the bits every build must give
        fc2()
        ref_y, ref_out = ws["workspace_y"].clone(), fc2.arrays[1].clone()
        flops1, flops2 = mlp_gemm_flops(m)
        variants = []
        for expr in a.builds:
            for width in a.widths:
                if width and eval(expr).dynamic_smem(hopper.gemm_kernel(hopper.FC1, width)) > SMEM_LIMIT[hopper.ARCH]:
                    continue  # that many stages of that width do not fit the SM
                build = eval(expr)
                if width:
                    build = dataclasses.replace(build, tile_width=width)
                fc1, fc2 = mlp_gemms_alone(*args, ws, build=build)
                y, out = ws["workspace_y"], fc2.arrays[1]
                y.fill_(float("nan"))
                out.fill_(float("nan"))
                fc1()
                fc2()
                torch.cuda.synchronize()
                same = bool(torch.equal(y.view(torch.int16), ref_y.view(torch.int16))
                            and torch.equal(out.view(torch.int16), ref_out.view(torch.int16)))
                variants.append((expr, width, fc1, fc2, same, [], []))
        batch = 20 if m <= 4096 else 5
        for _ in range(a.rounds):
            for expr, width, fc1, fc2, same, t1, t2 in variants:
                t1.append(median_ms_batched(fc1, batch=batch, warmup=2, reps=7))
                t2.append(median_ms_batched(fc2, batch=batch, warmup=2, reps=7))
        for expr, width, fc1, fc2, same, t1, t2 in variants:
            t1, t2 = statistics.median(t1), statistics.median(t2)
            row = dict(label=a.label, build=expr, width=width, M=m, fc1_ms=t1, fc2_ms=t2,
                       fc1_tflops=flops1 / t1 / 1e9, fc2_tflops=flops2 / t2 / 1e9, bitwise=same)
            rows.append(row)
            print(f"{a.label:<8}{expr:<36} width {width or 'plan':<5} M={m:<6} FC1 {t1:7.3f} ms "
                  f"({row['fc1_tflops']:6.0f})  FC2 {t2:7.3f} ms ({row['fc2_tflops']:6.0f})  bitwise {same}",
                  flush=True)
        del x, ws, variants
    if a.json:
        with open(a.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
