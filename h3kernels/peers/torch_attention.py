"""torch's own bf16 attention over packed segments, the peer the demo and `python -m h3kernels
bench` time beside minimax_h3_varlen_attention_fp8 (bench/bench_attention.py times more backends,
through SegmentedSDPA)."""
import contextlib

import torch
import torch.nn.functional as F


class SegmentedSDPA:
    """F.scaled_dot_product_attention over the segments packed in q, k, v [tokens, heads, 128]: one
    batched call on [B, heads, L, 128] views when every segment has one length L, else one call per
    non-empty segment on [1, heads, L, 128] (3-D inputs would take the slow math path). contiguous:
    copy the views once, here, for backends that refuse strided inputs."""

    def __init__(self, q, k, v, cu_host, contiguous=False):
        lens = [b - a for a, b in zip(cu_host, cu_host[1:])]
        self.like = q
        tokens, heads, d = q.shape
        self.batched = bool(lens) and len(set(lens)) == 1 and lens[0] > 0
        if self.batched:
            b, n = len(lens), lens[0]
            view = lambda t: t.view(b, n, heads, d).transpose(1, 2)
            self.inputs = [(view(q), view(k), view(v))]
        else:
            self.spans = [(a, b) for a, b in zip(cu_host, cu_host[1:]) if b > a]
            seg = lambda t, a, b: t[a:b].transpose(0, 1).unsqueeze(0)
            self.inputs = [(seg(q, a, b), seg(k, a, b), seg(v, a, b)) for a, b in self.spans]
        if contiguous:
            self.inputs = [tuple(t.contiguous() for t in qkv) for qkv in self.inputs]

    def __call__(self, backend=None):
        """SDPA's own outputs, one per call, leaving packing to pack() so that timing this covers
        the attention only. backend: a torch.nn.attention.SDPBackend to pin, else torch's choice."""
        if backend is None:
            context = contextlib.nullcontext()
        else:
            from torch.nn.attention import sdpa_kernel

            context = sdpa_kernel(backend)
        with context:
            return [F.scaled_dot_product_attention(*qkv) for qkv in self.inputs]

    def pack(self, outputs):
        """__call__'s outputs as out [tokens, heads, 128]."""
        tokens, heads, d = self.like.shape
        if self.batched:
            return outputs[0].transpose(1, 2).reshape(tokens, heads, d)
        out = torch.empty_like(self.like)
        for (a, b), o in zip(self.spans, outputs):
            out[a:b] = o[0].transpose(0, 1)
        return out


def sdpa_bf16(q, k, v, cu_host):
    """out [tokens, heads, 128] by F.scaled_dot_product_attention, split as SegmentedSDPA splits it."""
    attention = SegmentedSDPA(q, k, v, cu_host)
    return attention.pack(attention())


def sdpa_backend_bf16(q, k, v, cu_host, backend):
    """A callable computing out as sdpa_bf16 does with one SDPA backend pinned (a
    torch.nn.attention.SDPBackend name: "CUDNN_ATTENTION", "FLASH_ATTENTION"), and its label; or
    None, label where torch refuses that backend on these inputs (checked by a call here). On
    strided views of q, k, v first; where the backend refuses those, on contiguous copies made
    once here (as the benches do), so that the backend named is the one timed."""
    from torch.nn.attention import SDPBackend

    label = {"CUDNN_ATTENTION": "cuDNN SDPA bf16", "FLASH_ATTENTION": "flash SDPA bf16"}.get(backend, backend)
    pinned = getattr(SDPBackend, backend)
    for contiguous in (False, True):
        attention = SegmentedSDPA(q, k, v, cu_host, contiguous=contiguous)
        try:
            attention(pinned)
        except RuntimeError:  # "No available kernel": this torch, GPU or input layout lacks that backend
            continue
        return (lambda: attention.pack(attention(pinned))), label
    return None, label
