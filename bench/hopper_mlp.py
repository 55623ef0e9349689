"""The MLP's wgmma family (fp8_mma_form=3, cuda_src/mlp_fp8_sm90a.cu) on an H100/H200 in one run:
its build report, its correctness against float64 and against form 0 (mma.sync) on seeded
inputs, and its timings beside form 0 and torch.compile of the FP8 torch path.

python bench/hopper_mlp.py [--check 1 200 3000 16384] [--time 256 4096 16384] [--no-compile] [--json PATH]
                           [--compile-budget-s 90] [--deadline-s 195]

Every build it launches (the variants below, the DBG_RAW_ACC ones) is compiled first, in parallel
processes into the disk cache, each also once with -Xptxas=-v for the build report (registers,
spills, ptxas warnings such as serialized wgmma, per variant). The results are saved after every
phase; at --deadline-s the run stops (exit 124) with what it has.

Checks, per M (every element, outputs poisoned first):
  a_q, a_scale   bitwise equal between the forms (the same row kernel)
  y_q, y_scale   form 3's quantization kernel bitwise equal to form 0's producer warps on the same y
  y              against the contract's reference from float64 sums (bf16 ulps) and against
                 exact float64 arithmetic (abs error, rel L2), beside form 0's y
  out            FC2 of both forms on the same y_q: ulps against the reference, error against
                 float64; guarded rows equal residual bitwise; out aliasing residual bitwise equal
  end to end     rel L2 of out - residual against the unquantized FP32 MLP, form 3 over form 0
  variants       every build of VARIANTS but TIMING_ONLY gives the default build's y and out bitwise
Accumulation error of FC1's FP32 sums against float64 (DBG_RAW_ACC builds): the default promotion
every 128 of K, every 256 of K (PROMOTE_K 256), each k32 step alone (DBG_PROMOTE_K32), the whole K
inside the tensor core; for each, the share of y over 1 bf16 ulp that its sums alone cause.
Logs go to $OUT/hopper_mlp.log and $OUT/hopper_mlp.json (or --json PATH)."""
import argparse
import concurrent.futures
import datetime
import multiprocessing
import threading
import json
import os
import time

import torch

import h3kernels
from h3kernels import reference
from h3kernels._launch import mlp_fp8 as launch
from h3kernels._launch import mlp_fp8_sm90a as hopper
from h3kernels._runtime import arrays, compiler, targets
from h3kernels.cli.compile_check import _nonce, parse_ptxas
from h3kernels.constants import FC1_OUT, FFN, HIDDEN
from h3kernels.testing.checks import bf16_ulps, rel_l2
from h3kernels.testing.inputs import make_mlp_weights, make_row_inputs
from h3kernels.testing.poison import poisoned_mlp_workspaces
from h3kernels.testing.timing import median_ms, mlp_flops

hopper.set_constants_from_env()  # another default build for this run
OUT = os.environ.get("OUT", "/tmp/h3out")
os.makedirs(OUT, exist_ok=True)
_log = open(os.path.join(OUT, "hopper_mlp.log"), "a")
T0 = time.time()
F32, F64 = torch.float32, torch.float64
# build variants timed (and checked bitwise against the default build, the first)
# A_REGS 1: A in registers once per slice, a wait for the last quarter at each slice boundary;
# A_REGS 2: two register sets for alternate slices, no such wait; PROMOTE_K 256: 8 k32 steps per
# partial (other sums)
VARIANTS = [(), (("A_REGS", 1),), (("A_REGS", 2),), (("PROMOTE_K", 256),), (("A_REGS", 1), ("PROMOTE_K", 256)),
            (("PROMOTE_N64", 0),), (("CLUSTER_M", 2),), (("GROUP_M", 4),), (("GROUP_M", 64),),
            (("DBG_NO_PROMOTE", 1), ("PROMOTE_N64", 0)), (("DBG_NO_TMA", 1),), (("DBG_NO_MMA", 1), ("PROMOTE_N64", 0))]
