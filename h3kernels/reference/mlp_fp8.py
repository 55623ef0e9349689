"""Reference of minimax_h3_mlp_fp8 (docs/spec.md, MLP): the weight preparation, the row
stage (RMSNorm + indexed AdaLN + per-token e4m3 quantization), FC1 + SwiGLU, and FC2 with the
requantization of y and the gated residual. The operators check their arguments as the GPU ones
do (h3kernels._validate.mlp_fp8) before anything is computed or written."""
import torch

from h3kernels import _validate as validate
from h3kernels._validate import mlp_fp8 as checks
from h3kernels.constants import FC1_OUT, FFN, HIDDEN, ROW_THREADS
from h3kernels.quantize import (F32, bf16, div, fc1_row_order_on, fc1_weight, fc2_weight, minimax_h3_fc1_row_order,  # noqa: F401
                                quantize_rows)


def prepare_minimax_h3_fc1_weight_fp8(w1):
    """w1 [28672, 5376] (gate rows, then up rows) -> (e4m3 q, f32 scale) in prepacked row order."""
    checks.weight("w1", w1, (FC1_OUT, HIDDEN), validate.TORCH_TENSORS)
    return fc1_weight(w1)


def prepare_minimax_h3_fc2_weight_fp8(w2):
    """w2 [5376, 14336] -> (e4m3 q, f32 scale) in logical row order."""
    checks.weight("w2", w2, (HIDDEN, FFN), validate.TORCH_TENSORS)
    return fc2_weight(w2)


def sum_of_squares(x):
    """FP32 sum of x*x per row, in the row kernel's order: thread t of T adds the squares of
    element quads t, t + T, t + 2T, ... (each quad's four in order); the T partials are halved
    pairwise (p[i] += p[i + half]) down to three, which add as (p0 + p1) + p2."""
    sq = x.to(F32) ** 2  # exact: x is bf16
    sq = sq.reshape(sq.shape[0], -1, ROW_THREADS, 4)  # [rows, quad round j, thread t, k]
    part = torch.zeros_like(sq[:, 0, :, 0])
    for j in range(sq.shape[1]):
        for k in range(4):
            part = part + sq[:, j, :, k]
    while part.shape[-1] > 3:
        half = part.shape[-1] // 2
        part = part[..., :half] + part[..., half:]
    return (part[..., 0] + part[..., 1]) + part[..., 2]


def rms_scale(x, eps):
    """r = 1 / sqrt(sum(x*x) / 5376 + eps), each operation correctly rounded in FP32."""
    v = div(sum_of_squares(x), HIDDEN) + torch.tensor(eps, dtype=F32, device=x.device)
    root = torch.sqrt(v.double()).to(F32)  # torch's FP32 sqrt is not correctly rounded on every CPU
    return torch.ones_like(root) / root


def index_guard(adaln_index, rows):
    idx = adaln_index.to(torch.int64)
    valid = (idx >= 0) & (idx < rows)
    return torch.where(valid, idx, torch.zeros_like(idx)), valid


def mlp_row_stage(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps=1e-5):
    """Returns a (bf16 [M, 5376]) before quantization. Unchecked: the operators check."""
    rows = adaln_scale.shape[0]
    idx, valid = index_guard(adaln_index, rows)
    r = rms_scale(x, eps)
    n = bf16((x.to(F32) * r[:, None]) * x_norm_weight.to(F32))
    t = bf16(1.0 + adaln_scale[idx].to(F32))
    a = bf16(n.to(F32) * t.to(F32) + adaln_shift[idx].to(F32))
    return torch.where(valid[:, None], a, torch.zeros_like(a))


def exact_dot(a_q, w_q):
    """The contract's FP32 sum of exact e4m3 products, as close as it gets: summed in float64
    (exact for up to 2**15 products of this range), then rounded once to FP32."""
    return (a_q.to(torch.float64) @ w_q.to(torch.float64).T).to(F32)


def fc1_swiglu(a_q, a_scale, fc1_weight_q, fc1_weight_scale):
    """y (bf16 [M, 14336], logical columns) from the quantized activation and prepacked FC1 weights."""
    return swiglu_from_sums(exact_dot(a_q, fc1_weight_q), a_scale, fc1_weight_scale)


def swiglu_from_sums(acc1, a_scale, fc1_weight_scale):
    """y (bf16 [M, 14336], logical columns) from FC1's FP32 sums acc1 [M, 28672] (prepacked columns):
    the contract's arithmetic after the sum, for sums of any accumulation."""
    h = bf16((acc1 * a_scale.to(F32)[:, None]) * fc1_weight_scale.to(F32)[None, :])
    logical = torch.empty_like(h)
    logical[:, fc1_row_order_on(h.device)] = h
    g, u = logical[:, :FFN].to(F32), logical[:, FFN:].to(F32)
    return bf16(bf16(g / (1.0 + torch.exp(-g))).to(F32) * u)


