"""The attention's wgmma family (fp8_mma_form=3, cuda_src/varlen_attention_fp8_sm90a.cu) on an
H100/H200 in one run: its build report, its correctness against the reference, exact attention
and form 0 (mma.sync), and its timings beside form 0, cuDNN and flash bf16 SDPA.

python bench/hopper_attention.py [--json PATH] [--debug] [--no-time] [--no-peers] [--s-split-sets N]
                                 [--only s_split|long|probe [--builds NAME=VALUE[,NAME=VALUE] ...]]

Stages (each caught on its own, so one failure still reports the rest; the JSON is rewritten
after every stage):
  build     ptxas report of the default build and of the timed variants (regs, spills, warnings)
  first     one small call of form 3 polled with a timeout (a hang writes the report, exit 3)
  small     segments [0, 1, 127, 128, 129, 1000] and [0, 300, 0, 77, 1, 0] (8 heads):
            checks.attention_misses (reference and exact bounds), poisoned out fully written,
            lse against form 0's, out aliasing q bitwise
  debug     1 head, one segment of 128 and of 200 tokens: S and 256 * 2^(S - m) of the first 128
            keys (DBG_STORE builds) against float64 from the reference's quantization, and O
            against form 0 and the reference; the first mismatches printed (--debug: always,
            else only when the small sets fail)
  s_split   the default build, the ACCUMULATION builds (ONE_BLOCK_SYNC, S_SPLIT) and form 0 on 41
            short sets (--s-split-sets), one-block segments (bound 0.005) and longer ones (0.03): the
            worst segment against its bound, the sets that miss a bound; each on 4 x 4096 against
            exact attention
  accuracy  4 x 4096 and 7000+3000+6000+384 on 4 heads: rel L2 of forms 3 and 0 against the
            reference and against exact float64 attention, beside the reference's own error
  heads     the same two sets on 56 heads: form 3 against form 0 (rel L2, max |diff|, lse) and
            both against exact attention
  long      1 x 16384 and 1 x 65536 (2 heads), the longest P V chains: the default build, each
            ACCUMULATION build, form 0 and the reference against exact attention on 2048
            sampled query rows
  time      4 x 4096 and 1 x 16384, 56 heads: whole call of forms 3 and 0 (out given,
            cu_seqlens_host given), each kernel alone (its captured launch replayed), the
            quantization passes alone (with the bytes each moves and their fraction of HBM
            peak), cuDNN and flash bf16 SDPA
  variants  the VARIANTS builds (S128 0 / 2, OVERLAP, PINGPONG, STAGES) bitwise against their peer
            (hopper.bitwise_peer: the default build, or BLOCK_MAX for the loops without the stage max)
            (the ACCUMULATION builds against the bounds),
            each polled with a timeout; then every one with finite results timed, whole call
            and kernel alone
  probe     (--only probe) the DBG_PERF builds timed beside the default on 4 x 4096, 1 x 16384
            and 16 x 1024, results garbage: what bounds the loop (docs/hopper.md)
The last lines are a table; the JSON goes to --json (default $OUT/hopper_attention.json)."""
import argparse
import json
import math
import os
import sys
import time
import traceback

import torch

import h3kernels
from h3kernels import reference as R
from h3kernels._launch import varlen_attention_fp8_sm90a as hopper
from h3kernels._runtime import compiler
from h3kernels.cli.compile_check import _nonce, parse_ptxas
from h3kernels.testing.checks import ONE_BLOCK_KEYS, attention_misses, exact_attention, reference_bound, reference_rows
from h3kernels.testing.checks import rel_l2
from h3kernels.testing.inputs import make_attention_inputs
from h3kernels.testing.poison import poisoned_like
from h3kernels.testing.timing import attention_flops, attention_kernel_alone, attention_quant_kernel_ms
from h3kernels.testing.timing import attention_quant_least_bytes, attention_quant_pass_bytes, median_ms_batched

