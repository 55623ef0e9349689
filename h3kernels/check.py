"""`python -m h3kernels check`: the numeric acceptance of both operators on this device.

On a GPU: the MLP at M = 1, 129 and 4096 (a_q and a_scale bitwise, y and out within 1 bf16 ulp
for 99.9% of elements, y_q bitwise from y) and the attention on ragged and H3-sized segment sets
(rel L2 <= 0.03 from the reference, and no further from torch's bf16 attention than 1.1x the
reference's own). Without a GPU: the Numba row kernel and the attention's quantization passes in
the CUDA simulator, bitwise against the reference. Exit status 0 when everything passes.
"""
import os

MLP_ROWS = (1, 129, 4096)
ATTENTION_SETS = (([1, 127, 128, 129, 0, 700], 8), ([4096] * 4, 56))


def run_gpu():
    import torch

    from . import reference as R
    from .demo import make_row_inputs, run_gpu_attention, run_gpu_mlp
    from .mlp_fp8 import minimax_h3_mlp_fp8_row_stage

    results = []
    for m in MLP_ROWS:
        x, w, sc, sh, idx = make_row_inputs(m, rows=8, device="cuda", seed=m)
        idx[0] = 3  # make_row_inputs guards every 7th row, row 0 included: M = 1 must reach the GEMMs
        a_q, a_s = minimax_h3_mlp_fp8_row_stage(x, w, sc, sh, idx)
        rq, rs = R.quantize_rows(R.mlp_row_stage(x, w, sc, sh, idx))
        row_ok = torch.equal(a_q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(
            a_s.view(torch.int32), rs.view(torch.int32))
        results.append((f"MLP row stage M={m}: a_q, a_scale bitwise", row_ok))
        results.append((f"MLP block M={m}: y, y_q, out", run_gpu_mlp(m, x, w, sc, sh, idx)))
    for seqlens, heads in ATTENTION_SETS:
        results.append((f"attention {seqlens} x {heads} heads", run_gpu_attention(seqlens, heads)))
    return results


def run_simulator():
    """Set before Numba is imported (this is a fresh process without a GPU)."""
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    import numpy as np
    import torch

    from . import mlp_fp8_row, reference as R
    from . import varlen_attention_fp8_quant as Q
    from .demo import make_row_inputs
    from .shapes import HIDDEN
    from .varlen_attention_fp8_plan import plan_host

    bits = lambda t: t.contiguous().view(torch.int16).numpy().view(np.uint16)
    quads = lambda t: bits(t).view(np.uint64)
    flat = lambda t: torch.as_strided(t, ((t.shape[0] - 1) * t.stride(0) + t.shape[1],), (1,))
    m = 3
    x, w, sc, sh, idx = make_row_inputs(m, rows=4, seed=5)
    a_q, a_s = np.zeros((m, HIDDEN), np.uint8), np.zeros(m, np.float32)
    mlp_fp8_row.launch(quads(x), quads(w), quads(flat(sc)), quads(flat(sh)), sc.stride(0) // 4, sc.shape[0],
                       idx.numpy(), 1e-5, a_q.view(np.uint32), a_s)
    rq, rs = R.quantize_rows(R.mlp_row_stage(x, w, sc, sh, idx))
    row_ok = np.array_equal(a_q, rq.view(torch.uint8).numpy()) and np.array_equal(a_s.view(np.int32),
                                                                                   rs.view(torch.int32).numpy())
    cu, heads = [0, 1, 131], 1
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(cu[-1], heads, 128, generator=g).bfloat16() for _ in range(3))
    blocks = Q.key_blocks(cu)
    n = len(blocks)
    out = dict(q8=np.zeros((cu[-1], heads, 128), np.uint8), s_q=np.zeros((cu[-1], heads), np.float32),
               mu=np.zeros((2, heads, 128), np.float32), k8=np.zeros((cu[-1], heads, 128), np.uint8),
               s_k=np.zeros((n, heads), np.float32), v8t=np.zeros((heads, 128, n * 128), np.uint8),
               s_v=np.zeros((2, heads, 128), np.float32), partials=np.zeros((2, n, heads, 128), np.float32))
    Q.launch(bits(q), bits(k), bits(v), np.array(cu, np.int64), blocks, plan_host(cu, heads)[1], **out)
    q8, s_q, k8, s_k, v8, s_v = R.quantize_attention_inputs(q, k, v, cu)
    u8 = lambda t: t.view(torch.uint8).numpy()
    s_k_ok = all(np.array_equal(np.broadcast_to(out["s_k"][b], (count, heads)), s_k[first:first + count].numpy())
                 for b, (_, first, count) in enumerate(blocks))
    s_v_ok = all(np.array_equal(out["s_v"][seg], s_v[a].numpy()) for seg, a in enumerate(cu[:-1]) if cu[seg + 1] > a)
    quant_ok = (np.array_equal(out["q8"], u8(q8)) and np.array_equal(out["k8"], u8(k8))
                and np.array_equal(out["v8t"], Q.v_transposed(u8(v8), cu))
                and np.array_equal(out["s_q"], s_q.numpy()) and s_k_ok and s_v_ok)
    return [(f"MLP row kernel (simulator) M={m}: a_q, a_scale bitwise", row_ok),
            (f"attention quantization passes (simulator), segments {np.diff(cu).tolist()}: codes and scales bitwise",
             quant_ok)]


def run(gpu):
    if gpu:
        results = run_gpu()
    else:
        print("No CUDA GPU found: checking the Numba kernels in the CUDA simulator (the GPU checks need an "
              "sm_89, sm_90 or sm_120 GPU).\n")
        results = run_simulator()
    print("\nacceptance:")
    for name, ok in results:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    return 0 if all(ok for _, ok in results) else 1
