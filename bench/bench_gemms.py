"""Times the MLP's stages alone at M=16384 (prepared arguments, rotated inputs): the row stage,
the flags memset, FC1+SwiGLU, FC2 (with its y quantization) and the whole operator, against the
e4m3 mma.sync ceiling and torch._scaled_mm of the same GEMM shapes, all in one run.

python bench/bench_gemms.py [--rows 16384] [--json PATH]"""
import argparse
import datetime
import json

import torch

import h3kernels
from h3kernels._launch import mlp_fp8 as launch
from h3kernels._runtime import arrays, targets
from h3kernels.peers import mma_ceiling
from h3kernels.testing.inputs import make_row_inputs
from h3kernels.constants import FC1_OUT, FFN, HIDDEN
from h3kernels.testing.timing import median_ms


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=16384)
    p.add_argument("--json")
    a = p.parse_args()
    m = a.rows
    e4 = torch.float8_e4m3fn
    w1 = (torch.randn(FC1_OUT, HIDDEN, device="cuda") * HIDDEN ** -0.5).bfloat16()
    w2 = (torch.randn(HIDDEN, FFN, device="cuda") * FFN ** -0.5).bfloat16()
    q1, s1 = h3kernels.prepare_minimax_h3_fc1_weight_fp8(w1)
    q2, s2 = h3kernels.prepare_minimax_h3_fc2_weight_fp8(w2)
    sets = []
    for seed in range(3):  # 3 x (x 176 MB + y 470 MB + ...) >> 50 MB of L2
        x, w, sc, sh, idx = make_row_inputs(m, 50, device="cuda", seed=seed)
        gate = torch.randn(50, HIDDEN, device="cuda").bfloat16()
        sets.append(dict(args=(x, w, sc, sh, idx, gate, torch.randn(m, HIDDEN, device="cuda").bfloat16()),
                         a_q=torch.empty(m, HIDDEN, dtype=e4, device="cuda"), a_s=torch.empty(m, device="cuda"),
                         y=torch.empty(m, FFN, dtype=torch.bfloat16, device="cuda"),
                         y_q=torch.empty(m, FFN, dtype=e4, device="cuda"), y_s=torch.empty(m, device="cuda"),
                         flags=torch.empty(h3kernels.minimax_h3_mlp_fc2_flags(m), dtype=torch.int32, device="cuda"),
                         out=torch.empty(m, HIDDEN, dtype=torch.bfloat16, device="cuda")))
    cur = {}
    setup = lambda i: cur.update(s=sets[i % len(sets)])

    def op():
        s = cur["s"]
        h3kernels.minimax_h3_mlp_fp8(*s["args"][:7], q1, s1, q2, s2, out=s["out"], workspace_a_q=s["a_q"],
                                     workspace_a_scale=s["a_s"], workspace_y=s["y"], workspace_y_q=s["y_q"],
                                     workspace_y_scale=s["y_s"], workspace_flags=s["flags"])

    for i in range(3):  # fills every set's workspaces (a_q, y) for the stage timings
        setup(i)
        op()
    call = arrays.Call(dict(a_q=sets[0]["a_q"]))
    form = targets.mma_form(call.device_id)
    arrays.make_current(call.device_id)  # this script's thread stays on the device

    def fc1():
        s = cur["s"]
        ptr = arrays.data_ptr
        launch.launch_fc1(call, form, m, ptr(s["a_q"]), ptr(s["a_s"]), ptr(q1), ptr(s1), ptr(s["y"]))

    def fc2():
        s = cur["s"]
        x, w, sc, sh, idx, gate, res = s["args"]
        ptr = arrays.data_ptr
        launch.zero_flags(call, m, ptr(s["flags"]))
        launch.launch_fc2(call, form, m, ptr(s["y"]), ptr(s["y_q"]), ptr(s["y_s"]), ptr(q2), ptr(s2), gate, ptr(idx),
                          ptr(res), ptr(s["out"]), ptr(s["flags"]))

    def row():
        s = cur["s"]
        h3kernels.minimax_h3_mlp_fp8_row_stage(*s["args"][:5], workspace_a_q=s["a_q"], workspace_a_scale=s["a_s"])

    def memset():
        launch.zero_flags(call, m, arrays.data_ptr(cur["s"]["flags"]))

    one = torch.ones(1, device="cuda")
    res = dict(date=datetime.date.today().isoformat(), device=torch.cuda.get_device_name(), rows=m, form=form)
    for name, fn in (("op", op), ("row", row), ("memset", memset), ("fc1", fc1), ("fc2", fc2)):
        res[name + "_ms"] = median_ms(fn, warmup=3, reps=15, setup=setup)
    res["scaled_mm_fc1_ms"] = median_ms(lambda: torch._scaled_mm(cur["s"]["a_q"], q1.t(), one, one,
                                                                 out_dtype=torch.bfloat16), setup=setup)
    res["scaled_mm_fc2_ms"] = median_ms(lambda: torch._scaled_mm(cur["s"]["y_q"], q2.t(), one, one,
                                                                 out_dtype=torch.bfloat16), setup=setup)
    res["ceiling_tflops"] = mma_ceiling.measure_tflops(call.device_id, form)
    f1, f2 = 2 * m * HIDDEN * FC1_OUT, 2 * m * FFN * HIDDEN
    for k, f in (("op", f1 + f2), ("fc1", f1), ("fc2", f2), ("scaled_mm_fc1", f1), ("scaled_mm_fc2", f2)):
        res[k + "_tflops"] = f / res[k + "_ms"] / 1e9
    res["op_fraction_of_ceiling"] = res["op_tflops"] / res["ceiling_tflops"]
    res["row_and_memset_share"] = (res["row_ms"] + res["memset_ms"]) / res["op_ms"]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    print(json.dumps(res))
    print(f"M={m}: op {res['op_ms']:.3f} ms = {res['op_tflops']:.0f} TFLOP/s ({res['op_fraction_of_ceiling']:.0%} of "
          f"the {res['ceiling_tflops']:.0f} TFLOP/s e4m3 mma.sync ceiling); row {res['row_ms']:.3f} + memset "
          f"{res['memset_ms']:.4f} ms = {res['row_and_memset_share']:.1%}; FC1 {res['fc1_ms']:.3f} ms "
          f"({res['fc1_tflops']:.0f}), FC2 {res['fc2_ms']:.3f} ms ({res['fc2_tflops']:.0f}); _scaled_mm FC1 "
          f"{res['scaled_mm_fc1_ms']:.3f} FC2 {res['scaled_mm_fc2_ms']:.3f} ms")


if __name__ == "__main__":
    main()
