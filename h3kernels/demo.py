"""`python -m h3kernels demo`: what exists, run at MiniMax-H3 sizes and checked against the reference."""
import time

from .compare import bf16_ulps, cos, rel_l2
from .shapes import HIDDEN


def make_row_inputs(m, rows=50, device="cpu", seed=0):
    """Random MLP row-stage inputs: AdaLN tables are column chunks of a [rows, 6*5376] projection,
    and every 7th index is out of range."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    x = (torch.randn(m, HIDDEN, generator=g, device=device) * 2).bfloat16()
    w = (1 + 0.1 * torch.randn(HIDDEN, generator=g, device=device)).bfloat16()
    mod = (0.5 * torch.randn(rows, 6 * HIDDEN, generator=g, device=device)).bfloat16()
    idx = torch.randint(0, rows, (m,), generator=g, device=device)
    idx[::7] = rows + 3
    return x, w, mod[:, HIDDEN:2 * HIDDEN], mod[:, 3 * HIDDEN:4 * HIDDEN], idx


def make_attention_inputs(seqlens, heads=56, device="cuda", seed=3):
    """Random bf16 q, k, v [tokens, heads, 128] packed from segments of the given lengths, and
    cu_seqlens as an int32 tensor on `device` and as a host list."""
    import torch

    from .shapes import HEAD_DIM, cu_seqlens_of

    cu_host = cu_seqlens_of(seqlens)
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(cu_host[-1], heads, HEAD_DIM, generator=g, device=device).bfloat16() for _ in range(3))
    return q, k, v, torch.tensor(cu_host, dtype=torch.int32, device=device), cu_host


def make_mlp_weights(m, rows, seed=2):
    """On the GPU: gate [rows, 5376], residual [M, 5376], bf16 weights w1, w2 and their prepared
    e4m3 forms (q1, s1, q2, s2)."""
    import torch

    import h3kernels
    from .shapes import FC1_OUT, FFN

    g = torch.Generator(device="cuda").manual_seed(seed)
    w1 = (torch.randn(FC1_OUT, HIDDEN, generator=g, device="cuda") * HIDDEN ** -0.5).bfloat16()
    w2 = (torch.randn(HIDDEN, FFN, generator=g, device="cuda") * FFN ** -0.5).bfloat16()
    gate = torch.randn(rows, HIDDEN, generator=g, device="cuda").bfloat16()
    residual = torch.randn(m, HIDDEN, generator=g, device="cuda").bfloat16()
    q1, s1 = h3kernels.prepare_minimax_h3_fc1_weight_fp8(w1)
    q2, s2 = h3kernels.prepare_minimax_h3_fc2_weight_fp8(w2)
    return gate, residual, w1, w2, q1, s1, q2, s2


def run_cpu(args):
    import torch

    from . import reference as R

    print("No CUDA GPU found: the FP8 kernels need an sm_89, sm_90 or sm_120 GPU.")
    print("Running h3kernels.reference (the CPU oracle) on a small case instead.\n")
    t0 = time.time()
    m, rows = 4, 3
    x, w, sc, sh, idx = make_row_inputs(m, rows)
    g = torch.Generator().manual_seed(1)
    w1 = (torch.randn(2 * 14336, HIDDEN, generator=g) * HIDDEN ** -0.5).bfloat16()
    w2 = (torch.randn(HIDDEN, 14336, generator=g) * 14336 ** -0.5).bfloat16()
    gate = (torch.randn(rows, HIDDEN, generator=g)).bfloat16()
    residual = torch.randn(m, HIDDEN, generator=g).bfloat16()
    q1, s1 = R.prepare_minimax_h3_fc1_weight_fp8(w1)
    q2, s2 = R.prepare_minimax_h3_fc2_weight_fp8(w2)
    out = R.minimax_h3_mlp_fp8(x, w, sc, sh, idx, gate, residual, q1, s1, q2, s2)
    exact = R.mlp_exact_bf16(x, w, sc, sh, idx, gate, w1, w2)
    delta = out.float() - residual.float()
    ok = (R.index_guard(idx, rows)[1])
    print(f"MLP reference, M={m}: out - residual vs unquantized FP32: "
          f"cos {cos(delta[ok], exact[ok]):.5f}, rel L2 {rel_l2(delta[ok], exact[ok]):.4f} "
          f"({time.time() - t0:.1f} s)")

    t0 = time.time()
    seg, heads = [0, 200, 200, 456], 4
    tokens = seg[-1]
    q, k, v = (torch.randn(tokens, heads, 128, generator=g).bfloat16() for _ in range(3))
    cu = torch.tensor(seg, dtype=torch.int32)
    o = R.minimax_h3_varlen_attention_fp8(q, k, v, cu)
    e = R.attention_exact(q, k, v, cu)
    print(f"attention reference, segments {[b - a for a, b in zip(seg, seg[1:])]}, {heads} heads: "
          f"rel L2 vs float64 softmax {rel_l2(o, e):.4f} ({time.time() - t0:.1f} s)")
    return 0


def run_gpu(args):
    import torch

    from . import jit, mma_ceiling, reference as R
    from .mlp_fp8 import minimax_h3_mlp_fp8_row_stage
    from .timing import copy_bandwidth_gbs, median_ms, row_stage_kernel_ms

    dev = torch.cuda.current_device()
    cc = torch.cuda.get_device_capability(dev)
    arch = jit.arch_for(cc)
    print(f"GPU: {torch.cuda.get_device_name(dev)} (compute capability {cc[0]}.{cc[1]} -> {arch})\n")

    m = args.rows
    x, w, sc, sh, idx = make_row_inputs(m, device="cuda")
    a_q, a_s = minimax_h3_mlp_fp8_row_stage(x, w, sc, sh, idx)
    ref = R.mlp_row_stage(*(t.cpu() for t in (x, w, sc, sh, idx)))
    rq, rs = R.quantize_rows(ref)
    same_q = int((a_q.cpu().view(torch.uint8) != rq.view(torch.uint8)).sum())
    same_s = int((a_s.cpu().view(torch.int32) != rs.view(torch.int32)).sum())
    kernel_ms = row_stage_kernel_ms([(x, w, sc, sh, idx)], a_q, a_s)
    call_ms = median_ms(lambda: minimax_h3_mlp_fp8_row_stage(x, w, sc, sh, idx, workspace_a_q=a_q,
                                                             workspace_a_scale=a_s))
    torch_ms = median_ms(lambda: R.quantize_rows(R.mlp_row_stage(x, w, sc, sh, idx)), reps=5)
    nbytes = x.numel() * 2 + a_q.numel() + a_s.numel() * 4
    copy_gbs, _ = copy_bandwidth_gbs(nbytes)
    gbs = nbytes / (kernel_ms * 1e-3) / 1e9
    print(f"MLP row stage (RMSNorm + AdaLN + e4m3 quantization), M={m}:")
    print(f"  vs reference: {same_q} of {a_q.numel()} a_q bytes and {same_s} of {m} scales differ")
    print(f"  h3kernels kernel {kernel_ms:.3f} ms = {gbs:.0f} GB/s ({100 * gbs / copy_gbs:.0f}% of a torch copy of "
          f"the same bytes, {copy_gbs:.0f} GB/s); one whole call {call_ms:.3f} ms; torch eager {torch_ms:.3f} ms\n")

    mlp_ok = run_gpu_mlp(m, x, w, sc, sh, idx)
    attn_ok = run_gpu_attention(args.segments)
    for form in mma_ceiling.supported_forms(dev):
        print(f"e4m3 mma.sync ceiling, form {form}: {mma_ceiling.measure_tflops(dev, form):.0f} TFLOP/s")
    return 0 if same_q == 0 and same_s == 0 and mlp_ok and attn_ok else 1


def run_gpu_attention(seqlens, heads=56):
    """The attention at MiniMax-H3 head count against the reference, and beside torch's bf16 SDPA
    (torch_attention.sdpa_bf16), which also stands in for the unquantized result."""
    import torch

    import h3kernels
    from . import reference as R
    from .shapes import attention_flops
    from .timing import median_ms
    from .torch_attention import sdpa_bf16

    q, k, v, cu, cu_host = make_attention_inputs(seqlens, heads)
    run = lambda: h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu, cu_seqlens_host=cu_host)
    out = run()
    want = R.minimax_h3_varlen_attention_fp8(q, k, v, cu)

    sdpa = lambda: sdpa_bf16(q, k, v, cu_host)
    bf16_ref = sdpa()
    ours, theirs = median_ms(run, reps=10), median_ms(sdpa, reps=10)
    flops = attention_flops(seqlens, heads)
    err_ref, err_sdpa, ref_sdpa = rel_l2(out, want), rel_l2(out, bf16_ref), rel_l2(want, bf16_ref)
    print(f"attention (minimax_h3_varlen_attention_fp8), segments {list(seqlens)}, {heads} heads:")
    print(f"  rel L2 vs reference {err_ref:.4f} (online softmax: P rounds against running maxima, about 0.025 on long "
          f"segments); vs torch bf16 SDPA {err_sdpa:.4f} (the reference's own: {ref_sdpa:.4f})")
    print(f"  h3kernels {ours:.3f} ms = {flops / ours / 1e9:.0f} TFLOP/s; torch bf16 SDPA {theirs:.3f} ms\n")
    return bool(torch.isfinite(out.float()).all()) and err_ref <= 0.03 and err_sdpa <= 1.1 * ref_sdpa


def run_gpu_mlp(m, x, w, sc, sh, idx):
    """The whole MLP at MiniMax-H3 sizes: each stage against the reference, time beside torch's path."""
    import torch

    import h3kernels
    from . import reference as R
    from .shapes import FC1_OUT, FFN
    from .timing import median_ms
    from .torch_mlp import mlp_bf16

    gate, residual, w1, w2, q1, s1, q2, s2 = make_mlp_weights(m, sc.shape[0])
    ws = dict(workspace_y=torch.empty(m, FFN, dtype=torch.bfloat16, device="cuda"),
              workspace_y_q=torch.empty(m, FFN, dtype=torch.float8_e4m3fn, device="cuda"),
              workspace_y_scale=torch.empty(m, device="cuda"))
    args = (x, w, sc, sh, idx, gate, residual, q1, s1, q2, s2)
    out = h3kernels.minimax_h3_mlp_fp8(*args, **ws)
    a_q, a_s = R.quantize_rows(R.mlp_row_stage(x, w, sc, sh, idx))
    over = lambda got, want: int((bf16_ulps(got, want) > 1).sum())
    y_over = 0
    for r0 in range(0, m, 4096):  # y from the reference's a_q (equal to the kernel's, bitwise)
        sl = slice(r0, r0 + 4096)
        y_over += over(ws["workspace_y"][sl], R.fc1_swiglu(a_q[sl], a_s[sl], q1, s1))
    yq, ys = R.quantize_rows(ws["workspace_y"])
    o = R.bf16((R.exact_dot(ws["workspace_y_q"], q2) * ys[:, None]) * s2[None, :])
    i, valid = R.index_guard(idx, gate.shape[0])
    want = torch.where(valid[:, None], R.bf16(residual.float() + R.bf16(gate[i].float() * o.float()).float()),
                       residual)
    out_over = over(out, want)
    yq_same = bool(torch.equal(yq.view(torch.uint8), ws["workspace_y_q"].view(torch.uint8)))
    ours = median_ms(lambda: h3kernels.minimax_h3_mlp_fp8(*args, **ws), reps=10)
    theirs = median_ms(lambda: mlp_bf16(x, w, sc, sh, idx, gate, residual, w1, w2), reps=10)
    exact = R.mlp_exact_bf16(x[:1024], w, sc, sh, idx[:1024], gate, w1, w2)
    delta = out[:1024].float() - residual[:1024].float()
    tflops = 2 * m * HIDDEN * (FC1_OUT + FFN) / ours / 1e9
    print(f"MLP block (minimax_h3_mlp_fp8), M={m}:")
    print(f"  vs reference: y {y_over} of {m * FFN} over 1 bf16 ulp; y_q bitwise from y: {yq_same}; "
          f"out {out_over} of {out.numel()} over 1 ulp")
    print(f"  vs unquantized FP32 (first 1024 rows, out - residual): cos {cos(delta, exact):.5f}, "
          f"rel L2 {rel_l2(delta, exact):.4f}")
    print(f"  h3kernels {ours:.3f} ms = {tflops:.0f} TFLOP/s; torch eager bf16 {theirs:.3f} ms\n")
    return yq_same and y_over <= 1e-3 * m * FFN and out_over <= 1e-3 * out.numel()

