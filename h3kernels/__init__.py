"""h3kernels: hand-written FP8 CUDA kernels for the MiniMax-H3 diffusion transformer.

Public names follow docs/spec.md. CuPy and Numba are imported on first use, so
`import h3kernels` works without a GPU.
"""
from h3kernels.mlp_fp8 import (minimax_h3_mlp_fp8, minimax_h3_mlp_fp8_row_stage, prepare_minimax_h3_fc1_weight_fp8,
                      prepare_minimax_h3_fc2_weight_fp8)
from h3kernels.quantize import minimax_h3_fc1_row_order
from h3kernels.constants import FFN, HEAD_DIM, HIDDEN, MAX_M, fc2_flag_count

__version__ = "0.1.0"
__all__ = ["FFN", "HEAD_DIM", "HIDDEN", "MAX_M", "minimax_h3_fc1_row_order", "minimax_h3_mlp_fc2_flags",
           "minimax_h3_mlp_fp8", "minimax_h3_mlp_fp8_sm120",
           "minimax_h3_mlp_fc2_flags_sm120", "minimax_h3_mlp_fp8_row_stage", "prepare_minimax_h3_fc1_weight_fp8",
           "prepare_minimax_h3_fc2_weight_fp8"]

minimax_h3_mlp_fp8_sm120 = minimax_h3_mlp_fp8


def minimax_h3_mlp_fc2_flags(m):
    """Element count of workspace_flags for M rows (an int, 1 <= M <= MAX_M)."""
    from h3kernels._validate.mlp_fp8 import rows

    return fc2_flag_count(rows(m))


minimax_h3_mlp_fc2_flags_sm120 = minimax_h3_mlp_fc2_flags

from h3kernels.varlen_attention_fp8 import (minimax_h3_sm120_varlen_attention_fp8,  # noqa: E402
                                   minimax_h3_varlen_attention_fp8, minimax_h3_varlen_attention_fp8_partial,
                                   workspace_bytes)

__all__ += ["minimax_h3_varlen_attention_fp8", "minimax_h3_varlen_attention_fp8_partial",
            "minimax_h3_sm120_varlen_attention_fp8", "workspace_bytes"]
