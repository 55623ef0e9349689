"""Times minimax_h3_varlen_attention_fp8 against torch's bf16 attention and the e4m3 ceiling of
each kernel family's instruction, all in one run.

python bench/bench_attention.py [--quick] [--sets NAME ...] [--no-h3ref]
                                [--json PATH] [--reps N] [--budget-ms MS]

Segment sets (56 heads, head dim 128, non-causal, q/k/v bf16 randn [tokens, 56, 128]):
  4x4096, 16x1024, 64x256, 1x16384, 7000+3000+6000+384 (ragged), 1x65536; --quick: 4x4096 and
  1x16384.
Methods, per set:
  ours          h3kernels.minimax_h3_varlen_attention_fp8 on the packed tensors, cu_seqlens_host
                given (no device sync), `out` preallocated; one row per kernel family this GPU
                offers (h3kernels._runtime.targets.offered_forms: on compute capability 9.0 the
                wgmma family, form 3, which fp8_mma_form=-1 picks there, then mma.sync form 0):
                the "family" column of the table.
  cuDNN SDPA    F.scaled_dot_product_attention under sdpa_kernel(SDPBackend.CUDNN_ATTENTION)
  flash SDPA    the same under SDPBackend.FLASH_ATTENTION
                Equal-length sets: one batched call on [B, 56, L, 128] (strided views of the
                packed tensors, no copy; contiguous copies made once, untimed, only if the views
                are refused). The ragged set: one call per segment, marked * in the table.
  varlen        torch's flash varlen attention on the packed tensors, if present:
                torch.nn.attention.varlen.varlen_attn, else aten._flash_attention_forward with
                cum_seq_q/k (the label says which)
  cuDNN varlen  aten._cudnn_attention_forward with cum_seq_q/k, if this torch takes them
  FA3 bf16, FA3 FP8 kernel, cuDNN FP8 kernel
                where installed (the `bench` extra installs fa3-fwd; the cuDNN frontend is
                installed by hand, README): h3kernels.peers.fp8_attention. The FP8 ones as their
                kernel alone on operands quantized beforehand (FA3: a scale per segment and head;
                cuDNN: per tensor, equal-length sets only, e4m3 output written at 448 / amax |V|
                and read back through that scale)
  ceiling       the e4m3 ceiling of each family's instructions (h3kernels.cli.bench.
                ceiling_tflops: wgmma for form 3, mma.sync otherwise), before and after the sets;
                the higher is used, and each family's %ceil is against its own
  kernel alone  the attention kernel of each family alone: one whole call through the launch
                layer, then that call's kernel launched again on the workspace it left
                (testing.timing.attention_kernel_alone)
  quant share   the operator's quantization passes alone (varlen_attention_fp8_quant.launch with
                the arguments _run gives it, own workspace, back-to-back launches), over ours;
                and their bytes over time against a torch copy of as many bytes in the same run
                (the HBM rate measured: the passes' goal is 70% of it)
FLOPs = 4 * sum(L^2) * heads * 128 for every method. CUDA-event medians after warm-up: "call" is
one call with the GPU idle at its start (host latency included), "stream" back-to-back calls
(host work overlapped); TFLOP/s and ratios use "stream" (the same as "call" above 50 ms). Every
set's q, k and v are 235 MB or more each, far beyond the L2, so inputs are not rotated.
All peers of every set run first, then ours (so that a fault in ours, which has a sticky CUDA
error, cannot take the peers with it); ours' first call is polled with a timeout: a hang prints
the report and exits with status 3. Sanity: ours and every peer against the cuDNN output (flash
if cuDNN failed) on sampled tokens, rel L2 (ours expected ~0.05, bf16 peers ~0.003); and each
family of ours against h3kernels.reference (same quantization) on the same sampled query rows,
computed on the GPU with the reference's own quantize_attention_inputs and its formula for those
rows only (checks.reference_rows; the settled bound on long segments is 0.03). --no-h3ref
skips that (about a second per set, mostly the reference's per-token key-mean loop).
The last lines of output are a table and a one-line JSON summary.
"""
import argparse
import datetime
import gc
import json
import os
import sys
import time

import torch

from h3kernels._runtime.targets import WGMMA_FORM, form_family, offered_forms
from h3kernels.testing.checks import reference_rows, rel_l2
from h3kernels.testing.inputs import make_attention_inputs
from h3kernels.constants import H3_HEADS
from h3kernels.testing.timing import attention_flops, attention_kernel_alone, attention_quant_pass_bytes
from h3kernels.testing.timing import QUANT_PASSES_OF_COPY_WANTED, copy_bandwidth_gbs, median_ms, median_ms_batched
from h3kernels.peers import fp8_attention
from h3kernels.peers.torch_attention import SegmentedSDPA

from bench_common import ceiling_tflops, elapsed, host_ms, log, short

