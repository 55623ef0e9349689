"""Times the MLP row stage (Numba) at M=16384 against a torch copy of the same bytes and torch eager.

python bench/bench_row.py [--rows 16384] [--json out.json]
Effective bandwidth = (bytes of x read + a_q and a_scale written) / time.
"""
import argparse
import datetime
import json

import torch

from h3kernels import minimax_h3_mlp_fp8_row_stage, reference as R
from h3kernels.demo import make_row_inputs
from h3kernels.timing import copy_bandwidth_gbs, median_ms


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=16384)
    p.add_argument("--json")
    a = p.parse_args()
    m = a.rows
    sets = [make_row_inputs(m, device="cuda", seed=s) for s in range(3)]  # rotated: 3 x 176 MB >> L2
    a_q = torch.empty(m, 5376, dtype=torch.float8_e4m3fn, device="cuda")
    a_s = torch.empty(m, device="cuda")
    cur = {}
    setup = lambda i: cur.update(args=sets[i % len(sets)])
    run = lambda: minimax_h3_mlp_fp8_row_stage(*cur["args"], workspace_a_q=a_q, workspace_a_scale=a_s)
    ms = median_ms(run, warmup=5, reps=50, setup=setup)
    eager = median_ms(lambda: R.quantize_rows(R.mlp_row_stage(*cur["args"])), warmup=2, reps=10, setup=setup)
    nbytes = m * 5376 * 2 + m * 5376 + m * 4
    copy_gbs, copy_ms = copy_bandwidth_gbs(nbytes)
    gbs = nbytes / (ms * 1e-3) / 1e9
    res = dict(date=datetime.date.today().isoformat(), device=torch.cuda.get_device_name(), rows=m,
               bytes=nbytes, row_stage_ms=ms, row_stage_gbs=gbs, copy_ms=copy_ms, copy_gbs=copy_gbs,
               fraction_of_copy=gbs / copy_gbs, torch_eager_ms=eager)
    print(f"row stage M={m}: {ms:.4f} ms, {gbs:.0f} GB/s; torch copy of the same {nbytes / 1e6:.0f} MB: "
          f"{copy_ms:.4f} ms, {copy_gbs:.0f} GB/s; ratio {gbs / copy_gbs:.2f}; torch eager row stage {eager:.3f} ms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
