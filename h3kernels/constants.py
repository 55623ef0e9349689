"""MiniMax-H3 sizes and the FC1 prepacked row order, shared by the kernels, the reference and the tests."""
import numpy as np

HIDDEN = 5376
FFN = 14336
FC1_OUT = 2 * FFN
HEAD_DIM = 128
K_BLOCK = 128  # attention: keys per K scale block, counted from the segment's start
H3_HEADS = 56
H3_BLOCKS = 50
MAX_M = 149796  # keeps M * FFN < 2**31
E4M3_MAX = 448.0

# Threads of the MLP row kernel's CTA. It fixes the RMSNorm summation order, which
# h3kernels.reference reproduces so that a_q compares bitwise.
ROW_THREADS = 192

# FC1 weights are prepacked in groups of 16 rows: 8 gate rows, then the 8 up rows of the
# same logical columns. Any FC1 tile whose width is a multiple of 16 therefore holds
# matching gate/up pairs, and in an m16n8 mma tile pair (2j, 2j+1) one thread holds
# gate and up of the same (row, column) in the same accumulator slot.
FC1_PAIR_GROUP = 8


def fc1_row_order_numpy():
    r = np.arange(FC1_OUT, dtype=np.int64)
    group, lane = r // (2 * FC1_PAIR_GROUP), r % (2 * FC1_PAIR_GROUP)
    logical = group * FC1_PAIR_GROUP + lane % FC1_PAIR_GROUP
    return logical + FFN * (lane >= FC1_PAIR_GROUP)


# FC2 flags (cuda_src/mlp_fp8.cu): one int32 that hands out row groups to the producer warps,
# then one per (128-row tile of y, 1024-column chunk of y) counting the groups quantized there.
FC2_FLAG_ROWS = 128
FC2_FLAG_COLS = 1024


def fc2_flag_count(m):
    return 1 + -(-int(m) // FC2_FLAG_ROWS) * (FFN // FC2_FLAG_COLS)