OUT = os.environ.get("OUT", "/tmp/h3out")
os.makedirs(OUT, exist_ok=True)
T0 = time.time()
# builds checked bitwise against the default one and timed beside it
VARIANTS = list(hopper.VARIANTS) + list(hopper.ACCUMULATION)  # all timed
ACC_BUILDS = list(hopper.ACCUMULATION)  # the s_split and long stages' other builds (--builds: these)
# DBG_PERF builds (cuda_src/varlen_attention_fp8_sm90a.cu), sums of: 1 no reloads of K and V, 2 a
# constant P, 4 no wgmma, 8 no ex2, 16 each softmax twice, 32 no epilogue, 64 the second consumer
# warpgroup idle (the first alone, half the rows computed); timed beside the
# default with --only probe (16 x 1024 too: its tiles are short) to tell what bounds the loop
# (results garbage)
PROBES = [(("DBG_PERF", n),) for n in (1, 2, 4, 8, 1 | 2, 1 | 4, 1 | 4 | 8, 16, 1 | 4 | 16, 1 | 4 | 8 | 16, 32, 64, 64 | 1,
                                               64 | 1 | 2, 64 | 1 | 4)]
HBM_TBS = 4.8  # H200 SXM HBM3e peak (datasheet), for the quantization passes' bandwidth fraction
LOG2E = 1.4426950408889634


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def op(q, k, v, cu_dev, cu, form, out=None, **kw):
    return h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, out, cu_seqlens_host=cu, fp8_mma_form=form,
                                                     **kw)


def nonfinite(t):
    return int((~torch.isfinite(t.float())).sum())


def wait(timeout_s):
    ev = torch.cuda.Event()
    ev.record()
    t = time.time()
    while not ev.query():
        if time.time() - t > timeout_s:
            return False
        time.sleep(0.002)
    return True


# --- stages ------------------------------------------------------------------------------------

def stage_build():
    res = {}
    for variant in [()] + VARIANTS:
        _, text, _ = compiler.compile_cubin("varlen_attention_fp8_sm90a", hopper.ARCH, hopper.defines(**dict(variant)),
                                            ("-Xptxas=-v",), use_cache=False, appended=_nonce())
        name = "default" if not variant else "_".join(f"{k}{v}" for k, v in variant)
        res[name] = dict(kernels=parse_ptxas(text), warnings=[ln for ln in text.splitlines() if "warn" in ln.lower()])
        log("build", name, json.dumps(res[name]))
    return res


def stage_first():
    q, k, v, cu_dev, cu = make_attention_inputs([130, 0, 7], 2, device="cuda", seed=1)
    out = poisoned_like(q)
    op(q, k, v, cu_dev, cu, 3, out)
    if not wait(30):
        raise TimeoutError("form 3 still running 30 s after its first launch (hang)")
    want = op(q, k, v, cu_dev, cu, 0)
    torch.cuda.synchronize()
    res = dict(nonfinite=nonfinite(out), rel_l2_vs_form0=rel_l2(out, want))
    log("first", json.dumps(res))
    return res


def _with_variant(variant, fn):
    """fn() with the operator's form-3 launches built with `variant` defines."""
    with hopper.use_build(variant):
        return fn()


def _mismatches(got, want, tol, what, n=8):
    """The first n (row, key, got, want) where |got - want| > tol * (1 + |want|) or got is NaN
    (infinite want: where got differs), and their count."""
    finite = torch.isfinite(want)
    bad = torch.where(finite, ~((got - want).abs() <= tol * (1 + want.abs())), got != want)  # NaN: bad
    idx = torch.nonzero(bad)[:n].tolist()
    out = [(r, c, float(got[r, c]), float(want[r, c])) for r, c in idx]
    log(f"  {what}: {int(bad.sum())} of {bad.numel()} beyond {tol}: first {out}")
    return dict(count=int(bad.sum()), first=out)