# DBG_NO_TMA (no loads: the wgmmas on whatever shared memory holds) and DBG_NO_MMA (no wgmmas: the
# loads and barriers alone) split the GEMMs' time between the feed and the tensor cores
# other sums than the default's: not compared with it, but with a build of the same sums where one is named
TIMING_ONLY = {(("DBG_NO_PROMOTE", 1), ("PROMOTE_N64", 0)), (("PROMOTE_K", 256),), (("A_REGS", 1), ("PROMOTE_K", 256)),
               (("DBG_NO_TMA", 1),), (("DBG_NO_MMA", 1), ("PROMOTE_N64", 0))}
SAME_SUMS = {(("A_REGS", 1), ("PROMOTE_K", 256)): (("PROMOTE_K", 256),)}
# FC1's raw FP32 sums (accumulation_error), per summation scheme
RAW_ACC = {"accumulation": (("DBG_RAW_ACC", 1),),
           "accumulation_promote_k256": (("DBG_RAW_ACC", 1), ("PROMOTE_K", 256)),
           "accumulation_each_k32": (("DBG_PROMOTE_K32", 1), ("DBG_RAW_ACC", 1)),
           "accumulation_whole_k_in_tensor_core": (("DBG_NO_PROMOTE", 1), ("DBG_RAW_ACC", 1), ("PROMOTE_N64", 0))}


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    _log.write(s + "\n")
    _log.flush()


def variant_tag(variant):
    return "_".join(f"{k}{v}" for k, v in variant) or "default"


def _build(variant, report):
    """Compiles one variant into the disk cache (what hopper.kernels loads); with `report`, also
    once uncached with -Xptxas=-v (a new program each time: _nonce) and returns its figures.
    variant None: form 0's GEMMs (cuda_src/mlp_fp8.cu) for compute capability 9.0, as the
    operator builds them."""
    t0 = time.time()
    if variant is None:
        source, arch = "mlp_fp8", targets.ARCH_BY_CC[(9, 0)]
        d = launch.defines(arch, 0)
    else:
        source, arch, d = "mlp_fp8_sm90a", hopper.ARCH, hopper.defines(**dict(variant))
    try:
        compiler.compile_cubin(source, arch, d)
        if not report:
            return dict(seconds=time.time() - t0)
        _, text, _ = compiler.compile_cubin(source, arch, d, ("-Xptxas=-v",), use_cache=False, appended=_nonce())
    except compiler.CompileError as err:
        return dict(error=str(err)[-1500:], seconds=time.time() - t0)
    # "serialized" (wgmma run one at a time: most of the rate lost) fails compile_check; C7517 (a
    # wait ptxas adds before registers a wgmma wrote are read) is in the default build too, at the
    # tile's end, after the loop's own wait for everything
    notes = [ln.strip() for ln in text.splitlines() if any(w in ln.lower() for w in ("warn", "serializ", "c7517"))]
    return dict(kernels=parse_ptxas(text), ptxas_notes=notes, serialized=("serialized" in text),
                seconds=time.time() - t0)


def build_all():
    """Every build of this run, in parallel processes (forked before any CUDA context exists), so
    that the checks and timings load cubins from the disk cache; the build report per variant."""
    jobs = [(v, True) for v in VARIANTS] + [(v, False) for v in RAW_ACC.values()] + [(None, False)]
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        done = list(pool.map(_build, *zip(*jobs)))
    report = {}
    for (variant, with_report), r in zip(jobs, done):
        tag = "form0_mlp_fp8" if variant is None else variant_tag(variant)
        report[tag] = r
        if "error" in r:
            log(f"build {tag}: COMPILE ERROR {r['error'][-600:]}")
            continue
        for k, kr in sorted(r.get("kernels", {}).items()):
            log(f"build {tag} {k}: {kr['regs']} regs (entry cap), stack {kr['stack']}, "
                f"spill {kr['spill_st'] + kr['spill_ld']}")
        for note in r.get("ptxas_notes", []):
            log(f"build {tag} ptxas: {note}")
    log(f"builds: {len(jobs)} in {time.time() - T0:.0f} s since start ({workers} processes)")
    return report


