"""Our attention kernel alone and the FP8 peers' kernels (h3kernels.peers.fp8_attention.prepared:
cuDNN's FP8 SDPA and FlashAttention-3's FP8 forward, operands quantized beforehand, as
bench/bench_attention.py times them), each run twice and then once inside an NVTX range named
ours or the peer's key (cudnn_fp8, fa3_fp8), on equal segments: for Nsight Compute
(lab/ncu_peers.sh) to profile them side by side. A peer that cannot run here stops the script.

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
    runs = {"ours": attention_kernel_alone(q, k, v, cu, cu_host)}
    for key, _, _, run, err in peers.prepared(q, k, v, cu_host, fp8_only=True):
        if err is not None:
            raise SystemExit(f"{key}: {peers.reason(err)}")
        runs[key] = run
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