def _fill(workspace, value):
    if workspace is not None:
        workspace.copy_(value.to(workspace.dtype))
    return value if workspace is None else workspace


def minimax_h3_mlp_fp8_row_stage(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, *,
                                 workspace_a_q=None, workspace_a_scale=None, eps=1e-5):
    """The MLP's first stage alone, as h3kernels.minimax_h3_mlp_fp8_row_stage: returns (a_q e4m3
    [M, 5376], a_scale f32 [M]), the workspaces themselves when given."""
    eps = checks.row_stage_args(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps, workspace_a_q,
                                workspace_a_scale, validate.TORCH_TENSORS)
    validate.one_device(dict(x=x, x_norm_weight=x_norm_weight, adaln_scale=adaln_scale, adaln_shift=adaln_shift,
                             adaln_index=adaln_index, workspace_a_q=workspace_a_q,
                             workspace_a_scale=workspace_a_scale))
    a_q, a_scale = quantize_rows(mlp_row_stage(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps))
    return _fill(workspace_a_q, a_q), _fill(workspace_a_scale, a_scale)


def minimax_h3_mlp_fp8(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, gate, residual,
                      fc1_weight_q, fc1_weight_scale, fc2_weight_q, fc2_weight_scale, *, out=None,
                      workspace_a_q=None, workspace_a_scale=None, workspace_y=None, workspace_y_q=None,
                      workspace_y_scale=None, workspace_flags=None, eps=1e-5, fp8_mma_form=-1):
    """The fused W8A8 MLP block (docs/spec.md, MLP), as h3kernels.minimax_h3_mlp_fp8:
    returns out (bf16 [M, 5376]); workspaces, when given, receive a_q, a_scale, y, y_q, y_scale,
    and zeros in the flags. Every valid fp8_mma_form gives the same result."""
    inputs = dict(x=x, x_norm_weight=x_norm_weight, adaln_scale=adaln_scale, adaln_shift=adaln_shift,
                  adaln_index=adaln_index, gate=gate, residual=residual, fc1_weight_q=fc1_weight_q,
                  fc1_weight_scale=fc1_weight_scale, fc2_weight_q=fc2_weight_q, fc2_weight_scale=fc2_weight_scale)
    given = dict(out=out, workspace_a_q=workspace_a_q, workspace_a_scale=workspace_a_scale, workspace_y=workspace_y,
                 workspace_y_q=workspace_y_q, workspace_y_scale=workspace_y_scale, workspace_flags=workspace_flags)
    eps = checks.mlp_args(inputs, given, eps, fp8_mma_form, accepted=validate.TORCH_TENSORS)
    validate.one_device({**inputs, **given})

    a = mlp_row_stage(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps)
    a_q, s_a = quantize_rows(a)
    _fill(workspace_a_q, a_q)
    _fill(workspace_a_scale, s_a)

    y = fc1_swiglu(a_q, s_a, fc1_weight_q, fc1_weight_scale)
    _fill(workspace_y, y)

    y_q, s_y = quantize_rows(y)
    _fill(workspace_y_q, y_q)
    _fill(workspace_y_scale, s_y)
    if workspace_flags is not None:
        workspace_flags.zero_()

    acc2 = exact_dot(y_q, fc2_weight_q)
    o = bf16((acc2 * s_y[:, None]) * fc2_weight_scale.to(F32)[None, :])
    idx, valid = index_guard(adaln_index, gate.shape[0])
    res = bf16(residual.to(F32) + bf16(gate[idx].to(F32) * o.to(F32)).to(F32))
    res = torch.where(valid[:, None], res, residual)  # guarded rows: residual, bitwise
    return _fill(out, res)


def mlp_exact_bf16(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, gate, w1, w2, eps=1e-5):
    """Unquantized MLP delta (out - residual) in FP32 from bf16 weights w1 [28672, 5376] (logical), w2."""
    a = mlp_row_stage(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps).to(F32)
    h = a @ w1.to(F32).T
    g, u = h[:, :FFN], h[:, FFN:]
    y = g / (1.0 + torch.exp(-g)) * u
    idx, valid = index_guard(adaln_index, gate.shape[0])
    return (y @ w2.to(F32).T) * gate[idx].to(F32) * valid[:, None]
