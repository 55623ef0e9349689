"""torch's own paths for the MiniMax-H3 MLP block, the peers the demo and bench/bench_mlp.py time
beside minimax_h3_mlp_fp8: bf16 weights and matmuls (`mlp_bf16`), and per-token FP8 with
torch._scaled_mm rowwise (`mlp_fp8`, weights in logical row order as reference.quantize_rows
gives them, scales as [1, N]), and both timed as the bench and the demo show them (`timed_peers`,
torch.compile's FP8 block first). Plain torch: no quantization contract, no bitwise claims."""
import functools

import torch
import torch.nn.functional as F

from h3kernels.reference import index_guard
from h3kernels.constants import E4M3_MAX, FFN


def row_stage(x, wn, sc, sh, i, eps):
    """a = bf16 AdaLN(RMSNorm(x)): FP32 mean of squares and rsqrt, then bf16 arithmetic."""
    xf = x.float()
    n = (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)).to(torch.bfloat16) * wn
    return n * (1 + sc[i]) + sh[i]


def quant_rows(v):
    """Per-token e4m3: s = amax / 448 (f32 [M, 1]), q = e4m3(clamp(v / s)); zero rows give q = 0."""
    s = (v.abs().amax(dim=-1, keepdim=True).float() / E4M3_MAX).clamp_min(1e-12)
    return (v.float() / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), s


def swiglu(h):
    return F.silu(h[:, :FFN]) * h[:, FFN:]


def gated_residual(res, gate, i, valid, o):
    return res + torch.where(valid[:, None], gate[i], torch.zeros((), dtype=gate.dtype, device=gate.device)) * o


def mlp_bf16(x, wn, sc, sh, idx, gate, res, w1, w2, eps=1e-5):
    i, valid = index_guard(idx, sc.shape[0])
    a = row_stage(x, wn, sc, sh, i, eps)
    return gated_residual(res, gate, i, valid, swiglu(a @ w1.t()) @ w2.t())


def fc1_fp8(a_q, s_a, w1q, w1s):
    return torch._scaled_mm(a_q, w1q.t(), scale_a=s_a, scale_b=w1s, out_dtype=torch.bfloat16)


def fc2_fp8(y_q, s_y, w2q, w2s):
    return torch._scaled_mm(y_q, w2q.t(), scale_a=s_y, scale_b=w2s, out_dtype=torch.bfloat16)


def fp8_gemm_inputs(x, wn, sc, sh, idx, w1q, w1s, eps=1e-5):
    """(a_q, s_a, y_q, s_y): the operands of mlp_fp8's two _scaled_mm calls."""
    i, _ = index_guard(idx, sc.shape[0])
    a_q, s_a = quant_rows(row_stage(x, wn, sc, sh, i, eps))
    y_q, s_y = quant_rows(swiglu(fc1_fp8(a_q, s_a, w1q, w1s)))
    return a_q, s_a, y_q, s_y


def mlp_fp8(x, wn, sc, sh, idx, gate, res, w1q, w1s, w2q, w2s, eps=1e-5):
    """w1q [28672, 5376] e4m3 in logical order (gate rows, then up rows), w1s [1, 28672] f32;
    w2q [5376, 14336] e4m3, w2s [1, 5376] f32. Weights go to _scaled_mm column-major (w.t())."""
    i, valid = index_guard(idx, sc.shape[0])
    _, _, y_q, s_y = fp8_gemm_inputs(x, wn, sc, sh, idx, w1q, w1s, eps)
    return gated_residual(res, gate, i, valid, fc2_fp8(y_q, s_y, w2q, w2s))


@functools.lru_cache(maxsize=1)
def compiled_fp8():
    """torch.compile of mlp_fp8, made once a process (torch traces it again only for new shapes)."""
    return torch.compile(mlp_fp8)


def timed_peers(x, wn, sc, sh, idx, gate, res, w1, w2):
    """{peer, peer_ms, peer2, peer2_ms}: torch.compile's FP8 block (the peer a user of FP8 would
    pick; its weights quantized per row in logical order, as torch._scaled_mm takes them), else,
    where compiling fails, torch's eager FP8 block; and torch's eager bf16 block; each timed on
    the same inputs as back-to-back calls (median_ms_batched)."""
    import sys

    from h3kernels.quantize import quantize_rows
    from h3kernels.timing import median_ms_batched

    (q1, s1), (q2, s2) = quantize_rows(w1), quantize_rows(w2)
    operands = (x, wn, sc, sh, idx, gate, res, q1, s1.view(1, -1), q2, s2.view(1, -1))
    name, block = "torch.compile FP8", compiled_fp8()
    try:
        block(*operands)  # compiles on first use
    except Exception as e:  # no working compiler toolchain here: the eager block is the next best peer
        sys.stderr.write(f"\ntorch.compile of the FP8 block failed ({type(e).__name__}: {e}); timing it eagerly\n")
        name, block = "torch FP8 eager", mlp_fp8
    peer = median_ms_batched(lambda: block(*operands))
    eager = median_ms_batched(lambda: mlp_bf16(x, wn, sc, sh, idx, gate, res, w1, w2))
    return dict(peer=name, peer_ms=peer, peer2="torch eager bf16", peer2_ms=eager)