def stage_debug():
    res = {}
    for n in (128, 200):
        q, k, v, cu_dev, cu = make_attention_inputs([n], 1, device="cuda", seed=5)
        scale = 1 / math.sqrt(128)
        q8, s_q, k8, s_k, _, _ = R.quantize_attention_inputs(q, k, v, cu)
        keys = min(n, 128)
        dot = q8[:, 0].float().double() @ k8[:keys, 0].float().double().T  # [n, keys] (e4m3 via f32)
        s_want = dot * s_q[:, 0].double()[:, None] * s_k[:keys, 0].double()[None, :] * (scale * LOG2E)
        s_full = torch.full((n, 128), float("-inf"), dtype=torch.float64, device="cuda")
        s_full[:, :keys] = s_want
        # 256 * 2^(S - m) with m the running max after each 64-key block (keys 0-63, then 0-127)
        m0 = s_full[:, :64].max(1).values
        m1 = torch.maximum(m0, s_full[:, 64:].max(1).values)
        p_want = torch.cat([256 * torch.exp2(s_full[:, :64] - m0[:, None]),
                            256 * torch.exp2(s_full[:, 64:] - m1[:, None])], 1)
        entry = {}
        for dbg, want, what, tol in ((1, s_full, "S (log2 units)", 2e-2), (2, p_want, "256 2^(S - m)", 2e-2)):
            out = torch.full_like(q, float("nan"))
            dbg_build = (("DBG_STORE", dbg), ("FOLD_256", 0), ("FOLD_SCALE", 0), ("OVERLAP", 0), ("PINGPONG", 0),
                         ("S128", 0))
            _with_variant(dbg_build, lambda: op(q, k, v, cu_dev, cu, 3, out))
            torch.cuda.synchronize()
            got = out[:, 0].double()[:, :128]
            entry[f"dbg{dbg}"] = _mismatches(got, want, tol, f"n={n} {what}")
        o3 = op(q, k, v, cu_dev, cu, 3)
        o0 = op(q, k, v, cu_dev, cu, 0)
        ref = R.attention_fp8(q, k, v, cu)
        torch.cuda.synchronize()
        entry["O_vs_form0"] = _mismatches(o3[:, 0].double(), o0[:, 0].double(), 2e-2, f"n={n} O vs form 0")
        entry["rel_l2_vs_form0"], entry["rel_l2_vs_ref"] = rel_l2(o3, o0), rel_l2(o3, ref)
        log(f"debug n={n}: rel L2 vs form 0 {entry['rel_l2_vs_form0']:.3e}, vs reference {entry['rel_l2_vs_ref']:.3e}")
        res[n] = entry
    return res


def stage_small():
    res = {}
    for seqlens in ([0, 1, 127, 128, 129, 1000], [0, 300, 0, 77, 1, 0]):
        q, k, v, cu_dev, cu = make_attention_inputs(seqlens, 8, device="cuda", seed=11)
        out = poisoned_like(q)
        op(q, k, v, cu_dev, cu, 3, out)
        o_lse, lse = op(q, k, v, cu_dev, cu, 3, return_lse=True)
        _, lse0 = op(q, k, v, cu_dev, cu, 0, return_lse=True)
        q2 = q.clone()
        al = op(q2, k, v, cu_dev, cu, 3, q2, return_lse=True)
        torch.cuda.synchronize()
        misses = attention_misses(out, q, k, v, cu)
        d = (lse.double() - lse0.double()).abs()
        entry = dict(misses=misses, nonfinite=nonfinite(out), rel_l2_vs_ref=rel_l2(out, R.attention_fp8(q, k, v, cu)),
                     lse_max_diff_vs_form0=float(d.max()) if d.numel() else 0.0,
                     lse_nonfinite=int((~torch.isfinite(lse)).sum()),
                     out_same_with_lse=bool(torch.equal(out.view(torch.int16), o_lse.view(torch.int16))),
                     alias_q_bitwise=bool(torch.equal(q2.view(torch.int16), out.view(torch.int16))
                                          and torch.equal(al[1], lse)))
        entry["ok"] = (not misses and entry["out_same_with_lse"] and entry["alias_q_bitwise"]
                       and entry["lse_nonfinite"] == 0 and entry["lse_max_diff_vs_form0"] <= 1e-3 * (1 + float(lse0.abs().max())))
        log("small", seqlens, json.dumps(entry))
        res["+".join(map(str, seqlens))] = entry
    return res