BF = torch.bfloat16
SETS = (("4x4096", [4096] * 4), ("16x1024", [1024] * 16), ("64x256", [256] * 64), ("1x16384", [16384]),
        ("7000+3000+6000+384", [7000, 3000, 6000, 384]), ("1x65536", [65536]))
QUICK = ("4x4096", "1x16384")
SAMPLE_TOKENS = 4096  # tokens compared per set (plus every segment's first and last)
PEERS = (("cudnn", "cuDNN SDPA"), ("flash", "flash SDPA"), ("varlen", "varlen"), ("cudnn_varlen", "cuDNN varlen"),
         *((key, label) for key, label, _, _ in fp8_attention.PEERS))
FP8_PEERS = {key for key, _, _, fp8 in fp8_attention.PEERS if fp8}  # FP8 rounding: no "!" for their distance
PEER_OK_REL_L2 = 0.02  # a bf16 peer further than this from the reference is marked "!"
H3REF_OK_REL_L2 = 0.03  # ours vs h3kernels.reference on long segments (docs/spec.md, Accuracy bounds)


class Hung(Exception):
    pass


def wait_event(ev, timeout_s):
    """Polls a recorded event; raises Hung after timeout_s (a blocking sync could never return)."""
    t = time.time()
    while not ev.query():
        if time.time() - t > timeout_s:
            raise Hung(f"kernel still running {timeout_s:.0f} s after the launch")
        time.sleep(0.002)


# --- inputs ----------------------------------------------------------------------------------

def make_set(lens, heads, seed, dev):
    q, k, v, cu, cu_host = make_attention_inputs(lens, heads, device=dev, seed=seed)
    return dict(q=q, k=k, v=v, cu=cu, cu_host=tuple(cu_host), lens=list(lens), tokens=cu_host[-1],
                max_len=max(lens), heads=heads)


