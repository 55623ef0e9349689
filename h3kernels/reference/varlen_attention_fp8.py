"""Reference of minimax_h3_varlen_attention_fp8 (docs/spec.md, Attention): the
quantization of q, k (mean-centred per segment, scaled per 128-key block) and v (per segment and
channel), then softmax attention with P rounded to e4m3. The operator checks its arguments as
the GPU one does (h3kernels._validate.varlen_attention_fp8); attention_fp8 is the unchecked
computation, and attention_exact the float64 yardstick."""
import torch

from h3kernels import _validate as validate
from h3kernels._validate import varlen_attention_fp8 as checks
from h3kernels.constants import E4M3_MAX, K_BLOCK
from h3kernels.reference.rounding import F32, bf16, div, e4m3, quantize_rows


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
    """Returns (q8, s_q, k8, s_k, v8, s_v) as docs/spec.md defines them.

    q8, k8, v8: e4m3 [tokens, heads, 128]; s_q: f32 [tokens, heads];
    s_k: f32 [tokens, heads] (the scale of the 128-key block each key belongs to);
    s_v: f32 [tokens, heads, 128] (its segment's per-channel scale, repeated per key).
    cu_seqlens: a tensor or a host sequence, unchecked.
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


def attention_fp8(q, k, v, cu_seqlens, softmax_scale=None, out=None, query_chunk=1024):
    """The computation of minimax_h3_varlen_attention_fp8, unchecked: cu_seqlens a tensor or a
    host sequence, the tensors on any one device; queries in chunks of query_chunk rows."""
    scale = checks.softmax_scale(softmax_scale)
    res = torch.empty_like(q) if out is None else out
    if q.shape[0] == 0:
        return res
    q8, s_q, k8, s_k, v8, s_v = quantize_attention_inputs(q, k, v, cu_seqlens)
    for a, b in _segments(cu_seqlens):
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


def minimax_h3_varlen_attention_fp8(q, k, v, cu_seqlens, out=None, *, cu_seqlens_host=None, softmax_scale=None,
                                    fp8_mma_form=-1):
    """Non-causal packed-varlen FP8 attention (docs/spec.md, Attention), as
    h3kernels.minimax_h3_varlen_attention_fp8: q, k, v bf16 [tokens, heads, 128], cu_seqlens int32
    [segments + 1] (its values read back unless cu_seqlens_host is given); returns out. Every
    valid fp8_mma_form gives the same result."""
    tokens, _ = checks.check_args(q, k, v, cu_seqlens, out, validate.TORCH_TENSORS)
    scale = checks.softmax_scale(softmax_scale)
    checks.fp8_mma_form(fp8_mma_form)
    validate.one_device(dict(q=q, k=k, v=v, cu_seqlens=cu_seqlens, out=out))
    cu = checks.host_seqlens(cu_seqlens, cu_seqlens_host, tokens, cu_seqlens.tolist)
    return attention_fp8(q, k, v, cu, scale, out)


def attention_exact(q, k, v, cu_seqlens, softmax_scale=None):
    """Unquantized float64 softmax attention, the yardstick of the quantized paths (unchecked)."""
    scale = checks.softmax_scale(softmax_scale)
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    for a, b in _segments(cu_seqlens):
        if a == b:
            continue
        qs, ks, vs = (t[a:b].to(torch.float64).transpose(0, 1) for t in (q, k, v))
        p = torch.softmax((qs @ ks.transpose(1, 2)) * scale, dim=-1)
        out[a:b] = (p @ vs).transpose(0, 1)
    return out
