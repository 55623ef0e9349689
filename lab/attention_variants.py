"""The attention kernel alone per lab build (patched_builds: a patch name, "a+b" for several),
against the shipped build, in rounds that take every build in turn; each build's out checked bit
for bit against the shipped build's.

    python lab/attention_variants.py [--sets 4x4096 1x16384 ...] --patches NAME [NAME ...] [--rounds 3]
"""
import argparse
import statistics
import sys
from pathlib import Path

import torch

import patched_builds as pb
from h3kernels.testing.timing import attention_kernel_alone
from h3kernels.timing import median_ms_batched

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_attention import SETS, make_set  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sets", nargs="+", default=["4x4096", "1x16384", "16x1024", "64x256"])
    p.add_argument("--patches", nargs="+", default=[])
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    builds = [("shipped", None)] + [(name, pb.LabAttentionBuild(patch=name)) for name in a.patches]
    for name in a.sets:
        s = make_set(dict(SETS)[name], 56, 0, torch.device("cuda"))
        runs = []
        for label, build in builds:
            f = attention_kernel_alone(s["q"], s["k"], s["v"], s["cu"], s["cu_host"], build=build)
            out = f.arrays[1]
            out.fill_(float("nan"))
            f()
            torch.cuda.synchronize()
            runs.append((label, f, out.clone(), []))
        ref = runs[0][2]
        for _ in range(a.rounds):
            for label, f, out, times in runs:
                times.append(median_ms_batched(f, batch=5, warmup=2, reps=7))
        base = statistics.median(runs[0][3])
        for label, f, out, times in runs:
            t = statistics.median(times)
            same = bool(torch.equal(out.view(torch.int16), ref.view(torch.int16)))
            print(f"{name:<10}{label:<28}{t:8.3f} ms  {t / base:6.3f}x  bitwise {same}", flush=True)


if __name__ == "__main__":
    main()
