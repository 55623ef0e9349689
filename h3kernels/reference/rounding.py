"""The contract's rounding steps as torch operations: bf16(), e4m3(), RN(a / b), and the per-row
e4m3 quantization built from them. Shared by both operators' references."""
import torch

from h3kernels.constants import E4M3_MAX

F32 = torch.float32


def bf16(v):
    """FP32 -> bfloat16, round to nearest even (NaN -> 0x7FC0)."""
    return v.to(F32).to(torch.bfloat16)


def e4m3(v):
    """FP32 -> float8_e4m3fn, round to nearest even, saturating to +-448 (cvt.rn.satfinite)."""
    return torch.clamp(v.to(F32), -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def div(a, b):
    """RN(a / b) elementwise. b is made a tensor: on CUDA, torch divides by a Python scalar as
    a * (1 / b), which is not RN(a / b)."""
    return a / torch.full_like(a, b) if not torch.is_tensor(b) else a / b


def quantize_rows(v):
    """Per-row e4m3 quantization: s = RN(amax / 448), q = e4m3(RN(v / s)); amax 0 gives s = 0, q = 0."""
    v = v.to(F32)
    s = div(v.abs().amax(dim=-1), E4M3_MAX)
    safe = torch.where(s > 0, s, torch.ones_like(s))
    q = e4m3(torch.where((s > 0)[..., None], v / safe[..., None], torch.zeros_like(v)))
    return q, s
