"""CPU (torch) reference of both operators, exactly as docs/spec.md defines them.

It is the oracle of every numeric test, written for clarity, not speed. Its operators take the
GPU operators' arguments, names and checks (h3kernels._validate) on torch tensors of one device,
the CPU being where it is validated; its building blocks (mlp_row_stage, quantize_rows, ...)
take tensors as they come, on any device. The rounding steps and the weight preparation come
from h3kernels.quantize, which the GPU operators use too.

Where the contract allows any summation order, the RMSNorm sum of squares follows the row
kernel's (see sum_of_squares), so that a_q and a_scale compare bitwise. Nothing else before
a_q depends on an order.

    mlp_fp8.py                the MLP block, its row stage and weight preparation
    varlen_attention_fp8.py   the packed-varlen attention and its float64 yardstick
"""
from h3kernels.reference.mlp_fp8 import (exact_dot, fc1_swiglu, index_guard, minimax_h3_fc1_row_order,
                                         minimax_h3_mlp_fp8, minimax_h3_mlp_fp8_row_stage, mlp_exact_bf16,
                                         mlp_row_stage, prepare_minimax_h3_fc1_weight_fp8,
                                         prepare_minimax_h3_fc2_weight_fp8, rms_scale, sum_of_squares, swiglu_from_sums)
from h3kernels.quantize import F32, bf16, div, e4m3, quantize_rows
from h3kernels.reference.varlen_attention_fp8 import (attention_exact, attention_fp8, attention_fp8_partial,
                                                      key_mean, lse_exact, mean_shift,
                                                      minimax_h3_varlen_attention_fp8, quantize_attention_inputs,
                                                      segment_key_means)

__all__ = ["F32", "attention_exact", "attention_fp8", "attention_fp8_partial", "bf16", "div", "e4m3", "exact_dot",
           "fc1_swiglu", "index_guard", "key_mean", "lse_exact", "mean_shift", "minimax_h3_fc1_row_order",
           "minimax_h3_mlp_fp8", "minimax_h3_mlp_fp8_row_stage", "minimax_h3_varlen_attention_fp8", "mlp_exact_bf16",
           "mlp_row_stage", "prepare_minimax_h3_fc1_weight_fp8", "prepare_minimax_h3_fc2_weight_fp8",
           "quantize_attention_inputs", "quantize_rows", "rms_scale", "segment_key_means", "sum_of_squares",
           "swiglu_from_sums"]
