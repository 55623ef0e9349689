"""Runs the row stage on fresh inputs until a_q differs from the reference, then saves that row's
inputs and both outputs (for offline analysis). python lab/debug_row_mismatch.py OUT_FILE"""
import sys

import torch

from h3kernels import minimax_h3_mlp_fp8_row_stage, reference as R
from h3kernels.testing.inputs import make_row_inputs

for seed in range(12):
    x, w, sc, sh, idx = make_row_inputs(16384, device="cuda", seed=seed)
    a_q, a_s = minimax_h3_mlp_fp8_row_stage(x, w, sc, sh, idx)
    cpu = [t.cpu() for t in (x, w, sc, sh, idx)]
    q, s = R.quantize_rows(R.mlp_row_stage(*cpu))
    bad = (a_q.cpu().view(torch.uint8) != q.view(torch.uint8)).nonzero()
    print(seed, "mismatches", len(bad), "scale mismatches", int((a_s.cpu() != s).sum()))
    if len(bad):
        r = int(bad[0, 0])
        i = int(cpu[4][r])
        keep = dict(x=cpu[0][r], w=cpu[1], sc=cpu[2][i], sh=cpu[3][i], got=a_q[r].cpu().view(torch.uint8),
                    want=q[r].view(torch.uint8), got_s=a_s[r].cpu(), want_s=s[r], cols=bad[:, 1][bad[:, 0] == r])
        torch.save({k: v.clone() for k, v in keep.items()}, sys.argv[1])
        break