def stage_variants():
    """Every build of VARIANTS (the same arithmetic in the same order: bitwise its bitwise_peer's,
    the default's or BLOCK_MAX's) and of ACCUMULATION (other S sums: held to the attention's bounds
    instead) against that peer (ACCUMULATION's: the default), on a mixed set."""
    res = {}
    q, k, v, cu_dev, cu = make_attention_inputs([1000, 0, 129, 64, 3000, 1], 8, device="cuda", seed=41)
    peer_of = lambda b: hopper.bitwise_peer(b) if b in hopper.VARIANTS else ()  # noqa: E731
    peers = {p: _with_variant(p, lambda: op(q, k, v, cu_dev, cu, 3, poisoned_like(q), return_lse=True))
             for p in {peer_of(b) for b in VARIANTS}}
    for variant in VARIANTS:
        want, want_lse = peers[peer_of(variant)]
        name = "_".join(f"{a}{b}" for a, b in variant)
        got, lse = _with_variant(variant, lambda: op(q, k, v, cu_dev, cu, 3, poisoned_like(q), return_lse=True))
        if not wait(30):
            raise TimeoutError(f"build {name} still running 30 s after its launch (hang)")
        res[name] = dict(bitwise=bool(torch.equal(got.view(torch.int16), want.view(torch.int16))
                                      and torch.equal(lse, want_lse)), rel_l2=rel_l2(got, want),
                         nonfinite=nonfinite(got), lse_nonfinite=int((~torch.isfinite(lse)).sum()))
        if not res[name]["bitwise"]:  # other bits: still within the attention's bounds?
            res[name]["misses"] = attention_misses(got, q, k, v, cu)
        log("variant", name, json.dumps(res[name]))
    return res


def stage_s_split(n_sets=40):
    """The default build, each ACCUMULATION build (other S sums or P roundings) and form 0 on
    short segments, where the reference's P grid holds the output to 0.005: n_sets random sets of 1-3 segments (half of 1-64 tokens, half of 1-300; 1 or
    8 heads) and the set [64] x 1 head, seed 0 (its first miss). For one-block segments and for
    longer ones: the worst segment's rel L2 against its bound (and which); how many segments come
    within 0.8 of their bound; the sets that miss a bound. Then 4 x 4096 on 4 heads against
    exact attention."""
    res = {}
    cases = [([64], 1, 0)]
    for seed in range(n_sets):
        rng = torch.Generator().manual_seed(1000 + seed)
        n = int(torch.randint(1, 4, (1,), generator=rng))
        longest = 64 if seed % 4 < 2 else 300
        cases.append((torch.randint(1, longest + 1, (n,), generator=rng).tolist(), 1 if seed % 2 else 8, seed))
    long_set = make_attention_inputs([4096] * 4, 4, device="cuda", seed=21)
    long_exact = exact_attention(*long_set[:3], long_set[4])
    builds = [("default", 3, ())] + [("_".join(f"{a}{b}" for a, b in v), 3, v) for v in ACC_BUILDS]
    for name, form, variant in builds + [("form 0", 0, ())]:
        worst, worst_at, near, segments, missed, first = {}, {}, 0, 0, [], None
        for lens, heads, seed in cases:
            q, k, v, cu_dev, cu = make_attention_inputs(lens, heads, device="cuda", seed=seed)
            got = _with_variant(variant, lambda: op(q, k, v, cu_dev, cu, form, poisoned_like(q)))
            want = R.attention_fp8(q, k, v, cu)
            for a, b in zip(cu, cu[1:]):
                if b > a:
                    r = rel_l2(got[a:b], want[a:b]) / reference_bound(b - a)
                    segments, near = segments + 1, near + (r > 0.8)
                    kind = "one_block" if b - a <= ONE_BLOCK_KEYS else "longer"
                    if r > worst.get(kind, 0.0):
                        worst[kind], worst_at[kind] = r, [lens, heads, seed, b - a]
            if first is None:
                first = rel_l2(got, want)
            if attention_misses(got, q, k, v, cu):
                missed.append([lens, heads, seed])
        q, k, v, cu_dev, cu = long_set
        got = _with_variant(variant, lambda: op(q, k, v, cu_dev, cu, form, poisoned_like(q)))
        res[name] = dict(cases=len(cases), segments=segments, missed=missed, worst_rel_l2_over_bound=worst,
                         worst_at_lens_heads_seed_len=worst_at, over_0_8_of_bound=near, first_case_rel_l2=first,
                         long_4x4096_vs_exact=rel_l2(got, long_exact))
        log("s_split", name, json.dumps(res[name]))
    q, k, v, cu_dev, cu = long_set
    res["reference_long_4x4096_vs_exact"] = rel_l2(R.attention_fp8(q, k, v, cu), long_exact)
    return res


