"""Times minimax_h3_mlp_fp8 end to end against torch peers and the e4m3 ceiling of its kernel family,
all in one run.

python bench/bench_mlp.py [--rows 256 2048 16384 65536] [--quick] [--form F] [--json PATH] [--no-compile]

Per M (default 256, 2048, 16384, 65536), on the current GPU:
  ours         h3kernels.minimax_h3_mlp_fp8 with caller workspaces and out (nothing allocated per call)
  bf16 eager   torch: RMSNorm + AdaLN, x @ w1^T, silu(gate) * up, @ w2^T, gated residual (bf16 matmuls)
  fp8 eager    torch: the same with per-token e4m3 quantization of a and y in torch and
               torch._scaled_mm rowwise (scale_a [M, 1], scale_b [1, N] f32, bf16 out)
  fp8 compile  torch.compile (default mode) of the fp8 eager function, M marked dynamic (one compile)
  GEMMs        the two bare _scaled_mm calls of fp8 eager (pre-quantized inputs), nothing else
  FC1 / FC2    each GEMM alone, ours (the wgmma family: its launch replayed on the operands one
               call left in its workspaces) and _scaled_mm's, with its own FLOPs (2*M*5376*28672,
               2*M*14336*5376) and share of the ceiling
  ceiling      the e4m3 ceiling of the instruction family of the form the operator runs (--form,
               default -1: the wgmma family on compute capability 9.0, mma.sync elsewhere;
               h3kernels.cli.bench.ceiling_tflops)
Every figure is a CUDA-event median after warm-up, with input sets rotated so that they exceed
3x the L2 cache (the weights, 231 MB in e4m3, are shared: they exceed L2 by themselves). Two
times per method: "call" (median_ms: one call, GPU idle at its start, so host latency included)
and "stream" (median_ms_batched: back-to-back calls, host work overlapped). TFLOP/s and every
ratio use the stream time; FLOPs = 2*M*5376*28672 + 2*M*14336*5376 for every method.
The last lines of output are a table and a one-line JSON summary.
"""
import argparse
import datetime
import gc
import json
import math
import sys
import time

import torch

from h3kernels import reference as R
from h3kernels.testing.checks import cos, rel_l2
from h3kernels.testing.inputs import make_row_inputs
from h3kernels.peers.torch_mlp import fc1_fp8, fc2_fp8, fp8_gemm_inputs, mlp_bf16, mlp_fp8
from h3kernels.constants import FFN, HIDDEN
from h3kernels.testing.timing import median_ms, median_ms_batched, mlp_flops, mlp_gemm_flops, mlp_gemms_alone

from bench_common import ceiling_tflops, elapsed, log, short

E4 = torch.float8_e4m3fn
BF = torch.bfloat16
ADALN_ROWS = 50


# --- the operator under test ---------------------------------------------------------------

def load_op():
    """(op, None) or (None, why): imported lazily so that the peers still run without it."""
    try:
        import h3kernels

        return h3kernels.minimax_h3_mlp_fp8, None
    except Exception as err:
        return None, "not available: " + short(err)


def op_form(dev, requested):
    try:
        from h3kernels._runtime import targets

        return targets.operator_form(dev, requested)
    except Exception:
        from h3kernels.peers import mma_ceiling

        return mma_ceiling.supported_forms(dev)[0]


class AllocCount:
    """Counts CuPy memory-pool allocations while active (a cupy MemoryHook), if CuPy is loaded."""

    def __enter__(self):
        self.n, self.bytes, self.hook = 0, 0, None
        if "cupy" in sys.modules:
            try:
                from cupy.cuda import memory_hook

                outer = self

                class Hook(memory_hook.MemoryHook):
                    name = "bench_mlp_count"

                    def malloc_preprocess(self, device_id, size, mem_size):
                        outer.n += 1
                        outer.bytes += mem_size

                self.hook = Hook()
                self.hook.__enter__()
            except Exception:
                self.hook = None
        return self

    def __exit__(self, *exc):
        if self.hook is not None:
            self.hook.__exit__(*exc)
        return False


def row_stage_ms(op_sets, a_q, a_s, reps):
    """The row kernel alone (back-to-back launches with prepared arguments); else the public call."""
    try:
        from h3kernels.testing.timing import row_stage_kernel_ms

        return row_stage_kernel_ms([s[:5] for s in op_sets], a_q, a_s, reps=reps), "kernel"
    except Exception as err:
        log("row_stage_kernel_ms failed (" + short(err, 120) + "); timing the public row-stage call")
        from h3kernels import minimax_h3_mlp_fp8_row_stage

        cur = {}
        return median_ms_batched(lambda: minimax_h3_mlp_fp8_row_stage(*cur["s"][:5], workspace_a_q=a_q,
                                                                       workspace_a_scale=a_s),
                                 setup=lambda i: cur.update(s=op_sets[i % len(op_sets)]), reps=reps), "call"