def ulp_stats(got, want):
    finite = torch.isfinite(want.float())
    u = bf16_ulps(got[finite], want[finite]).float()
    return dict(max_ulp=float(u.max()), frac_gt1=float((u > 1).float().mean()), frac_ne=float((u > 0).float().mean()),
                nonfinite_got=int((~torch.isfinite(got.float())).sum()))


def same_bits(a, b):
    return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def check(m, W, call_dev):
    gate, residual_all, w1, w2, q1, s1, q2, s2 = W
    x, wn, sc, sh, idx = make_row_inputs(m, 50, device="cuda", seed=100 + m)
    residual = residual_all[:m].clone()
    res = dict(m=m)
    outs, wss = {}, {}
    for form in (0, 3):
        ws = poisoned_mlp_workspaces(m)
        out = torch.full((m, HIDDEN), float("nan"), dtype=torch.bfloat16, device="cuda")
        h3kernels.minimax_h3_mlp_fp8(x, wn, sc, sh, idx, gate, residual, q1, s1, q2, s2, out=out,
                                     fp8_mma_form=form, **ws)
        torch.cuda.synchronize()
        outs[form], wss[form] = out, ws
    w0, w3 = wss[0], wss[3]
    res["a_q_bitwise"] = same_bits(w0["workspace_a_q"], w3["workspace_a_q"])
    res["a_scale_bitwise"] = same_bits(w0["workspace_a_scale"], w3["workspace_a_scale"])
    a_q, a_s = w3["workspace_a_q"], w3["workspace_a_scale"]

    # y_q, y_scale of form 0's producers on form 3's y (form 0's FC2 into a scratch out)
    y3 = w3["workspace_y"]
    call = arrays.Call(dict(y=y3))
    yq0 = torch.full_like(w3["workspace_y_q"], float("nan"))
    ys0 = torch.full_like(w3["workspace_y_scale"], float("nan"))
    flags = torch.zeros(h3kernels.minimax_h3_mlp_fc2_flags(m), dtype=torch.int32, device="cuda")
    out0_on_y3 = torch.full((m, HIDDEN), float("nan"), dtype=torch.bfloat16, device="cuda")
    p = arrays.data_ptr
    launch.launch_fc2(call, 0, m, p(y3), p(yq0), p(ys0), p(q2), p(s2), gate, p(idx), p(residual), p(out0_on_y3),
                      p(flags))
    torch.cuda.synchronize()
    res["y_q_bitwise"] = same_bits(yq0, w3["workspace_y_q"])
    res["y_scale_bitwise"] = same_bits(ys0, w3["workspace_y_scale"])

    # y against the contract's reference (float64 sums) and against float64 arithmetic
    y_ref = reference.fc1_swiglu(a_q, a_s, q1, s1)
    acc64 = a_q.to(F64) @ q1.to(F64).T
    h64 = acc64 * a_s.to(F64)[:, None] * s1.to(F64)[None, :]
    logical = torch.empty_like(h64)
    logical[:, reference.minimax_h3_fc1_row_order("cuda")] = h64
    del h64, acc64
    g, u = logical[:, :FFN], logical[:, FFN:]
    y64 = g / (1 + torch.exp(-g)) * u
    del logical, g, u
    for form in (0, 3):
        yf = wss[form]["workspace_y"]
        st = ulp_stats(yf, y_ref)
        st["max_abs_vs_f64"] = float((yf.to(F64) - y64).abs().max())
        st["rel_l2_vs_f64"] = rel_l2(yf, y64)
        res[f"y_form{form}"] = st
    res["y_form3_vs_form0"] = ulp_stats(y3, w0["workspace_y"])
    del y64, y_ref

    # out: both forms' FC2 on form 3's y_q
    yq, ys = w3["workspace_y_q"], w3["workspace_y_scale"]
    acc2 = yq.to(F64) @ q2.to(F64).T
    o64 = acc2 * ys.to(F64)[:, None] * s2.to(F64)[None, :]
    i, valid = reference.index_guard(idx, gate.shape[0])
    g = torch.where(valid[:, None], gate[i], torch.zeros_like(gate[i]))
    out64 = residual.to(F64) + g.to(F64) * o64
    o_ref = reference.bf16((acc2.to(F32) * ys[:, None]) * s2[None, :])
    out_ref = reference.bf16(residual.to(F32) + reference.bf16(g.to(F32) * o_ref.to(F32)).to(F32))
    out_ref = torch.where(valid[:, None], out_ref, residual)
    del acc2, o64
    for name, o in (("out_form3", outs[3]), ("out_form0_same_y", out0_on_y3)):
        st = ulp_stats(o, out_ref)
        st["max_abs_vs_f64"] = float((o.to(F64) - out64).abs().max())
        st["rel_l2_delta_vs_f64"] = rel_l2(o.to(F64) - residual.to(F64), out64 - residual.to(F64))
        res[name] = st
    res["guarded_rows_bitwise_residual"] = same_bits(outs[3][~valid], residual[~valid])
    del out64

    # out aliasing residual
    alias = residual.clone()
    h3kernels.minimax_h3_mlp_fp8(x, wn, sc, sh, idx, gate, alias, q1, s1, q2, s2, out=alias, fp8_mma_form=3)
    torch.cuda.synchronize()
    res["alias_residual_bitwise"] = same_bits(alias, outs[3])

    # the other builds: bitwise the default's y and out (same sums in the same order), or those of
    # the build named in SAME_SUMS
    def run_variant(variant):
        yv = torch.full_like(y3, float("nan"))
        ov = torch.full_like(outs[3], float("nan"))
        try:
            hopper.launch_fc1(call, m, p(a_q), p(a_s), p(q1), p(s1), p(yv), variant)
            hopper.launch_fc2_gemm(call, m, p(yq), p(ys), p(q2), p(s2), gate, p(idx), p(residual), p(ov), variant)
            torch.cuda.synchronize()
        except compiler.CompileError as err:  # one variant's build does not stop the others
            res["variant_" + variant_tag(variant) + "_error"] = str(err)[-300:]
        return yv, ov

    for variant in [v for v in VARIANTS[1:] if v not in TIMING_ONLY or v in SAME_SUMS]:
        yv, ov = run_variant(variant)
        if variant in SAME_SUMS:
            y_want, o_want = run_variant(SAME_SUMS[variant])
            key = f"variant_{variant_tag(variant)}_bitwise_{variant_tag(SAME_SUMS[variant])}"
        else:
            y_want, o_want, key = y3, outs[3], f"variant_{variant_tag(variant)}_bitwise"
        res[key] = same_bits(yv, y_want) and same_bits(ov, o_want)

    # end to end against the unquantized FP32 MLP
    w1_logical = w1  # make_mlp_weights gives w1 in logical order
    delta = reference.mlp_exact_bf16(x, wn, sc, sh, idx, gate, w1_logical, w2)
    e0 = rel_l2(outs[0].float() - residual.float(), delta)
    e3 = rel_l2(outs[3].float() - residual.float(), delta)
    res["e2e_rel_l2"] = dict(form0=e0, form3=e3, ratio=e3 / e0)
    ok = (res["a_q_bitwise"] and res["a_scale_bitwise"] and res["y_q_bitwise"] and res["y_scale_bitwise"]
          and res["guarded_rows_bitwise_residual"] and res["alias_residual_bitwise"]
          and res["y_form3"]["nonfinite_got"] == 0 and res["out_form3"]["nonfinite_got"] == 0
          and e3 / e0 <= 1.02 and all(v for k, v in res.items() if k.startswith("variant_")))
    # the mma.sync forms' stage bound; the wgmma family's sums carry its accumulation error on top
    res["within_1ulp_999"] = res["y_form3"]["frac_gt1"] <= 1e-3 and res["out_form3"]["frac_gt1"] <= 1e-3
    res["ok"] = ok
    log(f"check M={m}: {'OK' if ok else 'FAIL'} {json.dumps(res)}")
    return res


