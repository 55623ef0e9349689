"""The MLP's wgmma GEMMs (fp8_mma_form 3) alone, per build variant, at one M: where FC1 and FC2
lose time against the wgmma ceiling. Random e4m3 operands (the GEMMs' time does not depend on
the values as long as they are finite and nonzero); timings only, no checks (bench/hopper_mlp.py
checks every variant that keeps the default's sums).

python bench/mlp_gemm_probe.py [--m 16384] [--variants NAME ...] [--whole NAME ...] [--ceiling]
                               [--launches N --only NAME]
  --whole       these variants also with every tile whole (the last wave not split over K)
  --rounds N    every variant once per round, in turn; each figure the median over the rounds
  --ceiling     also the wgmma ceiling with m64n64 / m64n128 / m64n256 groups (wgmma_ceiling.cu WGMMA_N)
  --only NAME   launch that variant's FC1 and FC2 N times and nothing else (for Nsight Compute)
"""
import argparse
import json
import statistics

import torch

from h3kernels._launch import mlp_fp8_sm90a as hopper
from h3kernels._runtime import arrays
from h3kernels.constants import FC1_OUT, FFN, HIDDEN
from h3kernels.testing.timing import median_ms

from bench_common import log

VARIANTS = {
    "default": (),
    "ieee_silu": (("FAST_SILU", 0),),
    "stages3": (("STAGES", 3),),
    "a_regs1": (("A_REGS", 1),),
    "a_regs2": (("A_REGS", 2),),
    "promote256": (("PROMOTE_K", 256),),
    "a_regs1_promote256": (("A_REGS", 1), ("PROMOTE_K", 256)),
    "bk64": (("BK", 64), ("PROMOTE_K", 64), ("STAGES", 9)),  # 24 KiB stages, 64 products per partial
    "no_promote": (("DBG_NO_PROMOTE", 1), ("PROMOTE_N64", 0)),
    "epilogue_blocks4": (("FC1_EPI_BLOCKS", 4), ("FC2_EPI_BLOCKS", 4)),
    "cluster2": (("CLUSTER_M", 2),),
    "cluster2_group8": (("CLUSTER_M", 2), ("GROUP_M", 8)),
    "cluster2_group32": (("CLUSTER_M", 2), ("GROUP_M", 32)),
    "cluster2_local_b": (("CLUSTER_M", 2), ("DBG_CLUSTER_LOCAL", 1)),
    "cluster2_no_tma": (("CLUSTER_M", 2), ("DBG_NO_TMA", 1)),
    "cluster2_no_mma": (("CLUSTER_M", 2), ("DBG_NO_MMA", 1), ("PROMOTE_N64", 0)),
    "no_tma": (("DBG_NO_TMA", 1),),
    "no_mma": (("DBG_NO_MMA", 1), ("PROMOTE_N64", 0)),
    "no_epilogue": (("DBG_NO_EPILOGUE", 1),),
    "no_tma_no_epilogue": (("DBG_NO_TMA", 1), ("DBG_NO_EPILOGUE", 1)),
    "no_tma_no_promote_no_epilogue": (("DBG_NO_TMA", 1), ("DBG_NO_PROMOTE", 1), ("PROMOTE_N64", 0), ("DBG_NO_EPILOGUE", 1)),
    "no_tma_no_promote": (("DBG_NO_TMA", 1), ("DBG_NO_PROMOTE", 1), ("PROMOTE_N64", 0)),
}


def e4m3_random(rows, cols, gen):
    """Finite e4m3 codes of both signs with magnitudes below 2 (exponent field at most 7)."""
    bits = torch.randint(0, 256, (rows, cols), dtype=torch.uint8, device="cuda", generator=gen) & 0xBF
    return bits.view(torch.float8_e4m3fn)


def operands(m):
    gen = torch.Generator(device="cuda").manual_seed(0)
    ones = lambda n: torch.full((n,), 1e-3, dtype=torch.float32, device="cuda")  # noqa: E731
    return dict(a_q=e4m3_random(m, HIDDEN, gen), a_s=ones(m), w1=e4m3_random(FC1_OUT, HIDDEN, gen), s1=ones(FC1_OUT),
                y=torch.empty(m, FFN, dtype=torch.bfloat16, device="cuda"), y_q=e4m3_random(m, FFN, gen), y_s=ones(m),
                w2=e4m3_random(HIDDEN, FFN, gen), s2=ones(HIDDEN),
                gate=torch.full((1, HIDDEN), 0.5, dtype=torch.bfloat16, device="cuda"),
                idx=torch.zeros(m, dtype=torch.int64, device="cuda"),
                residual=torch.zeros(m, HIDDEN, dtype=torch.bfloat16, device="cuda"),
                out=torch.empty(m, HIDDEN, dtype=torch.bfloat16, device="cuda"))


