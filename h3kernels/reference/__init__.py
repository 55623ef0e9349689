"""CPU (torch) reference of both operators, exactly as docs/spec.md defines them.

It is the oracle of every numeric test. It computes on whatever device its inputs live on,
but it is written for clarity, not speed, and is validated on the CPU.

Where the contract allows any summation order, the RMSNorm sum of squares follows the row
kernel's (see sum_of_squares), so that a_q and a_scale compare bitwise. Nothing else before
a_q depends on an order.
"""
import math

import torch

from h3kernels.constants import E4M3_MAX, FC1_OUT, FFN, HEAD_DIM, HIDDEN, K_BLOCK, ROW_THREADS, fc1_row_order_numpy

F32 = torch.float32


# --- rounding helpers (the contract's bf16(), e4m3(), RN(a / b)) -------------------------

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


# --- MLP ------------------------------------------------------------------------------

def minimax_h3_fc1_row_order(device=None):
    return torch.from_numpy(fc1_row_order_numpy()).to("cpu" if device is None else device)


def prepare_minimax_h3_fc1_weight_fp8(w1):
    """w1 [28672, 5376] (gate rows, then up rows) -> (e4m3 q, f32 scale) in prepacked row order."""
    if tuple(w1.shape) != (FC1_OUT, HIDDEN):
        raise ValueError(f"w1: got shape {tuple(w1.shape)}, need ({FC1_OUT}, {HIDDEN})")
    order = minimax_h3_fc1_row_order(w1.device)
    return quantize_rows(w1[order])


def prepare_minimax_h3_fc2_weight_fp8(w2):
    """w2 [5376, 14336] -> (e4m3 q, f32 scale) in logical row order."""
    if tuple(w2.shape) != (HIDDEN, FFN):
        raise ValueError(f"w2: got shape {tuple(w2.shape)}, need ({HIDDEN}, {FFN})")
    return quantize_rows(w2)


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
    """Returns a (bf16 [M, 5376]) before quantization."""
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
    acc1 = exact_dot(a_q, fc1_weight_q)
    h = bf16((acc1 * a_scale.to(F32)[:, None]) * fc1_weight_scale.to(F32)[None, :])
    logical = torch.empty_like(h)
    logical[:, minimax_h3_fc1_row_order(h.device)] = h
    g, u = logical[:, :FFN].to(F32), logical[:, FFN:].to(F32)
    return bf16(bf16(g / (1.0 + torch.exp(-g))).to(F32) * u)


def _fill(workspace, value):
    if workspace is not None:
        workspace.copy_(value.to(workspace.dtype))


def minimax_h3_mlp_fp8(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, gate, residual,
                      fc1_weight_q, fc1_weight_scale, fc2_weight_q, fc2_weight_scale, *, out=None,
                      workspace_a_q=None, workspace_a_scale=None, workspace_y=None, workspace_y_q=None,
                      workspace_y_scale=None, workspace_flags=None, eps=1e-5, fp8_mma_form=-1):
    """The fused W8A8 MLP block (contract.md, MLP details)."""
    if not adaln_scale.shape[0] == adaln_shift.shape[0] == gate.shape[0]:
        raise ValueError(f"gate: got {gate.shape[0]} rows, adaln_scale {adaln_scale.shape[0]} and adaln_shift "
                         f"{adaln_shift.shape[0]}; need one row count")
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
    if out is None:
        return res
    out.copy_(res)
    return out


# --- attention -------------------------------------------------------------------------

def _segments(cu_seqlens):
    cu = [int(c) for c in cu_seqlens.tolist()] if torch.is_tensor(cu_seqlens) else list(cu_seqlens)
    return list(zip(cu[:-1], cu[1:]))


def key_mean(ks):
    """FP32 mean over a segment's keys [L, heads, 128] in the K pass's order: the keys of each
    128-key block (from the segment's start) added in token order, the block sums added in block
    order, then RN(sum / L)."""
    total = torch.zeros_like(ks[0])
    for b0 in range(0, ks.shape[0], K_BLOCK):
        part = torch.zeros_like(ks[0])
        for t in range(b0, min(b0 + K_BLOCK, ks.shape[0])):
            part = part + ks[t]
        total = total + part
    return div(total, ks.shape[0])


