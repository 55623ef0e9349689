"""Our attention kernel alone, cuDNN's FP8 SDPA and FlashAttention-3's FP8 forward (the kernels of
bench/bench_attention.py's FP8 columns, operands quantized beforehand), each run twice and then once
inside an NVTX range named ours, cudnn or fa3, on equal segments: for Nsight Compute
(lab/ncu_peers.sh) to profile the three side by side. Needs the `bench` extra's peers.

    python lab/peers_once.py [segment length 4096] [segments 4]"""
import sys

import torch

from h3kernels.peers import fp8_attention as peers
from h3kernels.testing.inputs import make_attention_inputs
from h3kernels.testing.timing import attention_kernel_alone


def main():
    length = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    segments = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    q, k, v, cu, cu_host = make_attention_inputs([length] * segments, 56, seed=4)
    scale = q.shape[2] ** -0.5
    runs = {"ours": attention_kernel_alone(q, k, v, cu, cu_host), "cudnn": peers.cudnn_fp8(q, k, v, cu_host, scale),
            "fa3": peers.fa3_fp8(q, k, v, cu_host, scale)}
    for run in runs.values():
        run(), run()
    torch.cuda.synchronize()
    for name, run in runs.items():
        torch.cuda.nvtx.range_push(name)
        run()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    print(f"{segments} x {length}: done")


if __name__ == "__main__":
    main()