def gemms(call, m, o, variant, split=True):
    """FC1 and FC2 launches; split: the last wave's tiles split over K as the operator does
    (a zeroed workspace made once here, which every launch leaves zeroed), else every tile whole."""
    p = arrays.data_ptr
    held = hopper.workspace(call, m, variant) if split else None
    ws = None if held is None else p(held)
    whole = not split
    def fc1():
        hopper.launch_fc1(call, m, p(o["a_q"]), p(o["a_s"]), p(o["w1"]), p(o["s1"]), p(o["y"]), variant, split=ws,
                          whole_tiles=whole)

    def fc2():
        hopper.launch_fc2_gemm(call, m, p(o["y_q"]), p(o["y_s"]), p(o["w2"]), p(o["s2"]), o["gate"], p(o["idx"]),
                               p(o["residual"]), p(o["out"]), variant, split=ws, whole_tiles=whole)

    fc1.held = fc2.held = held  # the workspace lives as long as the launches
    return fc1, fc2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=16384)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--ceiling", action="store_true")
    ap.add_argument("--only")
    ap.add_argument("--rounds", type=int, default=1, help="times each variant once per round, in turn")
    ap.add_argument("--whole", nargs="*", default=[], help="these variants also with every tile whole (no split)")
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    m, o = args.m, operands(args.m)
    call = arrays.Call(dict(a=o["a_q"]))
    arrays.make_current(call.device_id)
    if args.only:
        fc1, fc2 = gemms(call, m, o, VARIANTS[args.only])
        for _ in range(args.launches):
            fc1()
            fc2()
        torch.cuda.synchronize()
        return
    res = {"m": m}
    if args.ceiling:
        from h3kernels.peers.wgmma_ceiling import measure_wgmma_tflops

        for n in (256, 128, 64):
            for steps in (4, 16):
                tf = measure_wgmma_tflops(call.device_id, WGMMA_N=n, K_STEPS=steps)
                res[f"ceiling_n{n}_k{steps}_tflops"] = tf
                log(f"wgmma ceiling m64n{n}k32, {steps} per group: {tf:.0f} TFLOP/s")
    runs = [(name, VARIANTS[name], True) for name in args.variants]
    if args.whole:
        runs += [(name + "_whole", VARIANTS[name], False) for name in args.whole]
    # rounds: every variant once per round, in turn, so that the GPU's warming over the run
    # reaches each alike; a variant's figure is its median over the rounds
    times = {}
    for r in range(args.rounds):
        for name, variant, split in runs:
            if name + "_error" in res:
                continue
            try:  # gemms builds the variant (plan): a build error is this variant's
                fc1, fc2 = gemms(call, m, o, variant, split)
                t1, t2 = median_ms(fc1, warmup=3, reps=10), median_ms(fc2, warmup=3, reps=10)
            except Exception as err:  # one variant's failure does not stop the others
                res[name + "_error"] = f"{type(err).__name__}: {str(err)[-300:]}"
                log(f"{name}: {res[name + '_error']}")
                continue
            times.setdefault(name, []).append((t1, t2))
            log(f"round {r} {name}: FC1 {t1:.3f} ms, FC2 {t2:.3f} ms")
    for name, runs_ms in times.items():
        t1 = statistics.median(t[0] for t in runs_ms)
        t2 = statistics.median(t[1] for t in runs_ms)
        res[name] = dict(fc1_ms=t1, fc2_ms=t2, fc1_tflops=2 * m * HIDDEN * FC1_OUT / t1 / 1e9,
                         fc2_tflops=2 * m * FFN * HIDDEN / t2 / 1e9, rounds=runs_ms)
        log(f"{name}: FC1 {t1:.3f} ms ({res[name]['fc1_tflops']:.0f} TFLOP/s), "
            f"FC2 {t2:.3f} ms ({res[name]['fc2_tflops']:.0f} TFLOP/s), median of {len(runs_ms)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