def _accuracy(lens, heads, seed, with_reference):
    q, k, v, cu_dev, cu = make_attention_inputs(lens, heads, device="cuda", seed=seed)
    o3, l3 = op(q, k, v, cu_dev, cu, 3, poisoned_like(q), return_lse=True)
    o0, l0 = op(q, k, v, cu_dev, cu, 0, poisoned_like(q), return_lse=True)
    torch.cuda.synchronize()
    exact = exact_attention(q, k, v, cu)
    e = dict(heads=heads, nonfinite3=nonfinite(o3), rel_l2_3_vs_0=rel_l2(o3, o0),
             max_abs_3_vs_0=float((o3.float() - o0.float()).abs().max()),
             lse_max_diff_3_vs_0=float((l3.double() - l0.double()).abs().max()),
             err3_exact=rel_l2(o3, exact), err0_exact=rel_l2(o0, exact))
    if with_reference:
        ref = R.attention_fp8(q, k, v, cu)
        e.update(err3_ref=rel_l2(o3, ref), err0_ref=rel_l2(o0, ref), ref_exact=rel_l2(ref, exact),
                 misses3=attention_misses(o3, q, k, v, cu))
        e["ratio3_exact_over_ref_exact"] = e["err3_exact"] / e["ref_exact"]
    e["ratio3_over_0_exact"] = e["err3_exact"] / e["err0_exact"]
    return e


def stage_accuracy():
    res = {}
    for name, lens in (("4x4096", [4096] * 4), ("mixed", [7000, 3000, 6000, 384])):
        res[name] = _accuracy(lens, 4, 21, True)
        log("accuracy", name, json.dumps(res[name]))
    return res


def stage_long(n_rows=2048):
    """The longest P V chains: one segment of 16384 and of 65536 keys (2 heads), the default
    build, each ACCUMULATION build and form 0 against exact attention on n_rows sampled query
    rows, and the reference on the same rows (the 1.1x rule)."""
    res = {}
    builds = [("default", 3, ())] + [("_".join(f"{a}{b}" for a, b in v), 3, v) for v in ACC_BUILDS] + [
        ("form 0", 0, ())]
    for name, lens in (("1x16384", [16384]), ("1x65536", [65536])):
        q, k, v, cu_dev, cu = make_attention_inputs(lens, 2, device="cuda", seed=41)
        idx = torch.randperm(q.shape[0], generator=torch.Generator().manual_seed(5))[:n_rows].sort().values
        idx = idx.to(q.device)
        exact = exact_attention(q, k, v, cu, rows=idx)
        e = dict(ref=rel_l2(reference_rows(q, k, v, cu, idx), exact))
        for label, form, variant in builds:
            out = _with_variant(variant, lambda: op(q, k, v, cu_dev, cu, form, poisoned_like(q)))
            e[label] = rel_l2(out[idx], exact)
        e["ratios_to_form0"] = {b[0]: e[b[0]] / e["form 0"] for b in builds}
        e["ratios_to_ref"] = {b[0]: e[b[0]] / e["ref"] for b in builds}
        res[name] = e
        log("long", name, json.dumps(e))
        torch.cuda.empty_cache()
    return res


def stage_heads():
    res = {}
    for name, lens in (("4x4096", [4096] * 4), ("mixed", [7000, 3000, 6000, 384])):
        res[name] = _accuracy(lens, 56, 22, False)
        log("heads", name, json.dumps(res[name]))
        torch.cuda.empty_cache()
    return res


def _captured_launch(q, k, v, cu_dev, cu, form, out):
    """A call of the operator, with the attention kernel's launch captured: a function that
    launches that kernel alone again (the workspace stays as the call left it)."""
    return attention_kernel_alone(lambda: op(q, k, v, cu_dev, cu, form, out))


TIME_SETS = (("4x4096", [4096] * 4), ("1x16384", [16384]))


