"""`python -m h3kernels bench`: both operators timed beside torch's bf16 path and this GPU's e4m3
ceiling of each row's instruction family, measured in the same run; a table at the end, CSV or
JSON on request. Each operator runs in every fp8_mma_form it offers on this GPU
(h3kernels._runtime.targets.offered_forms): on compute capability 9.0 both operators' wgmma
families (form 3) and mma.sync form 0, the one -1 picks first; each row has a `form` column and its % of
the ceiling of its family (the wgmma ceiling for form 3, the mma.sync one of its form otherwise).

Times are CUDA-event medians of back-to-back calls (h3kernels.testing.timing.median_ms_batched) after a
warm-up. MLP peers: torch.compile of the same block in FP8 (h3kernels.peers.torch_mlp.mlp_fp8:
torch._scaled_mm row-wise on per-token and per-row e4m3 operands, the peer a user of FP8 would
pick; torch's eager FP8 block where compiling fails), then torch eager bf16 (mlp_bf16, a second
peer column). Attention peers: torch's
scaled_dot_product_attention in bf16 with the cuDNN backend, then with the flash backend (a
second peer column), one batched call for equal segment lengths, else one call per segment;
torch's own choice of backend where cuDNN's refuses. Where installed, the FP8 attention peers of
h3kernels.peers.fp8_attention too (FlashAttention-3 in bf16; FA3's and cuDNN's FP8 kernels alone,
on operands quantized beforehand), beside our attention kernel alone (its launch replayed without
the quantization passes); a peer that cannot run is absent from the rows, its reason once in
"peers_unavailable". With the attention, the accuracy beside the speed: ours, the reference and
the FP8 peers against exact attention on one segment, with and without an offset on the keys
(h3kernels.testing.fp8_accuracy, "accuracy"). bench/bench_mlp.py and bench/bench_attention.py time
more peers (FP8 _scaled_mm, torch.compile, varlen).
"""
import csv
import json
import sys
import time
from pathlib import Path

from h3kernels.cli.output import finish
from h3kernels.cli.sizes import set_name
from h3kernels.cli.status import OK

RECORDED = "perf_h200.json"


def recorded_figures(name=RECORDED):
    """The figures recorded on an H200 (docs/perf_h200.json, in the format `bench --json` writes),
    from any working directory: installed with the package as h3kernels/figures/, or, from a
    checkout, in the repository's docs/. None where neither holds them."""
    import h3kernels

    package = Path(h3kernels.__file__).resolve().parent
    for path in (package / "figures" / name, package.parent / "docs" / name):
        if path.is_file():
            return json.loads(path.read_text())
    return None


def progress(i, n, what, t0):
    bar = "#" * (20 * i // n)
    sys.stderr.write(f"\r[{bar:<20}] {i}/{n} {what:<48} {time.time() - t0:6.1f} s")
    sys.stderr.flush()
    if i == n:
        sys.stderr.write("\n")


def mlp_case(m, forms=(-1,)):
    """One row per fp8_mma_form in `forms`, on the same inputs; torch is timed once for all."""
    import torch

    import h3kernels
    from h3kernels.testing.inputs import make_mlp_weights, make_row_inputs
    from h3kernels.peers.torch_mlp import timed_peers
    from h3kernels.testing.timing import median_ms_batched, mlp_flops

    x, w, sc, sh, idx = make_row_inputs(m, device="cuda")
    gate, residual, w1, w2, q1, s1, q2, s2 = make_mlp_weights(m, sc.shape[0], seed=m)
    out = torch.empty_like(residual)
    peers = timed_peers(x, w, sc, sh, idx, gate, residual, w1, w2)
    rows = []
    for form in forms:
        ours = median_ms_batched(lambda: h3kernels.minimax_h3_mlp_fp8(x, w, sc, sh, idx, gate, residual, q1, s1, q2,
                                                                       s2, out=out, fp8_mma_form=form))
        rows.append(dict(op="mlp", case=f"M={m}", form=form, flops=mlp_flops(m), ours_ms=ours, **peers))
    return rows


def attention_case(seqlens, forms=(-1,), heads=56, unavailable=None):
    """As mlp_case: one row per fp8_mma_form. Peers timed once: cuDNN's SDPA in bf16 (`peer`, or
    torch's own choice of backend where cuDNN's refuses), flash's (`peer2`, where it runs), and
    the peers of h3kernels.peers.fp8_attention that run here (`<key>_ms`: fa3_ms, fa3_fp8_ms,
    cudnn_fp8_ms; the FP8 ones their kernel alone). Each row also has our attention kernel alone
    (`ours_kernel_ms`), what the FP8 peers' kernels compare with. unavailable, a dict when given,
    receives {peer key: why it is not in the rows}."""
    import torch

    import h3kernels
    from h3kernels.peers import fp8_attention
    from h3kernels.testing.inputs import make_attention_inputs
    from h3kernels.testing.timing import attention_flops, attention_kernel_alone
    from h3kernels.testing.timing import median_ms_batched
    from h3kernels.peers.torch_attention import sdpa_backend_bf16, sdpa_bf16

    q, k, v, cu_dev, cu = make_attention_inputs(seqlens, heads, seed=len(seqlens))
    out = torch.empty_like(q)
    peers = {}
    for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):
        fn, label = sdpa_backend_bf16(q, k, v, cu, backend)
        if fn is not None:
            peers[label] = median_ms_batched(fn)
    if "cuDNN SDPA bf16" not in peers:
        peers = {"torch SDPA bf16": median_ms_batched(lambda: sdpa_bf16(q, k, v, cu)), **peers}
    (peer, peer_ms), *rest = peers.items()
    second = dict(peer2=rest[0][0], peer2_ms=rest[0][1]) if rest else {}
    timed = {}
    # the same preparation as bench/bench_attention.py's: a peer that cannot run says why
    for key, _, _, run, err in fp8_attention.prepared(q, k, v, cu):
        if err is None:
            try:
                timed[f"{key}_ms"] = median_ms_batched(run)
            except Exception as failed:  # its row's loss, not the bench's
                err = failed
        if err is not None and unavailable is not None:
            unavailable[key] = fp8_attention.reason(err)
        del run
    rows = []
    case = f"{set_name(seqlens)}, {heads} heads"
    for form in forms:
        ours = median_ms_batched(lambda: h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, out,
                                                                                    cu_seqlens_host=cu,
                                                                                    fp8_mma_form=form))
        row = dict(op="attention", case=case, form=form, flops=attention_flops(seqlens, heads), ours_ms=ours,
                   peer=peer, peer_ms=peer_ms, **second)
        try:  # its launch replayed on the scratch the call left: no quantization passes
            row["ours_kernel_ms"] = median_ms_batched(attention_kernel_alone(q, k, v, cu_dev, cu, form=form))
        except Exception as err:
            sys.stderr.write(f"\n{case}, form {form}: our kernel alone not timed: {type(err).__name__}: {err}\n")
        rows.append({**row, **timed})
    return rows


