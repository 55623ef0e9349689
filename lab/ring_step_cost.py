"""What the ring's per-rank steps cost on one GPU before any message (1 x 16384 tokens, 56 heads):
the plain attention with and without the lse, the partial kernel over all keys (one rank's whole
step; with the true lse and with exact_lse=False, the merge's), and the virtual ring's steps
(tests/test_parallel.py's virtual_ring: every rank's statistics, partials and merges run one
after another on one GPU, as a call without the lse runs them and, `_exact_lse`, with it) at 2
and 4 ranks, even and uneven splits, against the plain call. Prints one line per case; --json writes them.
    python lab/ring_step_cost.py [--tokens 16384] [--json PATH] [--profile]"""
import argparse
import functools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import h3kernels  # noqa: E402
from h3kernels import parallel  # noqa: E402
from h3kernels.parallel import local  # noqa: E402
from h3kernels.quantize import div  # noqa: E402
from h3kernels.timing import median_ms  # noqa: E402
from h3kernels.testing.inputs import make_attention_inputs  # noqa: E402
from test_parallel import virtual_ring  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--json")
    p.add_argument("--profile", action="store_true", help="also a kernel table of the 2-rank virtual ring")
    a = p.parse_args()
    n = a.tokens
    q, k, v, cu_dev, cu = make_attention_inputs([n], 56, device="cuda", seed=5, k_offset=3.0)
    rows = {}
    rows["plain"] = median_ms(lambda: h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, cu_seqlens_host=cu))
    rows["plain_lse"] = median_ms(lambda: h3kernels.minimax_h3_varlen_attention_fp8(
        q, k, v, cu_dev, cu_seqlens_host=cu, return_lse=True))
    mean = k.float().mean(0, keepdim=True)
    v_scale = div(v.float().abs().amax(0, keepdim=True), 448.0).contiguous()
    rows["partial_all_keys"] = median_ms(lambda: h3kernels.minimax_h3_varlen_attention_fp8_partial(
        q, k, v, tuple(cu), tuple(cu), mean, v_scale))
    rows["partial_all_keys_merge_lse"] = median_ms(lambda: h3kernels.minimax_h3_varlen_attention_fp8_partial(
        q, k, v, tuple(cu), tuple(cu), mean, v_scale, exact_lse=False))
    fast = functools.partial(local.default_partial_attention, exact_lse=False)  # what a call without the lse runs
    for counts in ((n // 2, n - n // 2), (n // 2 - 1000, n // 2 + 1000), (n // 4,) * 4, (3000, 5000, 4500, n - 12500)):
        name = f"virtual_ring_{'_'.join(map(str, counts))}"
        rows[name] = median_ms(lambda: virtual_ring(q, k, v, cu, counts, fast), warmup=1, reps=5)
        rows[name + "_exact_lse"] = median_ms(
            lambda: virtual_ring(q, k, v, cu, counts, local.default_partial_attention), warmup=1, reps=5)
    if a.profile:  # where the 2-rank virtual ring's GPU time goes, kernel by kernel
        counts = (n // 2, n - n // 2)
        virtual_ring(q, k, v, cu, counts, fast)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            virtual_ring(q, k, v, cu, counts, fast)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=60))
    for name, ms in rows.items():
        print(f"{name:<40}{ms:9.3f} ms  {rows['plain'] / ms:6.3f}x plain's speed")
    if a.json:
        Path(a.json).write_text(json.dumps(dict(tokens=n, heads=56, ms=rows, device=torch.cuda.get_device_name()),
                                           indent=1))


if __name__ == "__main__":
    main()
