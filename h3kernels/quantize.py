"""The contract's rounding steps as torch operations: bf16(), e4m3(), RN(a / b), the per-row
e4m3 quantization built from them, and the weight preparation that is nothing but that
quantization (in the FC1 kernels' prepacked row order). One module for the operators' weight
preparation and for the CPU reference (h3kernels.reference), which both compute with it."""
import torch

from h3kernels.constants import E4M3_MAX, fc1_row_order_numpy

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


def minimax_h3_fc1_row_order(device=None):
    """int64 [28672]: prepacked FC1 row r holds logical row order[r] (8 gate rows, then their 8
    up rows), a torch tensor on `device` (None: the CPU; a str or torch.device, checked)."""
    from h3kernels._validate.mlp_fp8 import torch_device

    return fc1_row_order_on(torch_device(device))


def fc1_row_order_on(device):
    """The prepacked FC1 row order (constants.fc1_row_order_numpy) as an int64 tensor on `device`."""
    return torch.from_numpy(fc1_row_order_numpy()).to(device)


def fc1_weight(w1):
    """(e4m3 q, f32 scale) of FC1's weight [28672, 5376] in the prepacked row order, on w1's device."""
    return quantize_rows(w1[fc1_row_order_on(w1.device)])


def fc2_weight(w2):
    """(e4m3 q, f32 scale) of FC2's weight [5376, 14336], logical row order, on w2's device."""
    return quantize_rows(w2)