def accuracy_figures(forms):
    """h3kernels.testing.fp8_accuracy.attention_accuracy at its defaults, ours in each of `forms`."""
    from h3kernels.testing.fp8_accuracy import attention_accuracy

    return attention_accuracy(forms)


def reasons_once(by_case, every):
    """{case: {peer key: why}} -> {peer key: why}, each reason written once: bare where each case
    of `every` (the segment sets) gave it, else after the cases that did."""
    once = {}
    for key in dict.fromkeys(k for why in by_case.values() for k in why):
        where = {}
        for case, why in by_case.items():
            if key in why:
                where.setdefault(why[key], []).append(case)
        once[key] = "; ".join(text if set(every) <= set(names) else f"{', '.join(names)}: {text}"
                              for text, names in where.items())
    return once


def ceiling_tflops(dev, form, on_error):
    """The e4m3 ceiling of the instruction family of `form`, measured now: the wgmma one for the
    wgmma family (form 3), the mma.sync one of that form otherwise; None where it fails."""
    from h3kernels._runtime import targets

    if targets.form_family(form) == targets.WGMMA:
        from h3kernels.peers import wgmma_ceiling

        return wgmma_ceiling.ceiling_tflops(dev, on_error=on_error)
    from h3kernels.peers import mma_ceiling

    return mma_ceiling.ceiling_tflops(dev, form, on_error=on_error)