def accumulation_error(m, W, variant=RAW_ACC["accumulation"]):
    """FC1's FP32 sums themselves (a DBG_RAW_ACC build writes them) against float64: the error
    of the tensor cores' accumulation, in units of sum |a_k w_k| and of the largest |sum|."""
    gate, residual_all, w1, w2, q1, s1, q2, s2 = W
    x, wn, sc, sh, idx = make_row_inputs(m, 50, device="cuda", seed=7)
    a_q, a_s = h3kernels.minimax_h3_mlp_fp8_row_stage(x, wn, sc, sh, idx)
    raw = torch.full((m, FC1_OUT), float("nan"), device="cuda")
    call = arrays.Call(dict(a=a_q))
    p = arrays.data_ptr
    hopper.launch_fc1(call, m, p(a_q), p(a_s), p(q1), p(s1), p(raw), variant)
    torch.cuda.synchronize()
    exact = a_q.to(F64) @ q1.to(F64).T
    mag = a_q.to(F64).abs() @ q1.to(F64).abs().T
    err = (raw.to(F64) - exact).abs()
    fp32_once = (exact.to(F32).to(F64) - exact).abs()  # one FP32 rounding of the exact sum
    res = dict(m=m, variant=variant, nonfinite=int((~torch.isfinite(raw)).sum()), max_abs=float(err.max()),
               max_over_sum_abs=float((err / mag.clamp_min(1e-30)).max()),
               mean_over_sum_abs=float((err / mag.clamp_min(1e-30)).mean()),
               max_over_max_sum=float(err.max() / exact.abs().max()),
               rel_l2=float(err.norm() / exact.norm()), fp32_rounding_rel_l2=float(fp32_once.norm() / exact.norm()),
               max_abs_sum=float(exact.abs().max()))
    # y from these sums against y from the exact ones, the rest of the arithmetic the contract's:
    # the share over 1 bf16 ulp that this accumulation alone causes
    res["y"] = ulp_stats(reference.swiglu_from_sums(raw, a_s, s1), reference.swiglu_from_sums(exact.to(F32), a_s, s1))
    log(f"accumulation M={m}: {json.dumps(res)}")
    return res


