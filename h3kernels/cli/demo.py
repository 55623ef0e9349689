"""`python -m h3kernels demo`: both operators run at MiniMax-H3 sizes, checked against the
reference and timed. Without a GPU: the reference itself at the sizes asked for (within
h3kernels.cli.sizes' CPU limits), against unquantized arithmetic, a line per stage."""
import time

from h3kernels.testing.checks import bf16_ulps, cos, rel_l2
from h3kernels.testing.inputs import make_attention_inputs, make_mlp_weights, make_row_inputs
from h3kernels.testing.poison import poisoned_mlp_workspaces
from h3kernels.constants import HIDDEN


class Stages:
    """Progress of a long run: a numbered line per stage, its time printed when it ends (the CPU
    reference takes seconds per stage), each kept in the report."""

    def __init__(self, total, report):
        self.i, self.total, self.report = 0, total, report

    def __call__(self, name):
        import contextlib

        @contextlib.contextmanager
        def stage():
            self.i += 1
            print(f"[{self.i}/{self.total}] {name} ...", end="", flush=True)
            t0 = time.time()
            yield
            dt = time.time() - t0
            print(f" {dt:.1f} s", flush=True)
            self.report["stages"].append(dict(name=name, seconds=round(dt, 3)))
        return stage()


CPU_ROWS, CPU_SEGMENTS, ADALN_ROWS = [8], [[200, 0, 256]], 3
GPU_ROWS, GPU_SEGMENTS, HEADS = [16384], [[4096] * 4], 56


def run_cpu(args):
    """The reference (the CPU oracle) at --rows and --segments, against unquantized arithmetic."""
    import torch

    from h3kernels import reference as R
    from h3kernels.cli.output import finish
    from h3kernels.cli.status import UsageError
    from h3kernels.cli.sizes import cpu_size_problem, set_name

    rows, sets = args.rows or CPU_ROWS, args.segments or CPU_SEGMENTS
    problem = cpu_size_problem(rows, sets)
    if problem:
        raise UsageError(f"{problem}. Without a GPU, demo runs the CPU reference; give smaller sizes.")
    report = dict(command="demo", device="cpu", runs="reference", heads=HEADS, mlp=[], attention=[], stages=[])
    print("No CUDA GPU found: the FP8 kernels need an sm_89, sm_90 or sm_120 GPU.")
    print(f"Running h3kernels.reference (the CPU oracle) instead: MLP rows {' '.join(map(str, rows))}, "
          f"attention segments {' '.join(','.join(map(str, s)) for s in sets)}, {HEADS} heads.\n")
    stage = Stages(1 + len(rows) + len(sets), report)
    finite = lambda t: bool(torch.isfinite(t.float()).all())
    with stage("MLP weights: random bf16 w1, w2 and their e4m3 forms"):
        gate, residual, w1, w2, q1, s1, q2, s2 = make_mlp_weights(max(rows), ADALN_ROWS, device="cpu")
    for m in rows:
        with stage(f"MLP reference, M={m}, and unquantized FP32"):
            x, w, sc, sh, idx = make_row_inputs(m, ADALN_ROWS)
            out = R.minimax_h3_mlp_fp8(x, w, sc, sh, idx, gate, residual[:m], q1, s1, q2, s2)
            exact = R.mlp_exact_bf16(x, w, sc, sh, idx, gate, w1, w2)
        ok_rows = R.index_guard(idx, ADALN_ROWS)[1]
        delta = out.float() - residual[:m].float()
        r = dict(rows=m, cos=cos(delta[ok_rows], exact[ok_rows]), rel_l2=rel_l2(delta[ok_rows], exact[ok_rows]),
                 ok=finite(out))
        report["mlp"].append(r)
        print(f"      out - residual vs unquantized FP32: cos {r['cos']:.5f}, rel L2 {r['rel_l2']:.4f}")
    for seqlens in sets:
        with stage(f"attention reference, segments {set_name(seqlens)}, {HEADS} heads, and float64 softmax"):
            q, k, v, cu, _ = make_attention_inputs(seqlens, HEADS, device="cpu", seed=1)
            o = R.minimax_h3_varlen_attention_fp8(q, k, v, cu)
            e = R.attention_exact(q, k, v, cu)
        r = dict(segments=list(seqlens), heads=HEADS, rel_l2=rel_l2(o, e), ok=finite(o))
        report["attention"].append(r)
        print(f"      rel L2 vs float64 softmax {r['rel_l2']:.4f} (e4m3 rounding sets it)")
    return finish(args.json, report, all(r["ok"] for r in report["mlp"] + report["attention"]))


