"""torch's own paths for the MiniMax-H3 MLP block, the peers the demo and bench/bench_mlp.py time
beside minimax_h3_mlp_fp8: bf16 weights and matmuls (`mlp_bf16`), and per-token FP8 with
torch._scaled_mm rowwise (`mlp_fp8`, weights in logical row order as reference.quantize_rows
gives them, scales as [1, N]). Plain torch: no quantization contract, no bitwise claims."""
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
