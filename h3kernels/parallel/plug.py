"""The per-rank attention in the form xDiT (xfuser) and yunchang plug into their Ulysses, ring
and USP layers: fn(q, k, v, dropout_p, softmax_scale, causal, ...) -> (out, lse), q, k, v
[batch, seqlen, heads, 128], lse f32 [batch, heads, seqlen] of the true scores, which their ring
merges by LSE."""
import torch

from h3kernels._validate import parallel as checks
from h3kernels._validate import varlen_attention_fp8 as attention_checks
from h3kernels.parallel.local import ATTENTION_FORM, default_attention


def attn_forward(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                 alibi_slopes=None, return_softmax=False, *, cu_seqlens=None, return_lse=True,
                 local_attention=None):
    """FP8 attention of q, k, v [batch, seqlen, heads, 128] (torch tensors of one dtype and
    device, any strides; bf16, or fp16 / fp32 cast to bf16), each batch row its own sequence, or
    with cu_seqlens (host ints over batch * seqlen packed tokens) those segments. Returns (out
    [batch, seqlen, heads, 128] in q's dtype, lse f32 [batch, heads, seqlen]) or out alone with
    return_lse=False. Only what the H3 DiT needs: non-causal, no dropout, window, softcap, ALiBi
    or softmax probabilities. Every argument is checked before any work (TypeError or
    ValueError naming it)."""
    checks.plain_attention(dropout_p, causal, window_size, softcap, alibi_slopes, return_softmax)
    want_lse = attention_checks.return_lse(return_lse)
    b, n, h = checks.forward_arrays(q, k, v)
    scale = attention_checks.softmax_scale(softmax_scale)
    checks.callable_or_none("local_attention", local_attention, ATTENTION_FORM)
    if cu_seqlens is not None:
        cu = checks.packed_seqlens(cu_seqlens, b * n)
    else:
        cu = tuple(i * n for i in range(b + 1))  # one segment per batch row
    d = q.shape[3]
    packed = [t.reshape(b * n, h, d).to(torch.bfloat16).contiguous() for t in (q, k, v)]
    res = (local_attention or default_attention)(*packed, cu, scale, want_lse)
    o, lse = res if want_lse else (res, None)
    o = o.view(b, n, h, d).to(q.dtype)
    if lse is None:
        return o
    return o, lse.view(h, b, n).transpose(0, 1).contiguous()