def timings(m, W, do_compile, budget_s, res):
    """Fills `res` as it goes (a run stopped on its deadline keeps what was timed)."""
    gate, residual_all, w1, w2, q1, s1, q2, s2 = W
    res.update(m=m, flops=mlp_flops(m))
    sets = []
    for seed in range(2):
        x, wn, sc, sh, idx = make_row_inputs(m, 50, device="cuda", seed=seed)
        sets.append(dict(args=(x, wn, sc, sh, idx, gate, residual_all[:m]),
                         out=torch.empty(m, HIDDEN, dtype=torch.bfloat16, device="cuda"),
                         ws=poisoned_mlp_workspaces(m)))
    cur = {}
    setup = lambda i: cur.update(s=sets[i % len(sets)])  # noqa: E731

    def op(form):
        s = cur["s"]
        h3kernels.minimax_h3_mlp_fp8(*s["args"], q1, s1, q2, s2, out=s["out"], fp8_mma_form=form, **s["ws"])

    reps = 10 if m >= 16384 else 30
    for form in (3, 0):
        res[f"op_form{form}_ms"] = median_ms(lambda: op(form), warmup=3, reps=reps, setup=setup)
    # form 3's stages alone, per build variant (the first is the default build)
    call = arrays.Call(dict(a=q1))
    arrays.make_current(call.device_id)
    p = arrays.data_ptr
    for vi, variant in enumerate(VARIANTS):
        tag = "" if vi == 0 else "_" + variant_tag(variant)
        try:
            held = hopper.workspace(call, m, variant)  # one split workspace for the variant's launches
        except compiler.CompileError as err:  # the plan loads the build
            res[f"build{tag}_error"] = str(err)[-300:]
            continue
        split = None if held is None else p(held)

        def fc1():
            ws = cur["s"]["ws"]
            hopper.launch_fc1(call, m, p(ws["workspace_a_q"]), p(ws["workspace_a_scale"]), p(q1), p(s1),
                              p(ws["workspace_y"]), variant, split=split)

        def quant():
            ws = cur["s"]["ws"]
            hopper.launch_y_quant(call, m, p(ws["workspace_y"]), p(ws["workspace_y_q"]), p(ws["workspace_y_scale"]))

        def fc2_gemm():
            s = cur["s"]
            ws = s["ws"]
            hopper.launch_fc2_gemm(call, m, p(ws["workspace_y_q"]), p(ws["workspace_y_scale"]), p(q2), p(s2), gate,
                                   p(s["args"][4]), p(s["args"][6]), p(s["out"]), variant, split=split)

        try:
            for name, fn in (("fc1", fc1), ("y_quant", quant), ("fc2", fc2_gemm)):
                if name == "y_quant" and vi:
                    continue
                res[f"{name}{tag}_ms"] = median_ms(fn, warmup=3, reps=reps, setup=setup)
        except compiler.CompileError as err:
            res[f"build{tag}_error"] = str(err)[-300:]
            continue
        res[f"fc1{tag}_tflops"] = 2 * m * HIDDEN * FC1_OUT / res[f"fc1{tag}_ms"] / 1e9
        res[f"fc2{tag}_tflops"] = 2 * m * FFN * HIDDEN / res[f"fc2{tag}_ms"] / 1e9
    res["op_form3_tflops"] = res["flops"] / res["op_form3_ms"] / 1e9
    if do_compile and time.time() - T0 < budget_s:
        from h3kernels.peers import torch_mlp

        order = reference.minimax_h3_fc1_row_order("cuda")
        w1q = torch.empty_like(q1)
        w1q[order] = q1
        w1s = torch.empty_like(s1)
        w1s[order] = s1
        compiled = torch.compile(torch_mlp.mlp_fp8, dynamic=False)
        try:
            f = lambda: compiled(*cur["s"]["args"], w1q, w1s[None, :], q2, s2[None, :])  # noqa: E731
            setup(0)
            f()
            res["torch_compile_fp8_ms"] = median_ms(f, warmup=2, reps=reps, setup=setup)
        except Exception as err:  # the peer is optional
            res["torch_compile_fp8_ms"] = f"failed: {str(err)[:300]}"
    log(f"time M={m}: {json.dumps(res)}")
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", type=int, nargs="*", default=[1, 200, 3000, 16384])
    ap.add_argument("--time", type=int, nargs="*", default=[256, 4096, 16384])
    ap.add_argument("--no-compile", action="store_true")
    # the torch.compile peer starts only before this many seconds since the start (it takes tens
    # of seconds to compile), so that the run stays near 200 s
    ap.add_argument("--compile-budget-s", type=float, default=90)
    ap.add_argument("--json", default=os.path.join(OUT, "hopper_mlp.json"), help="where the results go")
    ap.add_argument("--deadline-s", type=float, default=195,
                    help="stop here (exit 124), the results so far saved: a hung build or a slow phase "
                         "does not cost the whole run")
    a = ap.parse_args()
    build = build_all()  # before the first CUDA call: the build processes are forked
    results = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(), device=torch.cuda.get_device_name())
    log(f"=== hopper_mlp {results['date']} on {results['device']}")
    results["build"] = build

    def save():  # after every phase, so that a run stopped early leaves what it measured
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)

    def deadline():
        log(f"deadline: stopped at {time.time() - T0:.0f} s; {a.json} has the results so far")
        try:
            save()
        finally:
            os._exit(124)

    watchdog = threading.Timer(max(1.0, a.deadline_s - (time.time() - T0)), deadline)
    watchdog.daemon = True
    watchdog.start()

    W = make_mlp_weights(max(a.check + a.time), 50)
    try:  # a CLUSTER_M 2 grid: the CTA pairs that can be resident at once (all SMs / 2 if none is lost)
        results["cluster_m2_resident_ctas"] = hopper.kernels(torch.cuda.current_device(), (("CLUSTER_M", 2),))[3]
        log(f"CLUSTER_M 2: {results['cluster_m2_resident_ctas']} CTAs resident at once, "
            f"{torch.cuda.get_device_properties(0).multi_processor_count} SMs")
    except Exception as err:
        log(f"CLUSTER_M 2 occupancy: {type(err).__name__}: {err}")
    results["checks"] = []
    for m in a.check:
        try:
            results["checks"].append(check(m, W, None))
        except Exception as err:
            import traceback

            log(f"check M={m} raised: {traceback.format_exc()[-2000:]}")
            results["checks"].append(dict(m=m, error=str(err)[:500]))
        torch.cuda.empty_cache()
        save()
    log(f"checks done at {time.time() - T0:.0f} s")
    for key, variant in RAW_ACC.items():
        try:
            results[key] = accumulation_error(512, W, variant)
        except Exception:
            import traceback

            log(f"accumulation {key} raised: {traceback.format_exc()[-1500:]}")
    results["timings"] = []
    for m in a.time:
        try:
            results["timings"].append(dict(m=m))
            timings(m, W, not a.no_compile and m >= 16384, a.compile_budget_s, results["timings"][-1])
        except Exception:
            import traceback

            log(f"time M={m} raised: {traceback.format_exc()[-2000:]}")
        log(f"timings M={m} done at {time.time() - T0:.0f} s")
        save()
    log("--- summary")
    for c in results["checks"]:
        if "error" in c:
            log(f"M={c['m']}: ERROR {c['error'][:200]}")
            continue
        log(f"M={c['m']}: ok={c['ok']} aq={c['a_q_bitwise']} yq={c['y_q_bitwise']} ys={c['y_scale_bitwise']} "
            f"y3 >1ulp {c['y_form3']['frac_gt1']:.2e} (f0 {c['y_form0']['frac_gt1']:.2e}) "
            f"out3 >1ulp {c['out_form3']['frac_gt1']:.2e} e2e ratio {c['e2e_rel_l2']['ratio']:.4f} "
            f"guard={c['guarded_rows_bitwise_residual']} alias={c['alias_residual_bitwise']} "
            + " ".join(f"{k}={v}" for k, v in c.items() if k.startswith("variant_")))
    for key in RAW_ACC:
        r = results.get(key)
        if r:
            log(f"{key}: max err / sum|aw| {r['max_over_sum_abs']:.3g} mean {r['mean_over_sum_abs']:.3g} "
                f"max err / max|sum| {r['max_over_max_sum']:.3g} rel L2 {r['rel_l2']:.3g} nonfinite {r['nonfinite']} "
                f"y >1ulp {r['y']['frac_gt1']:.3g} y differing {r['y']['frac_ne']:.3g}")
    for t in results["timings"]:
        if "op_form3_tflops" not in t or "fc2_ms" not in t:
            log(f"M={t['m']}: incomplete {t}")
            continue
        log(f"M={t['m']}: op3 {t['op_form3_ms']:.3f} ms ({t['op_form3_tflops']:.0f} TF/s) op0 {t['op_form0_ms']:.3f} "
            f"fc1 {t['fc1_ms']:.3f} ({t['fc1_tflops']:.0f}) yq {t['y_quant_ms']:.3f} fc2 {t['fc2_ms']:.3f} "
            f"({t['fc2_tflops']:.0f}) compile {t.get('torch_compile_fp8_ms')}")
        log("    variants: " + " ".join(f"{k}={v:.3f}" for k, v in t.items() if k.endswith("_ms") and ("CLUSTER" in k or "GROUP" in k
                                        or "PROMOTE" in k or "A_REGS" in k)))
    log(f"elapsed {time.time() - T0:.0f} s")


if __name__ == "__main__":
    main()
