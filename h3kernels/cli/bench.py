"""`python -m h3kernels bench`: both operators timed beside torch's bf16 path and this GPU's e4m3
mma.sync ceiling for the mma form each operator uses, measured in the same run; a table at the
end, CSV or JSON on request.

Times are CUDA-event medians of back-to-back calls (h3kernels.testing.timing.median_ms_batched) after a
warm-up. MLP peer: torch eager bf16 (h3kernels.peers.torch_mlp.mlp_bf16). Attention peer: torch's
scaled_dot_product_attention in bf16, one batched call for equal segment lengths, else one call
per segment. bench/bench_mlp.py and bench/bench_attention.py time more peers (FP8 _scaled_mm,
torch.compile, flash, cuDNN, varlen).
"""
import csv
import json
import sys
import time
from pathlib import Path

from h3kernels.cli.sizes import set_name

RECORDED = "perf_h200.json"


def recorded_figures(name=RECORDED):
    """The figures recorded on an H200 (docs/perf_h200.json, in the format `bench --json` writes),
    found from any working directory: in the repository the imported package sits in, else in
    the current directory's docs/ or that of a directory above it."""
    import h3kernels

    here = Path.cwd().resolve()
    places = [Path(h3kernels.__file__).resolve().parents[1], here, *here.parents]
    for root in places:
        path = root / "docs" / name
        if path.is_file():
            return json.loads(path.read_text())
    raise FileNotFoundError(f"docs/{name} not found beside the h3kernels package ({places[0]}) nor in {here} or "
                            f"above it: run from a checkout of the repository")


def progress(i, n, what, t0):
    bar = "#" * (20 * i // n)
    sys.stderr.write(f"\r[{bar:<20}] {i}/{n} {what:<48} {time.time() - t0:6.1f} s")
    sys.stderr.flush()
    if i == n:
        sys.stderr.write("\n")


def mlp_case(m):
    import torch

    import h3kernels
    from h3kernels.testing.inputs import make_mlp_weights, make_row_inputs
    from h3kernels.testing.timing import mlp_flops
    from h3kernels.testing.timing import median_ms_batched
    from h3kernels.peers.torch_mlp import mlp_bf16

    x, w, sc, sh, idx = make_row_inputs(m, device="cuda")
    gate, residual, w1, w2, q1, s1, q2, s2 = make_mlp_weights(m, sc.shape[0], seed=m)
    out = torch.empty_like(residual)
    ours = median_ms_batched(lambda: h3kernels.minimax_h3_mlp_fp8(x, w, sc, sh, idx, gate, residual, q1, s1, q2, s2,
                                                                   out=out))
    peer = median_ms_batched(lambda: mlp_bf16(x, w, sc, sh, idx, gate, residual, w1, w2))
    return dict(op="mlp", case=f"M={m}", flops=mlp_flops(m), ours_ms=ours, peer="torch eager bf16", peer_ms=peer)


def attention_case(seqlens, heads=56):
    import torch

    import h3kernels
    from h3kernels.testing.inputs import make_attention_inputs
    from h3kernels.testing.timing import attention_flops
    from h3kernels.testing.timing import median_ms_batched
    from h3kernels.peers.torch_attention import sdpa_bf16

    q, k, v, cu_dev, cu = make_attention_inputs(seqlens, heads, seed=len(seqlens))
    out = torch.empty_like(q)
    ours = median_ms_batched(lambda: h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, out,
                                                                                cu_seqlens_host=cu))
    peer = median_ms_batched(lambda: sdpa_bf16(q, k, v, cu))
    return dict(op="attention", case=f"{set_name(seqlens)}, {heads} heads", flops=attention_flops(seqlens, heads),
                ours_ms=ours,
                peer="torch SDPA bf16", peer_ms=peer)


def run(args):
    import torch

    from h3kernels.peers import mma_ceiling
    from h3kernels._runtime.targets import mma_form as attention_form
    from h3kernels._runtime.targets import mma_form as mlp_form

    dev = torch.cuda.current_device()
    # each row's % of ceiling is against the mma form its own operator runs (one per operator, as each may run its own family)
    forms = {}
    if args.rows:
        forms["mlp"] = mlp_form(dev)  # fp8_mma_form=-1, as mlp_case calls it
    if args.segments:
        forms["attention"] = attention_form(dev)
    jobs = [(f"mlp M={m}", lambda m=m: mlp_case(m)) for m in args.rows]
    jobs += [(f"attention {set_name(s)}", lambda s=s: attention_case(s)) for s in args.segments]
    steps = len(jobs) + 1  # the ceiling is step 0
    t0 = time.time()
    progress(0, steps, "e4m3 mma.sync ceiling", t0)
    failed = lambda err: sys.stderr.write(f"\ne4m3 mma.sync ceiling: failed {type(err).__name__}: {err}\n")
    ceilings = {form: mma_ceiling.ceiling_tflops(dev, form, on_error=failed) for form in sorted(set(forms.values()))}
    rows = []
    for i, (what, fn) in enumerate(jobs, start=1):
        progress(i, steps, what, t0)
        rows.append(fn())
        torch.cuda.empty_cache()
    progress(steps, steps, "done", t0)
    for r in rows:
        ceiling = ceilings[forms[r["op"]]]
        r["ours_tflops"] = r["flops"] / r["ours_ms"] / 1e9
        r["peer_tflops"] = r["flops"] / r["peer_ms"] / 1e9
        r["pct_ceiling"] = 100 * r["ours_tflops"] / ceiling if ceiling else None
        r["ceiling_tflops"] = ceiling
    shown = {form: f"{c:.0f} TFLOP/s (measured now)" if c else "n/a (measurement failed)"
             for form, c in ceilings.items()}
    if len(shown) == 1:
        ceiling_text = next(iter(shown.values()))
    else:
        ceiling_text = ", ".join(f"{op} (form {form}) {shown[form]}" for op, form in forms.items())
    print(f"{torch.cuda.get_device_name(dev)}: e4m3 mma.sync ceiling {ceiling_text}")
    print(f"{'operator':<10} {'case':<28} {'ours ms':>9} {'TFLOP/s':>8} {'% ceil':>7} {'peer':<18} {'peer ms':>9} "
          f"{'TFLOP/s':>8}")
    for r in rows:
        pct = f"{r['pct_ceiling']:6.1f}%" if r["pct_ceiling"] is not None else f"{'n/a':>7}"
        print(f"{r['op']:<10} {r['case']:<28} {r['ours_ms']:9.3f} {r['ours_tflops']:8.0f} {pct} "
              f"{r['peer']:<18} {r['peer_ms']:9.3f} {r['peer_tflops']:8.0f}")
    if args.json:
        # one figure for the GPU: the highest form's; each row carries its own operator's
        top = max((c for c in ceilings.values() if c), default=None)
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(dev), date=time.strftime("%Y-%m-%d"),
                           ceiling_tflops=top, rows=rows), f, indent=1)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0