def run_gpu(args):
    import torch

    from h3kernels._runtime import targets
    from h3kernels.cli.output import finish
    from h3kernels.peers import mma_ceiling

    dev = torch.cuda.current_device()
    cc = torch.cuda.get_device_capability(dev)
    arch = targets.arch_for(cc)
    name = torch.cuda.get_device_name(dev)
    print(f"GPU: {name} (compute capability {cc[0]}.{cc[1]} -> {arch})\n")
    report = dict(command="demo", device=name, arch=arch, runs="kernels", heads=HEADS, mlp=[], attention=[],
                  ceilings_tflops={})
    for m in args.rows or GPU_ROWS:
        x, w, sc, sh, idx = make_row_inputs(m, device="cuda")
        row_ok, a_q, a_s, row_ref = check_row_stage(x, w, sc, sh, idx)
        time_row_stage(x, w, sc, sh, idx, a_q, a_s)
        mlp_ok, mlp_call = check_mlp(x, w, sc, sh, idx, row_ref)
        report["mlp"].append(dict(rows=m, row_stage_bitwise=row_ok, ok=row_ok and mlp_ok,
                                  ms=time_mlp(*mlp_call)))
        del x, a_q, a_s, row_ref, mlp_call
        torch.cuda.empty_cache()
    for seqlens in args.segments or GPU_SEGMENTS:
        attn_ok, attn_call = check_attention(seqlens)
        report["attention"].append(dict(segments=list(seqlens), heads=HEADS, ok=attn_ok,
                                        ms=time_attention(*attn_call)))
        del attn_call
        torch.cuda.empty_cache()
    for form in mma_ceiling.supported_forms(dev):
        t = mma_ceiling.measure_tflops(dev, form)
        report["ceilings_tflops"][str(form)] = t
        print(f"e4m3 mma.sync ceiling, form {form}: {t:.0f} TFLOP/s")
    return finish(args.json, report, all(r["ok"] for r in report["mlp"] + report["attention"]))


# --- checks against the reference (also `python -m h3kernels check`) and timings beside torch ---

def check_row_stage(x, w, sc, sh, idx):
    """The row stage into poisoned workspaces, bitwise against the reference (on the CPU).
    Returns (ok, a_q, a_scale, the reference's (a_q, a_scale) on x's device)."""
    import torch

    from h3kernels import reference as R
    from h3kernels.mlp_fp8 import minimax_h3_mlp_fp8_row_stage

    m = x.shape[0]
    ws_q = torch.full((m, HIDDEN), 0x7F, dtype=torch.uint8, device=x.device).view(torch.float8_e4m3fn)
    a_q, a_s = minimax_h3_mlp_fp8_row_stage(x, w, sc, sh, idx, workspace_a_q=ws_q,
                                            workspace_a_scale=torch.full((m,), float("nan"), device=x.device))
    rq, rs = R.quantize_rows(R.mlp_row_stage(*(t.cpu() for t in (x, w, sc, sh, idx))))
    bad_q = int((a_q.cpu().view(torch.uint8) != rq.view(torch.uint8)).sum())
    bad_s = int((a_s.cpu().view(torch.int32) != rs.view(torch.int32)).sum())
    print(f"MLP row stage (RMSNorm + AdaLN + e4m3 quantization), M={m}:")
    print(f"  vs reference: {bad_q} of {a_q.numel()} a_q bytes and {bad_s} of {m} scales differ")
    return bad_q == 0 and bad_s == 0, a_q, a_s, (rq.to(x.device), rs.to(x.device))


def time_row_stage(x, w, sc, sh, idx, a_q, a_s):
    from h3kernels import reference as R
    from h3kernels.mlp_fp8 import minimax_h3_mlp_fp8_row_stage
    from h3kernels.testing.timing import median_ms, row_stage_vs_copy

    speed = row_stage_vs_copy([(x, w, sc, sh, idx)], a_q, a_s, rounds=1)
    call_ms = median_ms(lambda: minimax_h3_mlp_fp8_row_stage(x, w, sc, sh, idx, workspace_a_q=a_q,
                                                             workspace_a_scale=a_s))
    torch_ms = median_ms(lambda: R.quantize_rows(R.mlp_row_stage(x, w, sc, sh, idx)), reps=5)
    print(f"  h3kernels kernel {speed['kernel_ms']:.3f} ms = {speed['kernel_gbs']:.0f} GB/s "
          f"({100 * speed['ratio']:.0f}% of a torch copy of the same bytes, {speed['copy_gbs']:.0f} GB/s); "
          f"one whole call {call_ms:.3f} ms; torch eager {torch_ms:.3f} ms\n")