# --- one M -----------------------------------------------------------------------------------

def time_both(fn, sets, reps, batch):
    cur = {}
    setup = lambda i: cur.update(s=sets[i % len(sets)])
    call = lambda: fn(cur["s"])
    return dict(call_ms=median_ms(call, warmup=2, reps=reps, setup=setup),
                stream_ms=median_ms_batched(call, batch=batch, warmup=1, reps=max(3, reps // 2), setup=setup))


def gemm_alone(res, key, fns, m, batch, reps):
    """FC1 and FC2 alone (fns: two functions, each launching one GEMM) into res[key]: fc1_ms, fc2_ms
    and their TFLOP/s, each with its own FLOPs."""
    try:
        for name, fn, flops in zip(("fc1", "fc2"), fns, mlp_gemm_flops(m)):
            ms = median_ms_batched(fn, batch=batch, warmup=1, reps=max(3, reps // 2))
            res[key].update({f"{name}_ms": ms, f"{name}_tflops": flops / ms / 1e9})
        log(f"  {key:12s} alone: FC1 {res[key]['fc1_ms']:.3f} ms ({res[key]['fc1_tflops']:.0f} TFLOP/s), "
            f"FC2 {res[key]['fc2_ms']:.3f} ms ({res[key]['fc2_tflops']:.0f} TFLOP/s)")
    except Exception as err:
        res[key]["gemms_alone_error"] = short(err)
        log(f"  {key:12s} GEMMs alone failed: {short(err)}")


def run_m(m, st, args):
    dev = torch.device("cuda")
    flops = mlp_flops(m)
    res = dict(m=m, flops=flops)
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 50 << 20) or (50 << 20)
    set_bytes = m * HIDDEN * 2 * 2 + m * 8  # x + residual + index
    nsets = min(8, max(2, math.ceil(3 * l2 / set_bytes)))
    reps = args.reps or (20 if m <= 2048 else 10 if m <= 16384 else 6)
    batch = 8 if m <= 2048 else 4 if m <= 16384 else 3
    res.update(sets=nsets, set_mb=set_bytes / 1e6, reps=reps, batch=batch)

    sets = []
    for s in range(nsets):
        x, wn, sc, sh, idx = make_row_inputs(m, ADALN_ROWS, device=dev, seed=1000 * s + 7)
        g = torch.Generator(device=dev).manual_seed(1000 * s + 8)
        gate = (0.5 * torch.randn(ADALN_ROWS, 6 * HIDDEN, generator=g, device=dev)).to(BF)[:, 2 * HIDDEN:3 * HIDDEN]
        resid = torch.randn(m, HIDDEN, generator=g, device=dev).to(BF)
        sets.append((x, wn, sc, sh, idx, gate, resid))
    torch.cuda.synchronize()
    log(f"M={m}: {nsets} input sets of {set_bytes / 1e6:.0f} MB, reps {reps}, batch {batch}")

    def record(name, fn, tsets=sets):
        try:
            t = time_both(fn, tsets, reps, batch)
            t["tflops"] = flops / t["stream_ms"] / 1e9
            res[name] = t
            log(f"  {name:12s} call {t['call_ms']:9.3f} ms  stream {t['stream_ms']:9.3f} ms  {t['tflops']:6.0f} TFLOP/s")
        except Exception as err:
            res[name] = dict(error=short(err))
            log(f"  {name:12s} failed: {short(err)}")

    # ours
    if st["op"] is not None:
        try:
            from h3kernels import minimax_h3_mlp_fc2_flags

            ws = dict(out=torch.empty(m, HIDDEN, dtype=BF, device=dev),
                      workspace_a_q=torch.empty(m, HIDDEN, dtype=E4, device=dev),
                      workspace_a_scale=torch.empty(m, dtype=torch.float32, device=dev),
                      workspace_y=torch.empty(m, FFN, dtype=BF, device=dev),
                      workspace_y_q=torch.empty(m, FFN, dtype=E4, device=dev),
                      workspace_y_scale=torch.empty(m, dtype=torch.float32, device=dev),
                      workspace_flags=torch.zeros(minimax_h3_mlp_fc2_flags(m), dtype=torch.int32, device=dev))
            w = st["w_ours"]
            ours = lambda s: st["op"](*s, *w, **ws, fp8_mma_form=args.form)
            t = time.time()
            ours(sets[0])
            torch.cuda.synchronize()
            res["ours_first_call_s"] = time.time() - t
            record("ours", ours)
            if "error" not in res["ours"]:
                # allocations of one warm call: torch caching allocator and CuPy pool
                torch.cuda.synchronize()
                before = torch.cuda.memory_stats(dev).get("allocation.all.allocated", 0)
                with AllocCount() as cnt:
                    ours(sets[1])
                    torch.cuda.synchronize()
                res["ours"]["torch_allocs_per_call"] = torch.cuda.memory_stats(dev).get("allocation.all.allocated", 0) - before
                res["ours"]["cupy_allocs_per_call"] = cnt.n
                res["ours"]["cupy_alloc_bytes_per_call"] = cnt.bytes
                row_ms, how = row_stage_ms(sets, ws["workspace_a_q"], ws["workspace_a_scale"], reps)
                ours_ms = res["ours"]["stream_ms"]
                res["ours"].update(row_ms=row_ms, row_timed_as=how, row_share=row_ms / ours_ms)
                log(f"  ours: row stage {row_ms:.4f} ms ({how}) = {row_ms / ours_ms:.2%}; allocations per warm call: torch "
                    f"{res['ours']['torch_allocs_per_call']}, CuPy {cnt.n} ({cnt.bytes} B); first call "
                    f"{res['ours_first_call_s']:.1f} s")
                if args.form_family == "wgmma":
                    workspaces = {k: v for k, v in ws.items() if k != "out"}
                    gemm_alone(res, "ours", mlp_gemms_alone(*sets[0], *w, workspaces), m, batch, reps)
        except Exception as err:
            res["ours"] = dict(error=short(err))
            log(f"  ours failed: {short(err)}")
    else:
        res["ours"] = dict(error=st["op_why"])

    # torch peers
    w1, w2, w1q, w1s, w2q, w2s = st["w_torch"]
    record("bf16_eager", lambda s: mlp_bf16(*s, w1, w2))
    record("fp8_eager", lambda s: mlp_fp8(*s, w1q, w1s, w2q, w2s))

    if st["compiled"] is not None and not args.no_compile:
        if elapsed() > args.compile_budget_s and st["compiled_at"] is None:
            res["fp8_compile"] = dict(error=f"skipped: {elapsed():.0f} s elapsed before the first compile")
            log("  fp8_compile  " + res["fp8_compile"]["error"])
        else:
            try:
                for s in sets:
                    for tensor in (s[0], s[4], s[6]):
                        torch._dynamo.maybe_mark_dynamic(tensor, 0)
                t = time.time()
                st["compiled"](*sets[0], w1q, w1s, w2q, w2s)
                torch.cuda.synchronize()
                res["fp8_compile_first_call_s"] = time.time() - t
                st["compiled_at"] = st["compiled_at"] or m
                log(f"  fp8_compile  first call (compile if new) {res['fp8_compile_first_call_s']:.1f} s")
                record("fp8_compile", lambda s: st["compiled"](*s, w1q, w1s, w2q, w2s))
            except Exception as err:
                res["fp8_compile"] = dict(error=short(err, 600))
                log(f"  fp8_compile  failed: {short(err, 600)}")
                st["compiled"], st["compile_why"] = None, f"torch.compile failed at M={m} (see that M)"
    else:
        res["fp8_compile"] = dict(error=st.get("compile_why", "disabled (--no-compile)"))

    try:
        gsets = [fp8_gemm_inputs(*s[:5], w1q, w1s) for s in sets]
        record("gemms", lambda g: (fc1_fp8(g[0], g[1], w1q, w1s), fc2_fp8(g[2], g[3], w2q, w2s)), gsets)
        g = gsets[0]
        gemm_alone(res, "gemms", (lambda: fc1_fp8(g[0], g[1], w1q, w1s), lambda: fc2_fp8(g[2], g[3], w2q, w2s)), m,
                   batch, reps)
        del gsets
    except Exception as err:
        res["gemms"] = dict(error=short(err))

    # sanity: out - residual of ours and of fp8 eager against bf16 eager, on set 0
    try:
        x, wn, sc, sh, idx, gate, resid = sets[0]
        _, valid = R.index_guard(idx, sc.shape[0])
        ref = (mlp_bf16(*sets[0], w1, w2).float() - resid.float())[valid]
        cmp = dict(fp8_eager=mlp_fp8(*sets[0], w1q, w1s, w2q, w2s))
        if "error" not in res["ours"]:
            cmp["ours"] = ours(sets[0]).clone()
            res["ours"]["guarded_rows_equal_residual"] = bool(torch.equal(cmp["ours"][~valid], resid[~valid]))
        acc = {}
        for name, o in cmp.items():
            d = (o.float() - resid.float())[valid]
            acc[name] = dict(rel_l2=rel_l2(d, ref), cos=cos(d, ref))
        del ref, cmp, d
        res["delta_vs_bf16"] = acc
        log("  out - residual vs bf16 eager: " + ", ".join(f"{k} rel L2 {v['rel_l2']:.4f} cos {v['cos']:.5f}"
                                                           for k, v in acc.items())
            + (f"; ours guarded rows == residual: {res['ours'].get('guarded_rows_equal_residual')}"
               if "ours" in acc else ""))
    except Exception as err:
        log("  accuracy check failed: " + short(err))

    return res  # this M's tensors go with run_m's frame; main() then empties the cache


# --- report ----------------------------------------------------------------------------------

PEERS = (("bf16_eager", "bf16 eager"), ("fp8_eager", "fp8 eager"), ("fp8_compile", "fp8 compile"),
         ("gemms", "FC1+FC2 _scaled_mm"))


def table(results, ceil, form, device):
    from h3kernels._runtime.targets import form_family

    lines = [f"== minimax_h3_mlp_fp8 on {device}: e4m3 {form_family(form)} ceiling "
             + (f"{ceil:.0f} TFLOP/s (form {form})" if ceil else "n/a")
             + "; TFLOP/s from stream times; (x) = ours / peer TFLOP/s ==",
             f"{'M':>6} {'ours ms':>9} {'call ms':>9} {'TF/s':>5} {'%ceil':>6} {'row%':>6} |"
             + "".join(f" {label:>18}" for _, label in PEERS)]
    for r in results:
        o = r.get("ours", {})
        ok = "stream_ms" in o
        tf = o.get("tflops")
        cells = [f"{r['m']:>6}",
                 f"{o['stream_ms']:9.3f}" if ok else f"{'n/a':>9}",
                 f"{o['call_ms']:9.3f}" if ok else f"{'':>9}",
                 f"{tf:5.0f}" if ok else f"{'':>5}",
                 f"{tf / ceil:6.1%}" if ok and ceil else f"{'':>6}",
                 f"{o['row_share']:6.2%}" if "row_share" in o else f"{'':>6}"]
        line = " ".join(cells) + " |"
        for key, _ in PEERS:
            p = r.get(key, {})
            if "tflops" in p:
                cell = f"{p['tflops']:.0f}" + (f" ({tf / p['tflops']:.2f}x)" if ok else "")
            else:
                cell = "failed" if "error" in p and "skipped" not in p["error"] else "-"
            line += f" {cell:>18}"
        lines.append(line)
    if any("fc1_ms" in r.get("ours", {}) for r in results):
        lines.append(f"{'M':>6} | each GEMM alone, ms (TFLOP/s, % of the ceiling; ours / _scaled_mm)")
        for r in results:
            o, g = r.get("ours", {}), r.get("gemms", {})
            cells = []
            for name in ("fc1", "fc2"):
                if f"{name}_ms" not in o:
                    continue
                tf = o[f"{name}_tflops"]
                cell = f"{name.upper()} {o[name + '_ms']:.3f} ({tf:.0f}" + (f", {tf / ceil:.1%}" if ceil else "") + ")"
                if f"{name}_ms" in g:
                    cell += f" vs {g[name + '_ms']:.3f} ({tf / g[name + '_tflops']:.2f}x)"
                cells.append(cell)
            lines.append(f"{r['m']:>6} | " + "   ".join(cells))
    if any("error" in r.get("ours", {}) for r in results):
        lines.append("ours: " + next(r["ours"]["error"] for r in results if "error" in r.get("ours", {})))
    return lines


def summary(results, ceil, form):
    s = dict(ceil_tflops=round(ceil, 1) if ceil else None, form=form, elapsed_s=round(elapsed(), 1))
    for r in results:
        e = {}
        o = r.get("ours", {})
        if "tflops" in o:
            e.update(ours_ms=round(o["stream_ms"], 4), ours_tf=round(o["tflops"], 1))
            if ceil:
                e["pct_ceil"] = round(100 * o["tflops"] / ceil, 1)
            if "row_share" in o:
                e["row_pct"] = round(100 * o["row_share"], 2)
            for name in ("fc1", "fc2"):
                if f"{name}_ms" in o:
                    e[f"ours_{name}_ms"] = round(o[f"{name}_ms"], 4)
                    e[f"ours_{name}_tf"] = round(o[f"{name}_tflops"], 1)
                if f"{name}_ms" in r.get("gemms", {}):
                    e[f"scaled_mm_{name}_ms"] = round(r["gemms"][f"{name}_ms"], 4)
        for key, _ in PEERS:
            if "tflops" in r.get(key, {}):
                e[key + "_tf"] = round(r[key]["tflops"], 1)
        s[f"M{r['m']}"] = e
    return s


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[256, 2048, 16384, 65536])
    p.add_argument("--quick", action="store_true", help="only M=16384")
    p.add_argument("--json", help="write every result here")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    p.add_argument("--compile-budget-s", type=float, default=90.0,
                   help="skip the first torch.compile if this many seconds have already passed")
    p.add_argument("--reps", type=int, default=0, help="timed runs per method (default by M)")
    p.add_argument("--form", type=int, default=-1, help="fp8_mma_form passed to the operator")
    args = p.parse_args()
    rows = [16384] if args.quick else args.rows

    dev = torch.device("cuda")
    dev_id = torch.cuda.current_device()
    name = torch.cuda.get_device_name(dev_id)
    log(f"{name}, torch {torch.__version__}, M {rows}")
    st = dict(compiled_at=None)
    st["op"], st["op_why"] = load_op()
    if st["op_why"]:
        log("minimax_h3_mlp_fp8 " + st["op_why"])
    form = op_form(dev_id, args.form)
    try:
        from h3kernels._runtime.targets import form_family

        args.form_family = form_family(form)
    except Exception:
        args.form_family = None

    # weights: bf16 logical; ours prepacked; torch peers quantized per channel in logical order
    g = torch.Generator(device=dev).manual_seed(123)
    w1 = (torch.randn(2 * FFN, HIDDEN, generator=g, device=dev) * HIDDEN ** -0.5).to(BF)
    w2 = (torch.randn(HIDDEN, FFN, generator=g, device=dev) * FFN ** -0.5).to(BF)
    w1q, w1s = R.quantize_rows(w1)
    w2q, w2s = R.quantize_rows(w2)
    st["w_torch"] = (w1, w2, w1q, w1s.reshape(1, -1).contiguous(), w2q, w2s.reshape(1, -1).contiguous())
    try:
        import h3kernels

        st["w_ours"] = (*h3kernels.prepare_minimax_h3_fc1_weight_fp8(w1), *h3kernels.prepare_minimax_h3_fc2_weight_fp8(w2))
    except Exception as err:
        st["op"], st["op_why"] = None, "weight preparation failed: " + short(err)
        log("minimax_h3_mlp_fp8 " + st["op_why"])
    torch.cuda.synchronize()
    log("weights ready")

    if args.no_compile:
        st["compiled"] = None
    else:
        try:
            st["compiled"] = torch.compile(mlp_fp8)
        except Exception as err:
            st["compiled"], st["compile_why"] = None, "torch.compile failed: " + short(err)
            log(st["compile_why"])

    ceil0 = ceiling_tflops(dev_id, form)
    log(f"e4m3 ceiling (form {form}), before: {ceil0 and round(ceil0)} TFLOP/s")
    results = []
    for m in rows:
        try:
            results.append(run_m(m, st, args))
        except Exception as err:  # e.g. out of memory: report and go on
            log(f"M={m} failed: {short(err)}")
            results.append(dict(m=m, error=short(err)))
        gc.collect()
        torch.cuda.empty_cache()
    ceil1 = ceiling_tflops(dev_id, form)
    log(f"e4m3 ceiling (form {form}), after: {ceil1 and round(ceil1)} TFLOP/s")
    ceils = [c for c in (ceil0, ceil1) if c]
    ceil = max(ceils) if ceils else None

    out = dict(date=datetime.date.today().isoformat(), device=name, torch=torch.__version__, form=form,
               ceiling_tflops=ceil, ceiling_runs=[ceil0, ceil1], compile_dynamic_from_m=st["compiled_at"],
               results=results, elapsed_s=elapsed())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print("\n".join(table(results, ceil, form, name)))
    print("SUMMARY " + json.dumps(summary(results, ceil, form), separators=(",", ":")))


if __name__ == "__main__":
    main()
