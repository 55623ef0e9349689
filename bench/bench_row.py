"""Times the MLP row stage (Numba) at M=16384 against a torch copy of the same bytes and torch eager.

python bench/bench_row.py [--rows 16384] [--json out.json]
Effective bandwidth = (bytes of x read + a_q and a_scale written) / kernel time. The kernel time
is the median over back-to-back launches with prepared arguments, the copy's likewise, in 5
alternating rounds (the median round is reported); the full call (argument
checks, DLPack and Numba views, launch) is timed too, as host latency per call.
"""
import argparse
import datetime
import json
import time

import torch

from h3kernels import minimax_h3_mlp_fp8_row_stage, reference as R
from h3kernels._launch import numba_ptx
from h3kernels.testing.inputs import make_row_inputs
from h3kernels.testing.timing import median_ms, row_stage_vs_copy


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=16384)
    p.add_argument("--json")
    p.add_argument("--sass", help="write the kernel's SASS here")
    a = p.parse_args()
    m = a.rows
    sets = [make_row_inputs(m, device="cuda", seed=s) for s in range(3)]  # rotated: 3 x 176 MB >> L2
    a_q = torch.empty(m, 5376, dtype=torch.float8_e4m3fn, device="cuda")
    a_s = torch.empty(m, device="cuda")

    kernel = numba_ptx.kernel("row_kernel", torch.cuda.current_device()).function  # the launched CuPy Function
    vs_copy = row_stage_vs_copy(sets, a_q, a_s)
    nbytes, ratio, rounds = vs_copy["bytes"], vs_copy["ratio"], vs_copy["rounds"]
    kernel_ms, gbs = vs_copy["kernel_ms"], vs_copy["kernel_gbs"]
    copy_ms, copy_gbs = vs_copy["copy_ms"], vs_copy["copy_gbs"]
    cur = {}

    setup = lambda i: cur.update(args=sets[i % len(sets)])
    call_ms = median_ms(lambda: minimax_h3_mlp_fp8_row_stage(*cur["args"], workspace_a_q=a_q, workspace_a_scale=a_s),
                        warmup=5, reps=30, setup=setup)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(50):
        minimax_h3_mlp_fp8_row_stage(*sets[i % 3], workspace_a_q=a_q, workspace_a_scale=a_s)
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3 / 50
    eager = median_ms(lambda: R.quantize_rows(R.mlp_row_stage(*cur["args"])), warmup=2, reps=10, setup=setup)

    res = dict(date=datetime.date.today().isoformat(), device=torch.cuda.get_device_name(), rows=m,
               bytes=nbytes, kernel_ms=kernel_ms, kernel_gbs=gbs, call_event_ms=call_ms, call_wall_ms=wall_ms,
               copy_ms=copy_ms, copy_gbs=copy_gbs, fraction_of_copy=ratio, torch_eager_ms=eager,
               rounds=[{key: r[key] for key in ("ratio", "kernel_ms", "copy_ms")} for r in rounds])
    round_ratios = ", ".join(f"{r['ratio']:.2f}" for r in rounds)
    print(f"row stage M={m}: kernel {kernel_ms:.4f} ms = {gbs:.0f} GB/s; torch copy of the same "
          f"{nbytes / 1e6:.0f} MB: {copy_ms:.4f} ms = {copy_gbs:.0f} GB/s; ratio {ratio:.2f} (median of "
          f"{len(rounds)} rounds: {round_ratios})")
    print(f"  full call: {call_ms:.4f} ms (events), {wall_ms:.4f} ms wall per call over 50 calls; "
          f"torch eager row stage {eager:.3f} ms")
    try:
        res["regs_per_thread"] = kernel.num_regs
        res["shared_bytes"] = kernel.shared_size_bytes
        print(f"  kernel resources: {res['regs_per_thread']} registers/thread, {res['shared_bytes']} B shared")
    except Exception as err:  # resource queries differ between CuPy versions
        print("  kernel resources: n/a", err)
    if a.sass:
        try:
            with open(a.sass, "w") as f:  # the PTX the launches load (cuobjdump reads SASS from a cubin)
                f.write(numba_ptx.ptx("row_kernel", torch.cuda.get_device_capability()))
        except Exception as err:
            print("  SASS: n/a", err)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
