"""Where a row-stage call spends host time (cProfile over 200 calls), and what the compiled
kernel's PTX holds (division, conversions)."""
import cProfile
import pstats
import re

import torch

from h3kernels import minimax_h3_mlp_fp8_row_stage
from h3kernels._launch import numba_ptx
from h3kernels.testing.inputs import make_row_inputs

args = make_row_inputs(256, device="cuda")
minimax_h3_mlp_fp8_row_stage(*args)
torch.cuda.synchronize()
prof = cProfile.Profile()
prof.enable()
for _ in range(200):
    minimax_h3_mlp_fp8_row_stage(*args)
torch.cuda.synchronize()
prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(18)
for ptx in [numba_ptx.ptx("row_kernel", torch.cuda.get_device_capability())]:
    counts = {k: len(re.findall(k, ptx)) for k in (r"div\.rn\.f32", r"div\.full", r"div\.approx", r"rcp\.",
                                                   r"cvt\.rn\.bf16\.f32", r"cvt\.rn\.satfinite\.e4m3x2",
                                                   r"ld\.global\.u64", r"ld\.global\.nc\.u64", r"st\.global\.u32",
                                                   r"sqrt\.rn", r"\.local")}
    print(counts)
