"""Sequence-parallel attention over torch.distributed (NCCL on GPUs, gloo on the CPU) for packed
sequences spread over ranks by token ranges (docs/parallel.md):

    ulysses_attention   all-to-all to whole heads, the attention, all-to-all back: bitwise the
                        single-device result; heads must divide by the world size
    ring_attention      K/V blocks around the ring, partials merged by LSE in FP32; any head count
    attn_forward        the per-rank (out, lse) attention that xDiT / yunchang plug in

The MLP needs no communication: it is token-parallel (each rank runs its own token range with
the same weights; docs/parallel.md).
"""
from h3kernels.parallel.layout import local_seqlens, starts
from h3kernels.parallel.merge import LseMerge
from h3kernels.parallel.plug import attn_forward
from h3kernels.parallel.ring import ring_attention
from h3kernels.parallel.ulysses import ulysses_attention

__all__ = ["LseMerge", "attn_forward", "local_seqlens", "ring_attention", "starts", "ulysses_attention"]