def sample_index(s, dev):
    step = max(1, s["tokens"] // SAMPLE_TOKENS)
    cu = torch.tensor(s["cu_host"])
    idx = torch.cat([torch.arange(0, s["tokens"], step), cu[:-1], cu[1:] - 1])
    return torch.unique(idx[(idx >= 0) & (idx < s["tokens"])]).to(dev)


# --- torch peers -----------------------------------------------------------------------------

def sdpa_method(backend, s, contiguous=False):
    """(fn, pack, how): fn() runs SDPA under one backend; pack(output, idx) gives packed rows [n, H, D]."""
    from torch.nn.attention import SDPBackend

    be = getattr(SDPBackend, backend)
    attention = SegmentedSDPA(s["q"], s["k"], s["v"], s["cu_host"], contiguous=contiguous)
    copies = "contiguous copies" if contiguous else "strided views"
    if attention.batched:
        b, heads, n, _ = attention.inputs[0][0].shape
        how = f"batched [{b}, {heads}, {n}, 128], " + copies
    else:
        how = f"per-segment: {len(attention.inputs)} calls on [1, {s['heads']}, L_i, 128] " + copies
    return (lambda: attention(be)), (lambda o, idx: attention.pack(o)[idx]), how


def varlen_impls(dev_index):
    """{key: (label, f(q, k, v, cu, max_len) -> [T, H, D])} for torch's varlen entry points found,
    and {key: why} for those absent."""
    found, absent = {}, {}
    try:
        from torch.nn.attention import varlen as tv

        backend = "flash"
        try:
            if tv._should_use_cudnn(dev_index):
                backend = "cuDNN"
        except Exception:
            pass
        found["varlen"] = (f"torch.nn.attention.varlen.varlen_attn ({backend})",
                           lambda q, k, v, cu, m: tv.varlen_attn(q, k, v, cu, cu, m, m))
    except Exception as err:
        try:
            fop = torch.ops.aten._flash_attention_forward
            found["varlen"] = ("torch.ops.aten._flash_attention_forward (cum_seq_q/k)",
                               lambda q, k, v, cu, m: fop(q, k, v, cu, cu, m, m, 0.0, False, False)[0])
        except Exception as err2:
            absent["varlen"] = "absent: " + short(err, 100) + "; " + short(err2, 100)
    try:
        cop = torch.ops.aten._cudnn_attention_forward
        found["cudnn_varlen"] = ("torch.ops.aten._cudnn_attention_forward (cum_seq_q/k)",
                                 lambda q, k, v, cu, m: cop(q, k, v, None, cu, cu, m, m, True, 0.0, False, False)[0])
    except Exception as err:
        absent["cudnn_varlen"] = "absent: " + short(err, 120)
    return found, absent


# --- timing ------------------------------------------------------------------------------------

def measure(fn, flops, args):
    """One call to estimate (the caller has made the first, untimed), then call and stream medians."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    est = start.elapsed_time(end)
    reps = args.reps or max(3, min(15, round(args.budget_ms / max(est, 1e-3))))
    call_ms = median_ms(fn, warmup=1, reps=reps)
    if est > 50:
        stream_ms, batch = call_ms, 1
    else:
        batch = 8 if est < 2 else 4 if est < 10 else 2
        stream_ms = median_ms_batched(fn, batch=batch, warmup=1, reps=max(3, reps // 2))
    return dict(call_ms=call_ms, stream_ms=stream_ms, reps=reps, batch=batch, tflops=flops / stream_ms / 1e9)


def fmt_t(t):
    return f"call {t['call_ms']:9.3f} ms  stream {t['stream_ms']:9.3f} ms  {t['tflops']:6.0f} TFLOP/s"


# --- phase 1: peers ----------------------------------------------------------------------------

def run_peers(r, args, st, dev):
    """Times every torch peer on set r; keeps the reference rows (cuDNN, else flash) in st."""
    s = make_set(r["lens"], r["heads"], r["seed"], dev)
    idx = sample_index(s, dev)
    flops = r["flops"]
    log(f"{r['name']}: {s['tokens']} tokens x {r['heads']} heads, {flops / 1e12:.2f} TFLOP per call, "
        f"q/k/v {s['q'].numel() * 2 / 1e6:.0f} MB each")
    samples = {}

    def record(key, label, fn, pack, how):
        try:
            o = fn()
            samples[key] = pack(o, idx).clone()
            del o
            t = measure(fn, flops, args)
            t.update(label=label, how=how)
            r[key] = t
            log(f"  {key:12s} {fmt_t(t)}  [{how}]")
            return True
        except Exception as err:
            r[key] = dict(error=short(err), label=label, how=how)
            log(f"  {key:12s} failed: {short(err)}  [{how}]")
            return False

    for key, backend in (("cudnn", "CUDNN_ATTENTION"), ("flash", "FLASH_ATTENTION")):
        label = dict(cudnn="cuDNN SDPA bf16", flash="flash SDPA bf16")[key]
        try:
            fn, pack, how = sdpa_method(backend, s)
        except Exception as err:
            r[key] = dict(error=short(err), label=label)
            log(f"  {key:12s} failed: {short(err)}")
            continue
        if not record(key, label, fn, pack, how):
            first = r[key]["error"]
            fn, pack, how = sdpa_method(backend, s, contiguous=True)  # views refused: try copies
            if not record(key, label, fn, pack, how):
                r[key]["error_with_views"] = first
            gc.collect()
            torch.cuda.empty_cache()
        r[key]["per_segment"] = len(set(s["lens"])) > 1
    for key in ("varlen", "cudnn_varlen"):
        if key in st["varlen"]:
            label, f = st["varlen"][key]
            q, k, v, cu, m = s["q"], s["k"], s["v"], s["cu"], s["max_len"]
            record(key, label, lambda: f(q, k, v, cu, m), lambda o, i: o[i], "one call on the packed tensors")
        else:
            r[key] = dict(error=st["varlen_absent"].get(key, "absent"), absent=True)
    # where installed (the same preparation as `python -m h3kernels bench`'s); the FP8 ones as their kernel alone
    for key, label, fp8, fn, err in fp8_attention.prepared(s["q"], s["k"], s["v"], s["cu_host"]):
        if err is not None:
            r[key] = dict(error=short(err), label=label, absent=isinstance(err, fp8_attention.PeerUnavailable))
            log(f"  {key:12s} {'absent' if r[key]['absent'] else 'failed'}: {short(err)}")
            continue
        how = "one call on the packed tensors" + (", operands quantized beforehand" if fp8 else "")
        record(key, label, fn, lambda o, i, fn=fn: fp8_attention.values(fn, o[i]).to(BF), how)
        del fn

    ref_key = next((key for key in ("cudnn", "flash") if key in samples), None)
    if ref_key is None:
        log("  no reference output: cuDNN and flash SDPA both failed")
    else:
        ref = samples[ref_key]
        r["ref"] = ref_key
        r["sample_tokens"] = int(idx.numel())
        acc = {key: rel_l2(o, ref) for key, o in samples.items() if key != ref_key}
        r["peer_rel_l2_vs_ref"] = acc
        for key, e in acc.items():
            r[key]["rel_l2_vs_ref"] = e
        st["refs"][r["name"]] = (idx, ref)
        log(f"  peers vs {ref_key} on {idx.numel()} tokens: "
            + (", ".join(f"{key} rel L2 {e:.4f}" for key, e in acc.items()) or "no other peer"))
    if args.h3ref:  # here, before ours runs: a sticky CUDA error from ours cannot lose it
        try:
            t = time.time()
            rows = reference_rows(s["q"], s["k"], s["v"], s["cu_host"], idx)
            torch.cuda.synchronize()
            st["h3refs"][r["name"]] = (idx, rows)
            r["h3ref_s"] = time.time() - t
            log(f"  h3kernels.reference on {idx.numel()} sampled query rows: {r['h3ref_s']:.1f} s")
        except Exception as err:
            r["h3ref_error"] = short(err)
            log(f"  h3kernels.reference rows failed: {short(err)}")


# --- phase 2: ours -----------------------------------------------------------------------------

def load_op():
    try:
        import h3kernels

        return h3kernels.minimax_h3_varlen_attention_fp8, None
    except Exception as err:
        return None, "not available: " + short(err)


def run_ours(r, args, st, dev):
    """Every kernel family this GPU offers on set r, then the quantization passes as their calls run them."""
    s = make_set(r["lens"], r["heads"], r["seed"], dev)  # the same tensors as the peers saw
    q, k, v, cu, cu_host = s["q"], s["k"], s["v"], s["cu"], s["cu_host"]
    r["families"] = {}
    for name, form in args.family_list:
        o = r["families"][name] = dict(
            label=f"h3kernels.minimax_h3_varlen_attention_fp8 ({name}; cu_seqlens_host given, out preallocated)",
            fp8_mma_form=form)
        r.setdefault("ours", o)
        run_family(r, name, o, s, st, args)  # raises Hung
    timed = [o for o in r["families"].values() if "stream_ms" in o]
    if not timed:
        return
    # the passes as each family's call runs them: the Hopper kernel quantizes Q itself
    from h3kernels._launch.varlen_attention_fp8 import attention_build, runs_q_pass

    device_id = q.device.index if q.device.index is not None else torch.cuda.current_device()
    by_q = {}
    for o in timed:
        by_q.setdefault(runs_q_pass(attention_build(device_id, o["fp8_mma_form"], False)), []).append(o)
    for with_q, fams in sorted(by_q.items()):
        quant_passes(r, q, k, v, cu, cu_host, with_q, fams)


def quant_passes(r, q, k, v, cu, cu_host, with_q, fams):
    """The quantization passes of the families fams (their calls run the Q pass where with_q),
    timed alone, their bytes against a torch copy's rate."""
    names = ", ".join(n for n, o in r["families"].items() if any(o is f for f in fams))
    try:
        from h3kernels.testing.timing import attention_quant_kernel_ms

        qm, each = attention_quant_kernel_ms(q, k, v, cu, cu_host, with_q=with_q)
        # their bytes against a torch copy of as many bytes in this run (the HBM rate measured)
        nbytes = attention_quant_pass_bytes(r["lens"], r["heads"], with_q)
        moved = sum(nbytes.values())
        copy_gbs, _ = copy_bandwidth_gbs(moved)
        gbs = moved / (qm * 1e-3) / 1e9
        bw = dict(ms=qm, bytes=moved, gbs=gbs, copy_gbs=copy_gbs, of_copy=gbs / copy_gbs,
                  each_of_copy={n: nbytes[n] / (ms * 1e-3) / 1e9 / copy_gbs for n, ms in each.items() if n in nbytes})
        r.setdefault("quant_bandwidth", bw)
        for o in fams:
            o.update(quant_ms=qm, quant_share=qm / o["stream_ms"], quant_pass_ms=each, quant_bandwidth=bw,
                     quant_timed_as="varlen_attention_fp8_quant.launch alone")
        log(f"  {r['name']} ({names}): quantization passes move {moved / 1e9:.2f} GB at {gbs:.0f} GB/s = "
            f"{gbs / copy_gbs:.2f} of a torch copy of as many bytes ({copy_gbs:.0f} GB/s); each: "
            + ", ".join(f"{n} {f:.2f}" for n, f in bw["each_of_copy"].items()))
        log(f"  {r['name']} ({names}): quantization passes {qm:.4f} ms = "
            + ", ".join(f"{qm / o['stream_ms']:.2%} of the call" for o in fams)
            + " (" + ", ".join(f"{n} {ms:.4f}" for n, ms in each.items()) + " ms)")
    except Exception as err:
        for o in fams:
            o["quant_error"] = "not measured: " + short(err, 300)
        log(f"  {r['name']} ({names}): quantization passes not measured ({short(err, 300)}); the whole op's time "
            "includes them and no share is estimated")


def run_family(r, name, o, s, st, args):
    """One kernel family on set r's tensors s."""
    q, k, v, cu, cu_host = s["q"], s["k"], s["v"], s["cu"], s["cu_host"]
    flops = r["flops"]
    # poisoned: a row the kernel fails to write shows up as non-finite, not as the previous family's
    out = torch.full_like(q, float("nan"))
    op = st["op"]
    ours = lambda: op(q, k, v, cu, out, cu_seqlens_host=cu_host, fp8_mma_form=o["fp8_mma_form"])
    tag = f"{r['name']} {name}"
    try:
        torch.cuda.synchronize()
        t = time.time()
        ours()
        launched = time.time() - t
        ev = torch.cuda.Event()
        ev.record()
        wait_event(ev, max(30.0, flops / 5e12))
        o.update(first_call_s=time.time() - t, first_call_host_s=launched)
    except Hung as err:
        o["error"] = "hung: " + str(err)
        log(f"  {tag}: ours {o['error']}")
        raise
    except Exception as err:
        o["error"] = short(err, 600)
        log(f"  {tag}: ours failed: {o['error']}")
        return
    try:
        first = None
        ref = st["refs"].get(r["name"])
        h3ref = st["h3refs"].get(r["name"])
        idx = ref[0] if ref is not None else h3ref[0] if h3ref is not None else None
        if idx is not None:
            first = out[idx].clone()
            o["nonfinite_in_sample"] = int((~torch.isfinite(first.float())).sum())
        if ref is not None:
            o["rel_l2_vs_ref"] = rel_l2(first, ref[1])
        if h3ref is not None:
            o["rel_l2_vs_h3ref"] = rel_l2(first, h3ref[1])
        o.update(measure(ours, flops, args))
        if first is not None:
            o["bitwise_repeat"] = bool(torch.equal(out[idx], first))
        try:  # the attention kernel alone: its launch replayed on the workspace the call left
            kernel = attention_kernel_alone(q, k, v, cu, cu_host, form=o["fp8_mma_form"])
            kms = median_ms_batched(kernel, batch=o["batch"], warmup=1, reps=max(3, o["reps"] // 2))
            o.update(kernel_ms=kms, kernel_tflops=flops / kms / 1e9)
        except Exception as err:
            o["kernel_error"] = short(err, 300)
        o["host_ms"] = host_ms(ours, calls=1)
        acc = []
        if "rel_l2_vs_ref" in o:
            acc.append(f"vs {r['ref']} rel L2 {o['rel_l2_vs_ref']:.4f}")
        if "rel_l2_vs_h3ref" in o:
            acc.append(f"vs h3kernels.reference rel L2 {o['rel_l2_vs_h3ref']:.4f}")
        if first is not None:
            acc.append(f"non-finite {o['nonfinite_in_sample']}, bitwise repeat {o['bitwise_repeat']}")
        if "kernel_ms" in o:
            acc.insert(0, f"kernel alone {o['kernel_ms']:.3f} ms = {o['kernel_tflops']:.0f} TFLOP/s")
        log(f"  {tag}: ours {fmt_t(o)}; first call {o['first_call_s']:.2f} s; host {o['host_ms']:.3f} ms/call; "
            + ("; ".join(acc) if acc else "no reference"))
    except Exception as err:
        o["error"] = short(err, 600)
        log(f"  {tag}: ours failed after its first call: {o['error']}")


# --- report ----------------------------------------------------------------------------------

def families_of(r):
    """[(family name, ours' result dict)] of set r: one per timed family, else r's plain "ours"
    (an error set before any family ran)."""
    if r.get("families"):
        return list(r["families"].items())
    return [("", r.get("ours", {}))]


def ceilings_text(ceils):
    return ", ".join(f"{form_family(f)} (form {f}) " + (f"{c:.0f} TFLOP/s" if c else "n/a") for f, c in ceils.items())


def table(results, ceils, device, st):
    """ceils: fp8_mma_form -> the e4m3 ceiling of its instruction family (None where unmeasured)."""
    w = 16
    heads = results[0]["heads"] if results else H3_HEADS
    lines = [f"== minimax_h3_varlen_attention_fp8 on {device}, {heads} heads x 128: e4m3 ceilings "
             + ceilings_text(ceils) + "; TFLOP/s from stream times; (x) = ours / peer (against an FP8 peer's "
             "kernel alone: ours' kernel alone) ==",
             f"{'set':>18} {'family':>7} {'ours ms':>9} {'call ms':>9} {'TF/s':>5} {'%ceil':>6} {'kern ms':>8} "
             f"{'kTF/s':>5} {'k%ceil':>6} {'quant%':>7} "
             f"{'relL2':>7} {'vs h3ref':>8} |" + "".join(f" {label:>{w}}" for _, label in PEERS)]
    for r in results:
        for vname, o in families_of(r):
            ok = "stream_ms" in o
            tf = o.get("tflops")
            ceil = ceils.get(o.get("fp8_mma_form"))
            h3 = o.get("rel_l2_vs_h3ref")
            cells = [f"{r['name']:>18}", f"{vname:>7}",
                     f"{o['stream_ms']:9.3f}" if ok else f"{'n/a':>9}",
                     f"{o['call_ms']:9.3f}" if ok else f"{'':>9}",
                     f"{tf:5.0f}" if ok else f"{'':>5}",
                     f"{tf / ceil:6.1%}" if ok and ceil else f"{'':>6}",
                     f"{o['kernel_ms']:8.3f}" if "kernel_ms" in o else f"{'-':>8}",
                     f"{o['kernel_tflops']:5.0f}" if "kernel_ms" in o else f"{'':>5}",
                     f"{o['kernel_tflops'] / ceil:6.1%}" if "kernel_ms" in o and ceil else f"{'':>6}",
                     f"{o['quant_share']:7.2%}" if "quant_share" in o else f"{'-':>7}",
                     f"{o['rel_l2_vs_ref']:7.4f}" if "rel_l2_vs_ref" in o else f"{'-':>7}",
                     (f"{h3:7.4f}" + ("!" if h3 > H3REF_OK_REL_L2 else " ")) if h3 is not None else f"{'-':>8}"]
            line = " ".join(cells) + " |"
            for key, _ in PEERS:
                p = r.get(key, {})
                if "tflops" in p:
                    mark = ("*" if p.get("per_segment") else "") + (
                        "!" if key not in FP8_PEERS and p.get("rel_l2_vs_ref", 0) > PEER_OK_REL_L2 else "")
                    mine = o.get("kernel_tflops") if key in FP8_PEERS else tf  # like with like
                    cell = f"{p['tflops']:.0f}{mark}" + (f" ({mine / p['tflops']:.2f}x)" if ok and mine else "")
                else:
                    cell = "-" if p.get("absent") or not p else "failed"
                line += f" {cell:>{w}}"
            lines.append(line)
    bw = [f"{r['name']} {b['ms']:.3f} ms, {b['of_copy']:.2f} of copy ({b['copy_gbs']:.0f} GB/s)"
          for r in results for b in [r.get("quant_bandwidth")] if b]
    if bw:
        lines.append("quantization passes (bytes over time, against a torch copy of as many bytes in this run): "
                     + "; ".join(bw))
    lines.append("kern ms: the attention kernel alone (its launch replayed), TF/s and share of the ceiling likewise")
    lines.append("* per-segment SDPA calls (one per segment), not one varlen call;  ! bf16 peer rel L2 vs the "
                 f"reference > {PEER_OK_REL_L2} (FP8 peers are not marked);  relL2: ours vs the reference on sampled tokens (expected ~0.05)")
    lines.append("family: the kernel family (fp8_mma_form); vs h3ref: "
                 f"rel L2 against h3kernels.reference on the same sampled query rows (! > {H3REF_OK_REL_L2}, "
                 "the settled bound)")
    labels = [f"{key} = {lab}" for key, (lab, _) in st["varlen"].items()]
    labels += [f"{key}: {why}" for key, why in st["varlen_absent"].items()]
    refs = sorted({r["ref"] for r in results if "ref" in r})
    lines.append("reference = " + ("/".join(refs) if refs else "none") + " SDPA bf16; " + "; ".join(labels))
    san = []
    for r in results:
        acc = dict(r.get("peer_rel_l2_vs_ref", {}))
        for vname, o in reversed(families_of(r)):
            if "rel_l2_vs_ref" in o:
                acc = {("ours_" + vname if vname else "ours"): o["rel_l2_vs_ref"], **acc}
        if acc:
            san.append(r["name"] + " " + " ".join(f"{k}={e:.4f}" for k, e in acc.items()))
    lines.append("sanity rel L2 vs reference: " + ("; ".join(san) if san else "n/a"))
    hosts = [f"{r['name']} {vname} {o['host_ms']:.2f}/{o['stream_ms']:.2f}" for r in results
             for vname, o in families_of(r) if "host_ms" in o]
    if hosts:
        lines.append("ours host ms per call / GPU ms (a call that syncs shows host ~ GPU): " + ", ".join(hosts))
    errs = set()
    for r in results:
        for vname, o in families_of(r):
            for key in ("error", "quant_error", "kernel_error"):
                if o.get(key):
                    errs.add((vname + ": " if vname else "") + o[key])
        if r.get("h3ref_error"):
            errs.add(f"h3kernels.reference rows on {r['name']}: {r['h3ref_error']}")
    for e in sorted(errs):
        lines.append("ours: " + e)
    perr = {}
    for r in results:
        for key, _ in PEERS:
            p = r.get(key, {})
            if "error" in p and not p.get("absent"):
                perr.setdefault((key, p["error"][:160]), []).append(r["name"])
    for (key, e), where in perr.items():
        lines.append(f"{key} failed on {', '.join(where)}: {e}")
    lines.append("targets: " + ", ".join(f"{k} {v}" for k, v in targets(results, ceils).items()))
    return lines


# The wgmma family's goals: its whole call at least this many times as fast as cuDNN's bf16 SDPA
WGMMA_X_CUDNN = {"4x4096": 1.3, "1x16384": 1.6, "7000+3000+6000+384": 1.3, "16x1024": 0.9, "64x256": 0.6}
# and on long segments, against the faster FP8 peer kernel alone: our kernel alone at least
# FP8_KERNEL_X times its speed, our whole call (quantization included) FP8_CALL_X times
FP8_GOAL_SETS, FP8_KERNEL_X, FP8_CALL_X = ("4x4096", "1x16384", "1x65536"), 1.0, 0.9


def _goal(x, goal):
    return f"{x:.2f}x ({'met' if x >= goal else 'NOT met'}, >= {goal}x)" if x else "n/a"


def targets(results, ceils):
    """The goals per family: the mma.sync family at 50% of its ceiling (4 x 4096, 1 x 16384)
    with the quantization passes under 10% of the call (4 x 4096); the wgmma family
    WGMMA_X_CUDNN times cuDNN's speed, and on FP8_GOAL_SETS its kernel and call against the
    faster FP8 peer's kernel; the passes at 70% of a torch copy's rate (4 x 4096)."""
    t = {}
    for r in results:
        for vname, o in families_of(r):
            suffix = f"_{vname}" if vname else ""
            if o.get("fp8_mma_form") == WGMMA_FORM:
                goal, cudnn = WGMMA_X_CUDNN.get(r["name"]), r.get("cudnn", {}).get("tflops")
                if goal:
                    t[f"x_cudnn_{r['name']}{suffix}"] = _goal(o["tflops"] / cudnn if "tflops" in o and cudnn else None,
                                                              goal)
                best = max((r.get(key, {}).get("tflops", 0) for key in FP8_PEERS), default=0)
                if r["name"] in FP8_GOAL_SETS and best:
                    t[f"kernel_x_fp8_{r['name']}{suffix}"] = _goal(o.get("kernel_tflops", 0) / best, FP8_KERNEL_X)
                    t[f"call_x_fp8_{r['name']}{suffix}"] = _goal(o.get("tflops", 0) / best, FP8_CALL_X)
                continue
            if r["name"] not in ("4x4096", "1x16384"):
                continue
            ceil = ceils.get(o.get("fp8_mma_form"))
            if "tflops" in o and ceil:
                pct = 100 * o["tflops"] / ceil
                t[f"pct_ceil_{r['name']}{suffix}"] = f"{pct:.1f}% ({'met' if pct >= 50 else 'NOT met'}, >= 50%)"
            else:
                t[f"pct_ceil_{r['name']}{suffix}"] = "n/a"
            if r["name"] == "4x4096":
                if "quant_share" in o:
                    q = 100 * o["quant_share"]
                    t[f"quant_4x4096{suffix}"] = f"{q:.2f}% ({'met' if q < 10 else 'NOT met'}, < 10%)"
                else:
                    t[f"quant_4x4096{suffix}"] = "n/a"
    for r in results:  # the passes (the same for every family): 70% of the copy rate of the run
        b = r.get("quant_bandwidth")
        if b and r["name"] == "4x4096":
            wanted = QUANT_PASSES_OF_COPY_WANTED
            t["quant_of_copy_4x4096"] = f"{b['of_copy']:.2f} ({'met' if b['of_copy'] >= wanted else 'NOT met'}, >= {wanted:.2f})"
    return t


def summary(results, ceils):
    s = dict(ceil_tflops={f: round(c, 1) if c else None for f, c in ceils.items()},
             heads=results[0]["heads"] if results else None, elapsed_s=round(elapsed(), 1))
    for r in results:
        e = {}
        for key, _ in PEERS:
            p = r.get(key, {})
            if "tflops" in p:
                e[key + "_tf"] = round(p["tflops"], 1)
        for vname, o in families_of(r):
            pre = f"{vname}_" if vname else ""
            if "tflops" in o:
                e.update({pre + "ours_ms": round(o["stream_ms"], 4), pre + "ours_tf": round(o["tflops"], 1)})
                ceil = ceils.get(o.get("fp8_mma_form"))
                if ceil:
                    e[pre + "pct_ceil"] = round(100 * o["tflops"] / ceil, 1)
                if "quant_share" in o:
                    e[pre + "quant_pct"] = round(100 * o["quant_share"], 2)
                if "kernel_ms" in o:
                    e.update({pre + "kernel_ms": round(o["kernel_ms"], 4), pre + "kernel_tf": round(o["kernel_tflops"], 1)})
                    if ceil:
                        e[pre + "kernel_pct_ceil"] = round(100 * o["kernel_tflops"] / ceil, 1)
                if "rel_l2_vs_ref" in o:
                    e[pre + "rel_l2"] = round(o["rel_l2_vs_ref"], 4)
                if "rel_l2_vs_h3ref" in o:
                    e[pre + "rel_l2_h3ref"] = round(o["rel_l2_vs_h3ref"], 5)
                if "host_ms" in o:
                    e[pre + "host_ms"] = round(o["host_ms"], 3)
                for key, _ in PEERS:
                    mine = o.get("kernel_tflops") if key in FP8_PEERS else o["tflops"]  # like with like
                    if key + "_tf" in e and mine:
                        e[pre + "x_" + key] = round(mine / r[key]["tflops"], 3)
            elif "error" in o:
                e[pre + "ours"] = "failed: " + o["error"][:120]
        if r.get("quant_bandwidth"):
            e["quant_of_copy"] = round(r["quant_bandwidth"]["of_copy"], 3)
        s[r["name"]] = e
    s["targets"] = targets(results, ceils)
    return s


def offered_families(dev_id):
    """(name, fp8_mma_form) of every kernel family the operator offers on this GPU, the one -1
    picks first; [("mma.sync", 0)] where that cannot be asked."""
    try:
        return [(form_family(f), f) for f in offered_forms("attention", dev_id)]
    except Exception as err:
        log(f"kernel families of the operator unknown ({short(err, 120)}); timing form 0")
        return [("mma.sync", 0)]


def measure_ceilings(dev_id, forms, when):
    ceils = {f: ceiling_tflops(dev_id, f) for f in forms}
    log(f"e4m3 ceilings, {when}: " + ceilings_text(ceils))
    return ceils


def main():
    names = [n for n, _ in SETS]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="only " + " and ".join(QUICK))
    p.add_argument("--sets", nargs="+", choices=names, help="segment sets to run (default: all)")
    p.add_argument("--json", help="write every result here")
    p.add_argument("--reps", type=int, default=0, help="timed runs per method (default: from --budget-ms, 3..15)")
    p.add_argument("--budget-ms", type=float, default=400.0,
                   help="GPU time aimed at per method's call timing (reps = budget / one call)")
    p.add_argument("--no-h3ref", dest="h3ref", action="store_false",
                   help="skip ours vs h3kernels.reference on the sampled rows")
    p.add_argument("--heads", type=int, default=H3_HEADS, help=argparse.SUPPRESS)
    args = p.parse_args()
    chosen = args.sets or (list(QUICK) if args.quick else names)

    dev = torch.device("cuda")
    dev_id = torch.cuda.current_device()
    name = torch.cuda.get_device_name(dev_id)
    args.family_list = offered_families(dev_id)
    log(f"{name}, torch {torch.__version__}, sets {chosen}, families {[n for n, _ in args.family_list]}")
    st = dict(refs={}, h3refs={})
    st["op"], st["op_why"] = load_op()
    if st["op_why"]:
        log("minimax_h3_varlen_attention_fp8 " + st["op_why"])
    st["varlen"], st["varlen_absent"] = varlen_impls(dev_id)
    for key, (label, _) in st["varlen"].items():
        log(f"{key}: {label}")
    for key, why in st["varlen_absent"].items():
        log(f"{key}: {why}")
    forms = [f for _, f in args.family_list]

    results = []
    for i, (n, lens) in enumerate(SETS):
        if n in chosen:
            results.append(dict(name=n, lens=lens, heads=args.heads, tokens=sum(lens),
                                flops=attention_flops(lens, args.heads), seed=1000 + 17 * i))
    ceil0 = measure_ceilings(dev_id, forms, "before")
    out = dict(date=datetime.date.today().isoformat(), device=name, torch=torch.__version__, forms=forms,
               ceiling_runs=[ceil0], results=results,
               varlen_impls={k: lab for k, (lab, _) in st["varlen"].items()}, varlen_absent=st["varlen_absent"])

    def finish(ceils):
        out.update(ceiling_tflops=ceils, elapsed_s=elapsed())
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1, default=str)
        print("\n".join(table(results, ceils, name, st)))
        print("SUMMARY " + json.dumps(summary(results, ceils), separators=(",", ":")), flush=True)

    with torch.no_grad():
        for r in results:
            try:
                run_peers(r, args, st, dev)
            except Exception as err:  # e.g. out of memory: report and go on
                r["error"] = short(err)
                log(f"{r['name']}: peers failed: {short(err)}")
            gc.collect()
            torch.cuda.empty_cache()
        if args.json:  # the peers' figures survive whatever ours does
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1, default=str)

        if st["op"] is None:
            for r in results:
                r["ours"] = dict(error=st["op_why"])
        else:
            log("ours (peers done)")
            for r in results:
                try:
                    run_ours(r, args, st, dev)
                except Hung:
                    for rest in results:
                        rest.setdefault("ours", dict(error="not run: an earlier set hung"))
                    finish(ceil0)
                    sys.stdout.flush()
                    os._exit(3)  # the hung kernel keeps the GPU: no clean teardown possible
                except Exception as err:
                    r.setdefault("ours", {})["error"] = short(err)
                    log(f"{r['name']}: ours failed: {short(err)}")
                try:
                    gc.collect()
                    torch.cuda.empty_cache()
                except Exception:  # a sticky CUDA error from ours: the report still prints
                    pass

    ceil1 = measure_ceilings(dev_id, forms, "after")
    out["ceiling_runs"] = [ceil0, ceil1]
    finish({f: max([c for c in (ceil0[f], ceil1[f]) if c], default=None) for f in forms})


if __name__ == "__main__":
    main()
