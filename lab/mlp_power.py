"""What the GPU's clock and power do under the MLP's GEMMs (lab/attention_power.py's sampling):
FC1 and FC2 of minimax_h3_mlp_fp8 (form 3) alone, torch._scaled_mm's FC1 and FC2 (row-wise
scales, the GEMMs of torch.compile's FP8 block) on the same M, the whole call, and the e4m3
wgmma ceiling (on its fixed pattern, and on FC1's own operand bytes: what the tensor cores alone
draw on these bits), each for a few seconds while nvidia-smi samples every 50 ms.

    python3 lab/mlp_power.py [--rows 16384] [--inputs normal|zeros]

--inputs zeros: x and the weights zero (the tensor cores' operands then do not toggle), to
separate what the operands' bits draw from the rest."""
import argparse
import os

import torch

import h3kernels
from h3kernels import reference as R
from h3kernels.constants import FFN, HIDDEN
from h3kernels.peers.torch_mlp import fc1_fp8, fc2_fp8, fp8_gemm_inputs
from h3kernels.peers.wgmma_ceiling import ceiling_launch
from h3kernels.testing.inputs import make_row_inputs
from h3kernels.testing.poison import poisoned_mlp_workspaces
from h3kernels.testing.timing import mlp_flops, mlp_gemm_flops, mlp_gemms_alone

from attention_power import report


ITERS = 16384  # wgmma groups per warpgroup in one ceiling launch (about 10 ms)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=16384)
    p.add_argument("--inputs", default="normal", choices=("normal", "zeros"))
    a = p.parse_args()
    m, dev = a.rows, torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(123)
    w1 = (torch.randn(2 * FFN, HIDDEN, generator=g, device=dev) * HIDDEN ** -0.5).bfloat16()
    w2 = (torch.randn(HIDDEN, FFN, generator=g, device=dev) * FFN ** -0.5).bfloat16()
    x, wn, sc, sh, idx = make_row_inputs(m, 50, device=dev, seed=7)
    gate = (0.5 * torch.randn(50, HIDDEN, generator=g, device=dev)).bfloat16()
    resid = torch.randn(m, HIDDEN, generator=g, device=dev).bfloat16()
    if a.inputs == "zeros":
        w1.zero_(), w2.zero_(), x.zero_()
    q1, s1 = h3kernels.prepare_minimax_h3_fc1_weight_fp8(w1)
    q2, s2 = h3kernels.prepare_minimax_h3_fc2_weight_fp8(w2)
    ws = poisoned_mlp_workspaces(m)
    args = (x, wn, sc, sh, idx, gate, resid, q1, s1, q2, s2)
    fc1, fc2 = mlp_gemms_alone(*args, ws)
    out = torch.empty_like(resid)
    w1q, w1s = R.quantize_rows(w1)
    w2q, w2s = R.quantize_rows(w2)
    w1s, w2s = w1s.reshape(1, -1).contiguous(), w2s.reshape(1, -1).contiguous()
    gi = fp8_gemm_inputs(x, wn, sc, sh, idx, w1q, w1s)
    flops1, flops2 = mlp_gemm_flops(m)
    # the ceiling's tiles filled with a_q's and w1_q's own bytes (each SM its own)
    fc1_bits = (ws["workspace_a_q"].view(torch.uint8).flatten(), q1.view(torch.uint8).flatten())
    work = [("ours FC1", fc1, flops1), ("_scaled_mm FC1", lambda: fc1_fp8(gi[0], gi[1], w1q, w1s), flops1),
            ("ours FC2", fc2, flops2), ("_scaled_mm FC2", lambda: fc2_fp8(gi[2], gi[3], w2q, w2s), flops2),
            ("ours, whole call", lambda: h3kernels.minimax_h3_mlp_fp8(*args, out=out, fp8_mma_form=3, **ws),
             mlp_flops(m)),
            ("e4m3 wgmma ceiling", *ceiling_launch(iters=ITERS)),
            ("e4m3 wgmma ceiling on FC1's operand bits", *ceiling_launch(iters=ITERS, operands=fc1_bits))]
    report(work, os.path.join(os.environ.get("OUT", "/tmp/h3out"), "mlp_power.csv"), f"M = {m}, {a.inputs} inputs")


if __name__ == "__main__":
    main()