def stage_time(args, variants=(), forms=(3, 0), peers=True, quant=True, sets=TIME_SETS):
    from h3kernels.peers.torch_attention import SegmentedSDPA

    res = {}
    for name, lens in sets:
        q, k, v, cu_dev, cu = make_attention_inputs(lens, 56, device="cuda", seed=31)
        flops = attention_flops(lens, 56)
        row = dict(tflop=flops / 1e12)
        tf = lambda ms: flops / ms / 1e9  # noqa: E731

        def timed(key, fn, batch=4):
            try:
                fn()
                torch.cuda.synchronize()
                ms = median_ms_batched(fn, batch=batch, warmup=1, reps=7)
                row[key] = dict(ms=ms, tflops=tf(ms))
            except Exception as err:
                row[key] = dict(error=f"{type(err).__name__}: {str(err)[:300]}")
            log("time", name, key, json.dumps(row[key]))

        out = torch.empty_like(q)
        for form in forms:
            timed(f"call_form{form}", lambda form=form: op(q, k, v, cu_dev, cu, form, out))
            try:
                kernel = _captured_launch(q, k, v, cu_dev, cu, form, out)
                timed(f"kernel_form{form}", kernel)
            except Exception as err:
                row[f"kernel_form{form}"] = dict(error=f"{type(err).__name__}: {str(err)[:300]}")
        for variant in variants:
            name_v = "_".join(f"{a}{b}" for a, b in variant)
            timed("call_form3_" + name_v, lambda variant=variant: _with_variant(
                variant, lambda: op(q, k, v, cu_dev, cu, 3, out)))
            key = "kernel_form3_" + name_v
            try:
                kernel = _with_variant(variant, lambda: _captured_launch(q, k, v, cu_dev, cu, 3, out))
                timed(key, kernel)
            except Exception as err:
                row[key] = dict(error=f"{type(err).__name__}: {str(err)[:300]}")
        if quant:
            try:
                total, each = attention_quant_kernel_ms(q, k, v, cu_dev, cu)
                nbytes = attention_quant_pass_bytes(lens, 56)
                frac = lambda b, ms: b / (ms * 1e-3) / (HBM_TBS * 1e12)  # noqa: E731
                moved, least = sum(nbytes.values()), attention_quant_least_bytes(lens, 56)
                row["quant_passes"] = dict(ms=total, bytes=moved, hbm_fraction=frac(moved, total),
                                           needed_bytes=least, needed_fraction=frac(least, total),
                                           each={n: dict(ms=ms, bytes=nbytes.get(n),
                                                         hbm_fraction=frac(nbytes[n], ms) if n in nbytes else None)
                                                 for n, ms in each.items()})
                log("quant_passes", name, json.dumps(row["quant_passes"]))
            except Exception as err:
                row["quant_passes"] = dict(error=f"{type(err).__name__}: {str(err)[:300]}")
        if peers and not args.no_peers:
            from torch.nn.attention import SDPBackend

            views = SegmentedSDPA(q, k, v, cu)
            for key, be in (("cudnn_sdpa_bf16", SDPBackend.CUDNN_ATTENTION), ("flash_sdpa_bf16",
                                                                              SDPBackend.FLASH_ATTENTION)):
                timed(key, lambda be=be: views(be))
                if "error" in row[key]:  # strided views refused: contiguous copies, made once, untimed
                    copies = SegmentedSDPA(q, k, v, cu, contiguous=True)
                    timed(key, lambda be=be: copies(be))
                    del copies
        res[name] = row
    return res