def check_mlp(x, w, sc, sh, idx, row_ref):
    """The whole MLP at MiniMax-H3 sizes into poisoned workspaces, each stage against the
    reference (row_ref: the reference's a_q and a_scale). Returns (ok, arguments for time_mlp)."""
    import torch

    import h3kernels
    from h3kernels import reference as R
    from h3kernels._runtime import targets
    from h3kernels.constants import FFN
    from h3kernels.testing.checks import PEER_SLACK, WGMMA_OUT_WITHIN_1_ULP, scaled_mm_y

    m = x.shape[0]
    gate, residual, w1, w2, q1, s1, q2, s2 = make_mlp_weights(m, sc.shape[0])
    ws = poisoned_mlp_workspaces(m)
    args = (x, w, sc, sh, idx, gate, residual, q1, s1, q2, s2)
    out = h3kernels.minimax_h3_mlp_fp8(*args, **ws)
    a_q, a_s = row_ref
    row_same = bool(torch.equal(ws["workspace_a_q"].view(torch.uint8), a_q.view(torch.uint8))
                    and torch.equal(ws["workspace_a_scale"].view(torch.int32), a_s.view(torch.int32)))
    over = lambda got, want, n=1: int((bf16_ulps(got, want) > n).sum())
    wgmma = targets.form_family(targets.operator_form(x.get_device(), -1)) == targets.WGMMA
    y_over = y_over2 = peer_over = peer_over2 = 0
    y_err2 = peer_err2 = want2 = 0.0  # for the rel L2 of y and of the peer over all rows
    sq = lambda a, b: float(((a.double() - b.double()) ** 2).sum())  # noqa: E731
    for r0 in range(0, m, 4096):  # y from the reference's a_q (equal to the kernel's, bitwise)
        sl = slice(r0, r0 + 4096)
        want_y = R.fc1_swiglu(a_q[sl], a_s[sl], q1, s1)
        y_over += over(ws["workspace_y"][sl], want_y)
        y_over2 += over(ws["workspace_y"][sl], want_y, 2)
        y_err2, want2 = y_err2 + sq(ws["workspace_y"][sl], want_y), want2 + float((want_y.double() ** 2).sum())
        if wgmma:  # the contract's peer for a family that does not accumulate in full FP32
            peer = scaled_mm_y(a_q[sl], a_s[sl], q1, s1)
            peer_over += over(peer, want_y)
            peer_over2 += over(peer, want_y, 2)
            peer_err2 += sq(peer, want_y)
    y_rel, peer_rel = (y_err2 / max(want2, 1e-300)) ** 0.5, (peer_err2 / max(want2, 1e-300)) ** 0.5
    yq, ys = R.quantize_rows(ws["workspace_y"])
    o = R.bf16((R.exact_dot(ws["workspace_y_q"], q2) * ys[:, None]) * s2[None, :])
    i, valid = R.index_guard(idx, gate.shape[0])
    want = torch.where(valid[:, None], R.bf16(residual.float() + R.bf16(gate[i].float() * o.float()).float()),
                       residual)
    out_over = over(out, want)
    yq_same = bool(torch.equal(yq.view(torch.uint8), ws["workspace_y_q"].view(torch.uint8))
                   and torch.equal(ys.view(torch.int32), ws["workspace_y_scale"].view(torch.int32)))
    exact = R.mlp_exact_bf16(x[:1024], w, sc, sh, idx[:1024], gate, w1, w2)
    delta = out[:1024].float() - residual[:1024].float()
    print(f"MLP block (minimax_h3_mlp_fp8, {'wgmma' if wgmma else 'mma.sync'} family), M={m}:")
    print(f"  vs reference: a_q, a_scale bitwise: {row_same}; y {y_over} of {m * FFN} over 1 bf16 ulp, "
          f"{y_over2} over 2; y_q, y_scale bitwise from y: {yq_same}; out {out_over} of {out.numel()} over 1 ulp")
    if wgmma:
        print(f"  torch._scaled_mm (fast accumulation off) on the same operands: y {peer_over} over 1 ulp, "
              f"{peer_over2} over 2, rel L2 {peer_rel:.3e} against y's {y_rel:.3e} (the wgmma family is held to "
              f"at most {PEER_SLACK}x these three)")
    print(f"  vs unquantized FP32 (first 1024 rows, out - residual): cos {cos(delta, exact):.5f}, "
          f"rel L2 {rel_l2(delta, exact):.4f}")
    if wgmma:
        y_ok = (y_over <= PEER_SLACK * peer_over and y_over2 <= PEER_SLACK * peer_over2
                and y_rel <= PEER_SLACK * peer_rel)
        out_ok = out_over <= (1 - WGMMA_OUT_WITHIN_1_ULP) * out.numel()
    else:
        y_ok, out_ok = y_over <= 1e-3 * m * FFN, out_over <= 1e-3 * out.numel()
    ok = row_same and yq_same and y_ok and out_ok
    return ok, (args, ws, w1, w2)


