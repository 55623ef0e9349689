"""Runs minimax_h3_varlen_attention_fp8 a few times on one of bench_attention's segment sets, for a
profiler to attach to (lab/ncu_attention.sh).

python lab/attention_once.py 4x4096 [calls]"""
import sys
from pathlib import Path

import torch

import h3kernels

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # the benchmarks' segment sets
from bench_attention import SETS, make_set  # noqa: E402


def main():
    name = sys.argv[1]
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    lens = dict(SETS)[name]
    s = make_set(lens, 56, 0, torch.device("cuda"))
    out = torch.empty_like(s["q"])
    for _ in range(calls):
        h3kernels.minimax_h3_varlen_attention_fp8(s["q"], s["k"], s["v"], s["cu"], out, cu_seqlens_host=s["cu_host"])
    torch.cuda.synchronize()
    print(name, "done")


if __name__ == "__main__":
    main()