def table(rep):
    lines = []
    probe = rep["stages"].get("probe")
    t = probe or rep["stages"].get("time") or {}
    tv = rep["stages"].get("time_variants") or {}
    if isinstance(t, dict) and "error" not in t:
        if isinstance(tv, dict) and "error" not in tv:
            t = {n: {**row, **tv.get(n, {})} for n, row in t.items()}
        keys = ["call_form3", "kernel_form3", "call_form0", "kernel_form0", "quant_passes", "cudnn_sdpa_bf16",
                "flash_sdpa_bf16"] + [f"{w}_form3_" + "_".join(f"{a}{b}" for a, b in v) for v in VARIANTS
                                      for w in ("call", "kernel")]
        if probe:
            keys = [f"kernel_form3_{'_'.join(f'{a}{b}' for a, b in v)}" for v in [()] + PROBES]
        sets = list(t)
        lines.append(f"{'56 heads':<32}" + "".join(f"{n:>22}" for n in sets))
        for k in keys:
            cells = []
            for n in sets:
                c = t[n].get(k, {})
                if "ms" in c:
                    cells.append(f"{c['ms']:8.3f} ms" + (f" {c['tflops']:5.0f} TF" if "tflops" in c else "")
                                 + (f" {100 * c['hbm_fraction']:3.0f}% HBM" if "hbm_fraction" in c else ""))
                else:
                    cells.append("error" if c else "-")
            lines.append(f"{k:<32}" + "".join(f"{x:>22}" for x in cells))
    for sname in ("accuracy", "heads"):
        a = rep["stages"].get(sname) or {}
        if isinstance(a, dict) and "error" not in a:
            for name, e in a.items():
                lines.append(f"{sname} {name} ({e['heads']}h): 3 vs exact {e['err3_exact']:.4e}, 0 vs exact "
                             f"{e['err0_exact']:.4e} (ratio {e['ratio3_over_0_exact']:.4f}), 3 vs 0 "
                             f"{e['rel_l2_3_vs_0']:.3e}" + (f", 3 vs ref {e['err3_ref']:.4e}, ref vs exact "
                                                           f"{e['ref_exact']:.4e}, misses {e['misses3']}"
                                                           if "err3_ref" in e else ""))
    for sname, s in rep["stages"].items():
        if isinstance(s, dict) and "error" in s:
            lines.append(f"stage {sname}: ERROR {s['error'].splitlines()[-1]}")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=os.path.join(OUT, "hopper_attention.json"))
    p.add_argument("--debug", action="store_true", help="run the debug stage even when the small sets pass")
    p.add_argument("--no-time", action="store_true")
    p.add_argument("--no-peers", action="store_true", help="skip the SDPA timings")
    p.add_argument("--s-split-sets", type=int, default=40, help="random short sets of the s_split stage")
    p.add_argument("--only", choices=("s_split", "probe", "long"), help="build, first and this stage alone")
    p.add_argument("--builds", nargs="*", help="with --only probe: these builds in place of the DBG_PERF ones; "
                   "with --only s_split or long, in place of the ACCUMULATION ones; "
                   "each NAME=VALUE[,NAME=VALUE...] (as PINGPONG=1,DBG_PERF=32)")
    args = p.parse_args()
    rep = dict(device=torch.cuda.get_device_name(), cc=list(torch.cuda.get_device_capability()),
               torch=torch.__version__, stages={})

    def save():
        with open(args.json, "w") as f:
            json.dump(rep, f, indent=1, default=str)

    def stage(name, fn):
        log(f"--- {name}")
        try:
            rep["stages"][name] = fn()
        except Exception:
            rep["stages"][name] = dict(error=traceback.format_exc())
            log(f"stage {name} FAILED:\n{rep['stages'][name]['error']}")
        save()
        return rep["stages"][name]

    stage("build", stage_build)
    first = stage("first", stage_first)
    if "error" in first and "hang" in first["error"]:
        print(table(rep))
        save()
        os._exit(3)  # a hung kernel: nothing else can run on this context
    if args.only == "probe":  # timing only: the DBG_PERF builds beside the default
        if args.builds:  # the table below lists PROBES too
            PROBES[:] = [hopper.parse_variant(b) for b in args.builds]
        stage("probe", lambda: stage_time(args, [()] + PROBES, forms=(), peers=False, quant=False,
                                          sets=TIME_SETS + (("16x1024", [1024] * 16),)))
        save()
        print(table(rep))
        return 0
    if args.builds and args.only in ("s_split", "long"):
        ACC_BUILDS[:] = [hopper.parse_variant(b) for b in args.builds]
    if args.only == "long":
        stage("long", stage_long)
        save()
        print(table(rep))
        return 0
    if args.only:
        stage(args.only, lambda: stage_s_split(args.s_split_sets))
        save()
        print(table(rep))
        return 0
    small = stage("small", stage_small)
    if args.debug or "error" in first or "error" in small or not all(e.get("ok") for e in small.values()):
        stage("debug", stage_debug)
    stage("s_split", lambda: stage_s_split(args.s_split_sets))
    stage("accuracy", stage_accuracy)
    stage("heads", stage_heads)
    stage("long", stage_long)
    if not args.no_time:
        stage("time", lambda: stage_time(args))
    # the other builds last: a hang there (exit 3) leaves every figure above in the report
    variants = stage("variants", stage_variants)
    if "error" in variants and "hang" in variants["error"]:
        print(table(rep))
        save()
        os._exit(3)
    if not args.no_time and "error" not in variants:
        # every build whose results are finite (bitwise or not: the variants stage says which)
        good = [v for v in VARIANTS if (lambda e: e and not e.get("nonfinite") and not e.get("lse_nonfinite")
                                        and e.get("rel_l2") == e.get("rel_l2"))(
            variants.get("_".join(f"{a}{b}" for a, b in v), {}))]
        stage("time_variants", lambda: stage_time(args, good, forms=(), peers=False, quant=False))
    rep["seconds"] = time.time() - T0
    save()
    print(table(rep))
    log("json:", args.json)


if __name__ == "__main__":
    sys.exit(main())
