"""Both operators as torch.library custom ops, with fake (meta) implementations: torch.compile
(fullgraph=True) traces a block that calls them without graph breaks, and CUDA graphs capture
them: warm up once on the capturing stream first, and give the attention cu_seqlens_host
(reading cu_seqlens back would sync). A captured attention keeps using the quantized-operand
workspace of the stream it was captured on (kept alive for it): replay such graphs one after
another, not concurrently with each other or with eager attention calls on that stream.

    from h3kernels import torch_ops
    out = torch_ops.minimax_h3_mlp_fp8(x, ...)            # torch.ops.h3kernels.minimax_h3_mlp_fp8
    o = torch_ops.minimax_h3_varlen_attention_fp8(q, k, v, cu_seqlens, cu_seqlens_host)
    o, lse = torch_ops.minimax_h3_varlen_attention_fp8(q, k, v, cu_seqlens, cu_seqlens_host, return_lse=True)

They are the functional forms of the public operators (torch tensors only; no `out` and no
caller workspaces, so nothing an input shares is written). CuPy users call the operators in
h3kernels directly.
"""
from typing import List, Optional, Tuple

import torch

from h3kernels._validate.varlen_attention_fp8 import return_lse as _check_return_lse
from h3kernels.constants import HIDDEN


@torch.library.custom_op("h3kernels::minimax_h3_mlp_fp8", mutates_args=())
def minimax_h3_mlp_fp8(x: torch.Tensor, x_norm_weight: torch.Tensor, adaln_scale: torch.Tensor,
                       adaln_shift: torch.Tensor, adaln_index: torch.Tensor, gate: torch.Tensor,
                       residual: torch.Tensor, fc1_weight_q: torch.Tensor, fc1_weight_scale: torch.Tensor,
                       fc2_weight_q: torch.Tensor, fc2_weight_scale: torch.Tensor, eps: float = 1e-5,
                       fp8_mma_form: int = -1) -> torch.Tensor:
    from h3kernels.mlp_fp8 import minimax_h3_mlp_fp8 as op

    return op(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, gate, residual, fc1_weight_q,
              fc1_weight_scale, fc2_weight_q, fc2_weight_scale, eps=eps, fp8_mma_form=fp8_mma_form)


@minimax_h3_mlp_fp8.register_fake
def _mlp_fake(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, gate, residual, fc1_weight_q,
              fc1_weight_scale, fc2_weight_q, fc2_weight_scale, eps=1e-5, fp8_mma_form=-1):
    torch._check(x.dim() == 2 and x.shape[1] == HIDDEN, lambda: f"x: got shape {tuple(x.shape)}; need (M, {HIDDEN})")
    return x.new_empty((x.shape[0], HIDDEN), dtype=torch.bfloat16)


@torch.library.custom_op("h3kernels::minimax_h3_varlen_attention_fp8", mutates_args=())
def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
               cu_seqlens_host: Optional[List[int]] = None, softmax_scale: Optional[float] = None,
               fp8_mma_form: int = -1) -> torch.Tensor:
    from h3kernels.varlen_attention_fp8 import minimax_h3_varlen_attention_fp8 as op

    return op(q, k, v, cu_seqlens, cu_seqlens_host=cu_seqlens_host, softmax_scale=softmax_scale,
              fp8_mma_form=fp8_mma_form)


@_attention.register_fake
def _attention_fake(q, k, v, cu_seqlens, cu_seqlens_host=None, softmax_scale=None, fp8_mma_form=-1):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


# A custom op has one return type, so the (out, lse) form is an op of its own.
@torch.library.custom_op("h3kernels::minimax_h3_varlen_attention_fp8_lse", mutates_args=())
def _attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                   cu_seqlens_host: Optional[List[int]] = None, softmax_scale: Optional[float] = None,
                   fp8_mma_form: int = -1) -> Tuple[torch.Tensor, torch.Tensor]:
    from h3kernels.varlen_attention_fp8 import minimax_h3_varlen_attention_fp8 as op

    return op(q, k, v, cu_seqlens, cu_seqlens_host=cu_seqlens_host, softmax_scale=softmax_scale,
              fp8_mma_form=fp8_mma_form, return_lse=True)


@_attention_lse.register_fake
def _attention_lse_fake(q, k, v, cu_seqlens, cu_seqlens_host=None, softmax_scale=None, fp8_mma_form=-1):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32))


def minimax_h3_varlen_attention_fp8(q, k, v, cu_seqlens, cu_seqlens_host=None, softmax_scale=None, fp8_mma_form=-1,
                                    return_lse=False):
    """torch.ops.h3kernels.minimax_h3_varlen_attention_fp8 (returns out), or with return_lse=True
    torch.ops.h3kernels.minimax_h3_varlen_attention_fp8_lse (returns (out, lse), lse FP32
    [heads, tokens]): return_lse is a Python bool, fixed when torch.compile traces the call."""
    op = _attention_lse if _check_return_lse(return_lse) else _attention
    return op(q, k, v, cu_seqlens, cu_seqlens_host, softmax_scale, fp8_mma_form)