def quantize_attention_inputs(q, k, v, cu_seqlens):
    """Returns (q8, s_q, k8, s_k, v8, s_v) as contract.md defines them.

    q8, k8, v8: e4m3 [tokens, heads, 128]; s_q: f32 [tokens, heads];
    s_k: f32 [tokens, heads] (the scale of the 128-key block each key belongs to);
    s_v: f32 [tokens, heads, 128] (its segment's per-channel scale, repeated per key).
    """
    q8, s_q = quantize_rows(q)
    k8 = torch.empty_like(k, dtype=torch.float8_e4m3fn)
    s_k = torch.empty(k.shape[:2], dtype=F32, device=k.device)
    v8 = torch.empty_like(v, dtype=torch.float8_e4m3fn)
    s_v = torch.empty(v.shape, dtype=F32, device=v.device)
    for a, b in _segments(cu_seqlens):
        if a == b:
            continue
        ks = k[a:b].to(F32)
        kc = ks - key_mean(ks)[None]
        for blk in range(a, b, K_BLOCK):
            e = min(blk + K_BLOCK, b)
            part = kc[blk - a:e - a]  # [n, heads, 128]
            s = div(part.abs().amax(dim=(0, 2)), E4M3_MAX)  # [heads]
            safe = torch.where(s > 0, s, torch.ones_like(s))
            k8[blk:e] = e4m3(torch.where(s[None, :, None] > 0, part / safe[None, :, None], 0.0))
            s_k[blk:e] = s
        vs = v[a:b].to(F32)
        s = div(vs.abs().amax(dim=0), E4M3_MAX)  # [heads, 128]
        safe = torch.where(s > 0, s, torch.ones_like(s))
        v8[a:b] = e4m3(torch.where(s[None] > 0, vs / safe[None], 0.0))
        s_v[a:b] = s
    return q8, s_q, k8, s_k, v8, s_v


def minimax_h3_varlen_attention_fp8(q, k, v, cu_seqlens, out=None, *, cu_seqlens_host=None,
                                    softmax_scale=None, query_chunk=1024):
    """Non-causal packed-varlen FP8 attention (contract.md, Attention details)."""
    scale = 1.0 / math.sqrt(HEAD_DIM) if softmax_scale is None else float(softmax_scale)
    tokens, heads, _ = q.shape
    res = torch.empty_like(q) if out is None else out
    if tokens == 0:
        return res
    segs = cu_seqlens if cu_seqlens_host is None else cu_seqlens_host
    q8, s_q, k8, s_k, v8, s_v = quantize_attention_inputs(q, k, v, segs)
    for a, b in _segments(segs):
        if a == b:
            continue
        kf = k8[a:b].to(F32).transpose(0, 1)  # [heads, L, 128]
        vf = v8[a:b].to(F32).transpose(0, 1)
        sk = s_k[a:b].T  # [heads, L]
        sv = s_v[a].to(F32)  # [heads, 128]
        for c in range(a, b, query_chunk):
            e = min(c + query_chunk, b)
            qf = q8[c:e].to(F32).transpose(0, 1)  # [heads, n, 128]
            s = ((qf @ kf.transpose(1, 2)) * s_q[c:e].T[:, :, None]) * sk[:, None, :] * scale
            p = torch.exp(s - s.amax(dim=-1, keepdim=True))
            l = p.sum(dim=-1)
            o = e4m3(256.0 * p).to(F32) @ vf
            res[c:e] = bf16(o * sv[:, None, :] / (256.0 * l[:, :, None])).transpose(0, 1)
    return res


def attention_exact(q, k, v, cu_seqlens, softmax_scale=None):
    """Unquantized float64 softmax attention, the yardstick of the quantized paths."""
    scale = 1.0 / math.sqrt(HEAD_DIM) if softmax_scale is None else float(softmax_scale)
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    for a, b in _segments(cu_seqlens):
        if a == b:
            continue
        qs, ks, vs = (t[a:b].to(torch.float64).transpose(0, 1) for t in (q, k, v))
        p = torch.softmax((qs @ ks.transpose(1, 2)) * scale, dim=-1)
        out[a:b] = (p @ vs).transpose(0, 1)
    return out


def mlp_exact_bf16(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, gate, w1, w2, eps=1e-5):
    """Unquantized MLP delta (out - residual) in FP32 from bf16 weights w1 [28672, 5376] (logical), w2."""
    a = mlp_row_stage(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps).to(F32)
    h = a @ w1.to(F32).T
    g, u = h[:, :FFN], h[:, FFN:]
    y = g / (1.0 + torch.exp(-g)) * u
    idx, valid = index_guard(adaln_index, gate.shape[0])
    return (y @ w2.to(F32).T) * gate[idx].to(F32) * valid[:, None]
