"""Times the MLP's two wgmma GEMMs alone, per build of cuda_src/mlp_fp8_sm90a.cu, on the operands
one public call leaves in its workspaces (real activations, not random bytes), and checks that
every build gives the shipped build's y and out bit for bit.

    python lab/mlp_gemm_time.py [--rows 16384 4096 256] [--builds "MlpBuild()" "MlpBuild(group_m=8)"]
                                [--json out.jsonl] [--label NAME]

Each figure: the median of back-to-back launches between CUDA events (median_ms_batched), in ms,
with its TFLOP/s. The builds are MlpBuild expressions (h3kernels/_launch/mlp_fp8_sm90a.py); a
checkout whose MlpBuild lacks a field fails on that expression alone."""
import argparse
import json

import torch

import h3kernels
from h3kernels._launch import mlp_fp8_sm90a as hopper
from h3kernels._launch.mlp_fp8_sm90a import MlpBuild  # noqa: F401 (the --builds expressions)
from h3kernels._runtime import arrays
from h3kernels._runtime.arrays import data_ptr
from h3kernels.constants import FC1_OUT, FFN, HIDDEN
from h3kernels.testing.inputs import make_mlp_weights, make_row_inputs
from h3kernels.timing import median_ms_batched


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[16384, 4096, 256])
    p.add_argument("--builds", nargs="+", default=["MlpBuild()"])
    p.add_argument("--json")
    p.add_argument("--label", default="")
    a = p.parse_args()
    gate, residual, w1, w2, q1, s1, q2, s2 = make_mlp_weights(max(a.rows), 50)
    del w1, w2
    rows = []
    for m in a.rows:
        x, wn, sc, sh, idx = make_row_inputs(m, 50, device="cuda", seed=m)
        res = residual[:m]
        ws = dict(workspace_a_q=torch.empty(m, HIDDEN, dtype=torch.float8_e4m3fn, device="cuda"),
                  workspace_a_scale=torch.empty(m, device="cuda"),
                  workspace_y=torch.empty(m, FFN, dtype=torch.bfloat16, device="cuda"),
                  workspace_y_q=torch.empty(m, FFN, dtype=torch.float8_e4m3fn, device="cuda"),
                  workspace_y_scale=torch.empty(m, device="cuda"))
        ref_out = h3kernels.minimax_h3_mlp_fp8(x, wn, sc, sh, idx, gate, res, q1, s1, q2, s2, fp8_mma_form=3, **ws)
        ref_y = ws["workspace_y"].clone()
        call = arrays.Call(dict(x=x))
        split = hopper.workspace(call, m)
        split_ptr = data_ptr(split) if split is not None else None
        ptr = {k: data_ptr(v) for k, v in ws.items()}
        y = torch.empty_like(ref_y)
        out = torch.empty_like(res)
        flops1, flops2 = 2 * m * HIDDEN * FC1_OUT, 2 * m * FFN * HIDDEN
        for expr in a.builds:
            b = eval(expr)
            fc1 = lambda: hopper.launch_fc1(call, m, ptr["workspace_a_q"], ptr["workspace_a_scale"], data_ptr(q1),  # noqa: E731
                                            data_ptr(s1), data_ptr(y), split=split_ptr, build=b)
            fc2 = lambda: hopper.launch_fc2_gemm(call, m, ptr["workspace_y_q"], ptr["workspace_y_scale"],  # noqa: E731
                                                 data_ptr(q2), data_ptr(s2), gate, data_ptr(idx), data_ptr(res),
                                                 data_ptr(out), split=split_ptr, build=b)
            y.fill_(float("nan"))
            out.fill_(float("nan"))
            fc1()
            fc2()
            torch.cuda.synchronize()
            same = bool(torch.equal(y.view(torch.int16), ref_y.view(torch.int16))
                        and torch.equal(out.view(torch.int16), ref_out.view(torch.int16)))
            batch = 20 if m <= 4096 else 5
            t1 = median_ms_batched(fc1, batch=batch, warmup=2, reps=7)
            t2 = median_ms_batched(fc2, batch=batch, warmup=2, reps=7)
            row = dict(label=a.label, build=expr, M=m, fc1_ms=t1, fc2_ms=t2, fc1_tflops=flops1 / t1 / 1e9,
                       fc2_tflops=flops2 / t2 / 1e9, bitwise=same)
            rows.append(row)
            print(f"{a.label:<8}{expr:<40} M={m:<6} FC1 {t1:7.3f} ms ({row['fc1_tflops']:6.0f})  "
                  f"FC2 {t2:7.3f} ms ({row['fc2_tflops']:6.0f})  bitwise {same}", flush=True)
        del x, ws, y, out, split
    if a.json:
        with open(a.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
