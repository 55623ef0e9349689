"""Times the shipped wgmma builds of both operators through the public calls, in whichever
checkout is first on PYTHONPATH: run it once per checkout, alternating, to compare a change's
speed with the code before it in one GPU run (lab/gpu_acceptance.sh does).

    PYTHONPATH=<checkout> python lab/ab_time.py --label new --json out.json

MLP: minimax_h3_mlp_fp8(fp8_mma_form=3) at M = 16384, 4096, 1024, 256 (--mlp-rows) with caller workspaces and out;
--mlp-gemms: FC1 and FC2 alone as well (testing.timing.mlp_gemms_alone).
Attention: minimax_h3_varlen_attention_fp8(fp8_mma_form=3) on 4x4096, 1x16384, 16x1024, 64x256 tokens,
56 heads, out preallocated and cu_seqlens_host given; 4x4096 also with return_lse (the lse build);
each plain set's kernel alone as well (testing.timing.attention_kernel_alone).
Each figure: the median of back-to-back calls between CUDA events (median_ms_batched)."""
import argparse
import functools
import json
import time

import torch

import h3kernels
from h3kernels.constants import FFN, HIDDEN
from h3kernels.testing.inputs import make_attention_inputs, make_mlp_weights, make_row_inputs
from h3kernels.testing.timing import attention_kernel_alone, median_ms_batched, mlp_gemms_alone


def mlp_calls(rows):
    """(M, a call of the MLP at M rows with its own inputs, out and workspaces) for each M, on
    weights made once (lab/call_timeline.py times the same calls)."""
    gate, residual, w1, w2, q1, s1, q2, s2 = make_mlp_weights(max(rows), 50)
    del w1, w2
    for m in rows:
        x, wn, sc, sh, idx = make_row_inputs(m, 50, device="cuda", seed=m)
        res = residual[:m]
        dst = torch.empty_like(res)
        ws = dict(workspace_a_q=torch.empty(m, HIDDEN, dtype=torch.float8_e4m3fn, device="cuda"),
                  workspace_a_scale=torch.empty(m, device="cuda"),
                  workspace_y=torch.empty(m, FFN, dtype=torch.bfloat16, device="cuda"),
                  workspace_y_q=torch.empty(m, FFN, dtype=torch.float8_e4m3fn, device="cuda"),
                  workspace_y_scale=torch.empty(m, device="cuda"))
        call = functools.partial(h3kernels.minimax_h3_mlp_fp8, x, wn, sc, sh, idx, gate, res, q1, s1, q2, s2,
                                 out=dst, fp8_mma_form=3, **ws)
        call.gemms = functools.partial(mlp_gemms_alone, x, wn, sc, sh, idx, gate, res, q1, s1, q2, s2, ws)
        yield m, call


def mlp(rows, gemms=False):
    out = {}
    for m, call in mlp_calls(rows):
        call()
        batch = 20 if m <= 4096 else 5
        out[f"mlp M={m}"] = median_ms_batched(call, batch=batch, warmup=2, reps=7)
        if gemms:
            for name, fn in zip(("FC1", "FC2"), call.gemms()):
                out[f"mlp M={m} {name}"] = median_ms_batched(fn, batch=batch, warmup=2, reps=7)
    return out


def attention(sets):
    out = {}
    for name, seqlens, lse in sets:
        q, k, v, cu_dev, cu = make_attention_inputs(seqlens, 56, device="cuda", seed=5)
        dst = torch.empty_like(q)
        call = lambda: h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, dst, cu_seqlens_host=cu,  # noqa: E731
                                                                 fp8_mma_form=3, return_lse=lse)
        call()
        out[name] = median_ms_batched(call, batch=10, warmup=2, reps=7)
        if not lse:  # the kernel alone: its launch replayed on the scratch one call left
            try:
                alone = attention_kernel_alone(q, k, v, cu_dev, cu, form=3)
            except TypeError:  # the signature before the launch records: a call to record
                alone = attention_kernel_alone(call)
            out[name + " kernel"] = median_ms_batched(alone, batch=10, warmup=2, reps=7)
        del q, k, v, dst
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--label", required=True)
    p.add_argument("--json", required=True)
    p.add_argument("--only", choices=("mlp", "attention"), help="time one operator")
    p.add_argument("--mlp-rows", type=int, nargs="+", default=[16384, 4096, 1024, 256], help="the MLP's M values")
    p.add_argument("--mlp-gemms", action="store_true", help="each MLP GEMM alone too")
    a = p.parse_args()
    t0 = time.time()
    res = dict(label=a.label, package=h3kernels.__file__)
    if a.only != "mlp":
        res.update(attention([("attention 4x4096", [4096] * 4, False), ("attention 4x4096 lse", [4096] * 4, True),
                              ("attention 1x16384", [16384], False), ("attention 16x1024", [1024] * 16, False),
                              ("attention 64x256", [256] * 64, False)]))
    if a.only != "attention":
        res.update(mlp(a.mlp_rows, a.mlp_gemms))
    res["seconds"] = time.time() - t0
    with open(a.json, "a") as f:
        f.write(json.dumps(res) + "\n")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
