"""torch's own bf16 attention over packed segments, the peer the demo and `python -m h3kernels
bench` time beside minimax_h3_varlen_attention_fp8 (bench/bench_attention.py times more backends)."""
import torch
import torch.nn.functional as F


def sdpa_bf16(q, k, v, cu_host):
    """out [tokens, heads, 128] by F.scaled_dot_product_attention: one batched call on
    [B, heads, L, 128] views when every segment has one length L, else one call per segment on
    [1, heads, L, 128] (3-D inputs would take the slow math path)."""
    lens = [b - a for a, b in zip(cu_host, cu_host[1:])]
    tokens, heads, d = q.shape
    if lens and len(set(lens)) == 1 and lens[0]:
        b, n = len(lens), lens[0]
        view = lambda t: t.view(b, n, heads, d).transpose(1, 2)
        return F.scaled_dot_product_attention(view(q), view(k), view(v)).transpose(1, 2).reshape(tokens, heads, d)
    out = torch.empty_like(q)
    for a, b in zip(cu_host, cu_host[1:]):
        if b > a:
            seg = lambda t: t[a:b].transpose(0, 1).unsqueeze(0)
            out[a:b] = F.scaled_dot_product_attention(seg(q), seg(k), seg(v))[0].transpose(0, 1)
    return out
