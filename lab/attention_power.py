"""What the GPU's clock and power do under the attention: each workload runs for a few seconds
while nvidia-smi samples the SM clock, the board power and the clock-event reasons every 50 ms
(0x4: the software power cap), reported per workload beside its time per call.

    python3 lab/attention_power.py [--set 1x16384] [--no-peers] [--inputs normal|signs|zeros]

Workloads: minimax_h3_varlen_attention_fp8, cuDNN's bf16 SDPA on the same set (as
h3kernels.peers.torch_attention runs it, out packed), and the e4m3
wgmma ceiling (h3kernels.peers.wgmma_ceiling). --inputs signs replaces q, k and v by the signs
of the random draws (every e4m3 code then +-448 up to K's smoothing: the tensor core's operands
toggle little more than their sign bits), zeros by zeros: how much of the power the operands'
bits draw."""
import argparse
import datetime
import os
import subprocess
import sys
import time

import numpy as np
import torch

import h3kernels
from h3kernels.peers.torch_attention import sdpa_backend_bf16
from h3kernels.peers.wgmma_ceiling import ceiling_launch
from h3kernels.testing.timing import attention_flops

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from bench_attention import SETS, make_set  # noqa: E402

SECONDS = 2.5


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--set", default="1x16384", choices=[n for n, _ in SETS])
    p.add_argument("--no-peers", action="store_true")
    p.add_argument("--inputs", default="normal", choices=("normal", "signs", "zeros"))
    args = p.parse_args()
    out_dir = os.environ.get("OUT", "/tmp/h3out")
    os.makedirs(out_dir, exist_ok=True)
    lens = dict(SETS)[args.set]
    s = make_set(lens, 56, 0, torch.device("cuda"))
    for name in ("q", "k", "v"):
        if args.inputs == "signs":
            s[name] = torch.sign(s[name])
        elif args.inputs == "zeros":
            s[name] = torch.zeros_like(s[name])
    out = torch.empty_like(s["q"])
    flops = attention_flops(lens, 56)

    def ours():
        h3kernels.minimax_h3_varlen_attention_fp8(s["q"], s["k"], s["v"], s["cu"], out, cu_seqlens_host=s["cu_host"])

    work = [("h3kernels", ours, flops)]
    if not args.no_peers:
        cudnn, label = sdpa_backend_bf16(s["q"], s["k"], s["v"], s["cu_host"], "CUDNN_ATTENTION")
        if cudnn is not None:  # as bench_attention.py times it: batched where the segments allow
            work.append((label, cudnn, flops))
        work.append(("e4m3 wgmma ceiling", *ceiling_launch(iters=16384)))
    report(work, os.path.join(out_dir, "attention_power.csv"),
           f"set {args.set}, 56 heads, {args.inputs} inputs")


def report(work, csv, what):
    """Runs each (name, function, FLOPs or None) of `work` for SECONDS while nvidia-smi samples
    the SM clock, the board power and the clock-event reasons into `csv`, then prints per
    workload its time per call (and TFLOP/s) beside the clock and power from 0.5 s into it."""
    for _, f, _ in work:  # compiles and warm-up outside the sampled time
        f()
    torch.cuda.synchronize()
    with open(csv, "w") as log:
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active",
                                "--format=csv,noheader", "-lms", "50"], stdout=log)
        marks = []
        try:
            for name, f, fl in work:
                torch.cuda.synchronize()
                time.sleep(0.5)
                t0, n, start = datetime.datetime.now(), 0, time.time()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                while time.time() - start < SECONDS:
                    f()
                    n += 1
                    if n % 20 == 0:
                        torch.cuda.synchronize()
                e1.record()
                torch.cuda.synchronize()
                marks.append((name, t0, datetime.datetime.now(), e0.elapsed_time(e1) / n, fl))
            time.sleep(0.3)
        finally:
            smi.terminate()
            smi.wait()
    rows = []
    for line in open(csv):
        f = [x.strip() for x in line.split(",")]
        try:
            rows.append((datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f"), float(f[1].split()[0]),
                         float(f[2].split()[0]), f[3]))
        except (ValueError, IndexError):
            pass
    limit = subprocess.run(["nvidia-smi", "--query-gpu=name,power.limit,clocks.max.sm", "--format=csv,noheader"],
                           capture_output=True, text=True).stdout.strip()
    print(f"{limit}; {what}; samples from 0.5 s into each workload")
    for name, a, b, ms, fl in marks:
        sel = [r for r in rows if a + datetime.timedelta(seconds=0.5) <= r[0] <= b]
        if not sel:
            print(f"{name}: no samples")
            continue
        clock, power = [r[1] for r in sel], [r[2] for r in sel]
        rate = f", {fl / (ms * 1e-3) / 1e12:.0f} TFLOP/s" if fl else ""
        print(f"{name}: {ms:.3f} ms a call{rate}; SM clock median {np.median(clock):.0f} MHz (min {min(clock):.0f}), "
              f"power median {np.median(power):.0f} W (max {max(power):.0f}), reasons {sorted(set(r[3] for r in sel))}")


if __name__ == "__main__":
    main()
