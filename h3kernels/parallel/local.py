"""The attention each rank runs on its share: the GPU kernels on CUDA tensors, the reference
(h3kernels.reference) elsewhere. Callers may give their own callables of the same forms (tests
use the reference on the CPU; a peer kernel could be plugged in the same way)."""
import torch

from h3kernels import reference as R
from h3kernels.constants import E4M3_MAX, K_BLOCK
from h3kernels.quantize import div

# the forms of the callables a caller may give in place of the defaults (as checks name them)
ATTENTION_FORM = "(q, k, v, cu_seqlens, softmax_scale, return_lse)"
PARTIAL_FORM = "(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, k_mean, v_amax, k_scale)"


def default_attention(q, k, v, cu_seqlens, softmax_scale, return_lse):
    """Packed-varlen attention of q, k, v [tokens, heads, 128] over the segments of cu_seqlens
    (a tuple of ints): out, or (out, lse) with lse f32 [heads, tokens] of the true scores."""
    if q.is_cuda:
        from h3kernels.varlen_attention_fp8 import minimax_h3_varlen_attention_fp8

        cu_dev = torch.tensor(cu_seqlens, dtype=torch.int32, device=q.device)
        return minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, cu_seqlens_host=cu_seqlens,
                                               softmax_scale=softmax_scale, return_lse=return_lse)
    return R.attention_fp8(q, k, v, cu_seqlens, softmax_scale, return_lse=return_lse)


def default_partial_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, k_mean, v_amax, k_scale, *,
                              exact_lse=True):
    """Queries of segment i of q (cu_seqlens_q) against keys of segment i of k, v (cu_seqlens_k),
    K centred on the given whole-segment mean k_mean and V scaled by the whole segment's v_amax
    (f32 [segments, heads, 128]), K scaled per 128-key block (from each segment's first key in k,
    numbered segment after segment) by k_scale (f32 [blocks, heads]; None: each block's own
    amax): (out bf16, lse f32 [heads, q tokens]), lse -inf and out 0 where a segment has no keys
    here. The GPU kernel on CUDA tensors (kernel_partial_attention; exact_lse as its), the
    reference elsewhere (whose lse is always the true one)."""
    if q.is_cuda:
        return kernel_partial_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, k_mean, v_amax, k_scale,
                                        exact_lse=exact_lse)
    return reference_partial_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, k_mean, v_amax, k_scale)


def reference_partial_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, k_mean, v_amax, k_scale):
    """default_partial_attention by h3kernels.reference, on any device (on CUDA tensors: torch code,
    correct and slow)."""
    longest = max((b - a for a, b in zip(cu_seqlens_k, cu_seqlens_k[1:])), default=1)
    # query rows per chunk: FP32 scores of at most about 2 GiB at a time
    chunk = max(16, min(1024, (1 << 29) // max(1, q.shape[1] * longest)))
    if k_scale is not None:  # the reference takes a scale per key: each block's for all its keys
        keys = [min(K_BLOCK, b - f) for a, b in zip(cu_seqlens_k, cu_seqlens_k[1:]) for f in range(a, b, K_BLOCK)]
        k_scale = k_scale.repeat_interleave(torch.tensor(keys, dtype=torch.int64, device=k_scale.device), dim=0)
    return R.attention_fp8_partial(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, k_mean=k_mean, v_amax=v_amax,
                                   k_scale=k_scale, query_chunk=chunk)


def kernel_partial_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, k_mean, v_amax, k_scale, *,
                             exact_lse=True):
    """default_partial_attention by the GPU operator minimax_h3_varlen_attention_fp8_partial on
    CUDA tensors, V scaled by RN(v_amax / 448) as the V pass scales it. exact_lse=False: the lse
    of the sum out is divided by (the operator's), what a merge of outputs alone needs."""
    from h3kernels.varlen_attention_fp8 import minimax_h3_varlen_attention_fp8_partial

    amax = v_amax.to(torch.float32)
    v_scale = div(amax, E4M3_MAX).contiguous()  # RN(amax / 448), as the V pass
    if k_scale is not None:
        k_scale = k_scale.to(torch.float32).contiguous()
    return minimax_h3_varlen_attention_fp8_partial(q, k, v, tuple(cu_seqlens_q), tuple(cu_seqlens_k),
                                                   k_mean.to(torch.float32).contiguous(), v_scale, k_scale=k_scale,
                                                   softmax_scale=softmax_scale, exact_lse=exact_lse)