def run(args):
    import torch

    from h3kernels._runtime.targets import form_family, offered_forms

    dev = torch.cuda.current_device()
    # Each operator is timed in every form it offers here (targets.offered_forms: the one -1 picks
    # first), and each row's % of ceiling is against the ceiling of its own form's family.
    forms = {"mlp": offered_forms("mlp", dev) if args.rows else (),
             "attention": offered_forms("attention", dev) if args.segments else ()}
    unavailable = {}  # case -> {peer key: why it did not run}
    jobs = [(f"mlp M={m}", lambda m=m: mlp_case(m, forms["mlp"])) for m in args.rows]
    jobs += [(f"attention {set_name(s)}",
              lambda s=s: attention_case(s, forms["attention"], unavailable=unavailable.setdefault(set_name(s), {})))
             for s in args.segments]
    needed = sorted(set(forms["mlp"]) | set(forms["attention"]))
    steps = len(needed) + len(jobs) + bool(forms["attention"])
    t0 = time.time()
    ceilings = {}
    for i, form in enumerate(needed):
        what = f"e4m3 {form_family(form)} ceiling (form {form})"
        progress(i, steps, what, t0)
        failed = lambda err, what=what: sys.stderr.write(f"\n{what}: failed {type(err).__name__}: {err}\n")
        ceilings[form] = ceiling_tflops(dev, form, failed)
    rows = []
    for i, (what, fn) in enumerate(jobs, start=len(needed)):
        progress(i, steps, what, t0)
        rows += fn()
        torch.cuda.empty_cache()
    extra = {}
    if forms["attention"]:
        progress(steps - 1, steps, "attention accuracy", t0)
        try:
            extra["accuracy"], unavailable["accuracy"] = accuracy_figures(forms["attention"])
            torch.cuda.empty_cache()
        except Exception as err:  # the times stand without it
            extra["accuracy"] = dict(error=f"{type(err).__name__}: {err}")
            sys.stderr.write(f"\nattention accuracy: failed {extra['accuracy']['error']}\n")
        extra["peers_unavailable"] = reasons_once(unavailable, [set_name(s) for s in args.segments])
    progress(steps, steps, "done", t0)
    for r in rows:
        ceiling = ceilings[r["form"]]
        r["ours_tflops"] = r["flops"] / r["ours_ms"] / 1e9
        r["peer_tflops"] = r["flops"] / r["peer_ms"] / 1e9
        if "peer2_ms" in r:
            r["peer2_tflops"] = r["flops"] / r["peer2_ms"] / 1e9
        r["pct_ceiling"] = 100 * r["ours_tflops"] / ceiling if ceiling else None
        r["ceiling_tflops"] = ceiling
    shown = [f"{form_family(form)} (form {form}) " + (f"{c:.0f} TFLOP/s" if c else "n/a (measurement failed)")
             for form, c in ceilings.items()]
    print(f"{torch.cuda.get_device_name(dev)}: e4m3 ceiling{'s' if len(shown) > 1 else ''} measured now: "
          f"{', '.join(shown)}")
    second_head = f"  {'second peer':<16} {'ms':>9}" if any("peer2" in r for r in rows) else ""
    print(f"{'operator':<10} {'case':<28} {'form':>4} {'ours ms':>9} {'TFLOP/s':>8} {'% ceil':>7} {'peer':<18} "
          f"{'peer ms':>9} {'TFLOP/s':>8}{second_head}")
    for r in rows:
        pct = f"{r['pct_ceiling']:6.1f}%" if r["pct_ceiling"] is not None else f"{'n/a':>7}"
        second = f"  {r['peer2']:<16} {r['peer2_ms']:9.3f}" if "peer2" in r else ""
        print(f"{r['op']:<10} {r['case']:<28} {r['form']:>4} {r['ours_ms']:9.3f} {r['ours_tflops']:8.0f} {pct} "
              f"{r['peer']:<18} {r['peer_ms']:9.3f} {r['peer_tflops']:8.0f}{second}")
    if forms["attention"]:
        print("\n".join(fp8_lines([r for r in rows if r["op"] == "attention"], extra)))
    if args.json:
        # ceiling_tflops: one figure for the GPU, the highest family's; `ceilings` has each
        # family's, and each row carries that of its own form
        top = max((c for c in ceilings.values() if c), default=None)
        families = [dict(form=form, family=form_family(form), tflops=c) for form, c in ceilings.items()]
        finish(args.json, dict(command="bench", device=torch.cuda.get_device_name(dev),
                               date=time.strftime("%Y-%m-%d"), ceiling_tflops=top, ceilings=families, rows=rows,
                               **extra))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            # every row's fields, blank where a row has none
            w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)), restval="")
            w.writeheader()
            w.writerows(rows)
    return OK


def fp8_lines(rows, extra):
    """The printed report's FP8 part: the attention rows' kernels alone beside the FP8 peers
    (ms), the peers that did not run and why, and the accuracy figures."""
    from h3kernels.peers.fp8_attention import PEERS

    peers = [(f"{key}_ms", label) for key, label, _, _ in PEERS if any(f"{key}_ms" in r for r in rows)]
    lines = ["attention, ms: ours whole call and its kernel alone (no quantization passes; form 3's kernel quantizes "
             "Q itself) beside the FP8 peers (the FP8 ones their kernel alone, operands quantized beforehand)",
             f"{'case':<28} {'form':>4} {'ours':>9} {'kernel':>9}" + "".join(f" {label:>17}" for _, label in peers)]
    for r in rows:
        kernel = f"{r['ours_kernel_ms']:9.3f}" if "ours_kernel_ms" in r else f"{'-':>9}"
        lines.append(f"{r['case']:<28} {r['form']:>4} {r['ours_ms']:9.3f} {kernel}"
                     + "".join(f" {r[f]:17.3f}" if f in r else f" {'-':>17}" for f, _ in peers))
    labels = {key: label for key, label, _, _ in PEERS}
    for key, why in extra.get("peers_unavailable", {}).items():
        lines.append(f"not run: {labels.get(key, key)}: {why}")
    acc = extra.get("accuracy")
    if acc and "rows" in acc:
        lines.append(f"rel L2 against {acc['against']}, one segment of {acc['tokens']} tokens x {acc['heads']} heads "
                     f"x {acc['head_dim']}: random keys, and keys + {acc['k_offset']:g} x a random vector per head")
        for a in acc["rows"]:
            cells = [f"{a[f]:9.5f}" if f in a else f"{'-':>9}" for f in ("rel_l2", "rel_l2_k_offset")]
            lines.append(f"  {a['label']:<36} " + " ".join(cells))
    elif acc:
        lines.append(f"accuracy not measured: {acc.get('error')}")
    return lines