def time_mlp(args, ws, w1, w2):
    import h3kernels
    from h3kernels.peers.torch_mlp import timed_peers
    from h3kernels.testing.timing import median_ms_batched, mlp_flops

    x, w, sc, sh, idx, gate, residual = args[:7]
    ours = median_ms_batched(lambda: h3kernels.minimax_h3_mlp_fp8(*args, **ws))  # timed as the peers are
    peers = timed_peers(x, w, sc, sh, idx, gate, residual, w1, w2)
    print(f"  h3kernels {ours:.3f} ms = {mlp_flops(x.shape[0]) / ours / 1e9:.0f} TFLOP/s; "
          f"{peers['peer']} {peers['peer_ms']:.3f} ms, {peers['peer2']} {peers['peer2_ms']:.3f} ms\n")
    return ours


def check_attention(seqlens, heads=56):
    """The attention at MiniMax-H3 head count into a poisoned out, against the reference and
    beside torch's bf16 SDPA (torch_attention.sdpa_bf16), which stands in for the unquantized
    result. Returns (ok, arguments for time_attention)."""
    import torch

    import h3kernels
    from h3kernels import reference as R
    from h3kernels.testing.checks import attention_reference_misses
    from h3kernels.peers.torch_attention import sdpa_bf16
    from h3kernels.testing.checks import reference_bound

    q, k, v, cu, cu_host = make_attention_inputs(seqlens, heads)
    out = torch.full_like(q, float("nan"))
    h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu, out, cu_seqlens_host=cu_host)
    want = R.minimax_h3_varlen_attention_fp8(q, k, v, cu)
    bf16_ref = sdpa_bf16(q, k, v, cu_host)
    err_ref, err_sdpa, ref_sdpa = rel_l2(out, want), rel_l2(out, bf16_ref), rel_l2(want, bf16_ref)
    misses = attention_reference_misses(out, want, cu_host)
    print(f"attention (minimax_h3_varlen_attention_fp8), segments {list(seqlens)}, {heads} heads:")
    print(f"  rel L2 vs reference {err_ref:.4f} (bound {reference_bound(max(seqlens))}: online softmax, P rounds "
          f"against running maxima); vs torch bf16 SDPA {err_sdpa:.4f} (the reference's own: {ref_sdpa:.4f})")
    for what, err, bound in misses:
        print(f"  over its bound: {what}, rel L2 {err:.4f} > {bound}")
    ok = bool(torch.isfinite(out.float()).all()) and not misses and err_sdpa <= 1.1 * ref_sdpa
    return ok, (q, k, v, cu, cu_host)


def time_attention(q, k, v, cu, cu_host):
    import h3kernels
    from h3kernels.testing.timing import attention_flops
    from h3kernels.testing.timing import median_ms
    from h3kernels.peers.torch_attention import sdpa_bf16

    ours = median_ms(lambda: h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu, cu_seqlens_host=cu_host), reps=10)
    theirs = median_ms(lambda: sdpa_bf16(q, k, v, cu_host), reps=10)
    flops = attention_flops([b - a for a, b in zip(cu_host, cu_host[1:])], q.shape[1])
    print(f"  h3kernels {ours:.3f} ms = {flops / ours / 1e9:.0f} TFLOP/s; torch bf16 SDPA {theirs:.3f} ms\n")
    return ours
