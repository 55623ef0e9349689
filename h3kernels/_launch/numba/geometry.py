"""The CTA shapes of the attention's quantization passes, without Numba: the launch layer
(h3kernels/_launch/varlen_attention_fp8.py) sizes the grids from them, and
varlen_attention_fp8_quant.py compiles them into the kernels."""
from h3kernels.constants import HEAD_DIM, K_BLOCK

Q_WARPS = 8
Q_ROWS_PER_WARP = 8  # the loads of a warp's rows are all in flight before the first reduction
Q_ROWS_PER_CTA = Q_WARPS * Q_ROWS_PER_WARP
Q_THREADS = 32 * Q_WARPS
Q_WORDS = 2 * Q_ROWS_PER_WARP  # a global: Numba needs a literal shape
Q_PARTS = 32 // Q_ROWS_PER_WARP  # a row's amax: Q_PARTS lanes take 32 / Q_PARTS values each, then all lanes those
Q_RED_COLS = 33  # words per row of q_kernel's shared amaxes; 33 puts the lanes of a step in distinct banks
# a lane holds a quad of channels (4 bf16 in 64 bits) of one key
KV_WARPS = 4  # key blocks per kv_block_kernel CTA
KV_BLOCK_THREADS = 2 * 32 * KV_WARPS  # a K warp and a V warp per key block
BATCH = 16  # keys a kv_block_kernel lane has in flight at once
SEG_THREADS = 2 * HEAD_DIM  # kv_segment_kernel: a thread per (channel, K sum or V amax)
SEG_BATCH = 16  # block partials a kv_segment_kernel thread has in flight at once
QUANT_WARPS = 8  # K and V quantizers: a CTA per (key block, head), warp w takes keys w, w + 8, ...
QUANT_THREADS = 32 * QUANT_WARPS
KEYS_PER_WARP = K_BLOCK // QUANT_WARPS  # quads a lane holds in registers: 16 (32 registers)
RED_GROUPS = 16  # k_quant's amax: RED_GROUPS threads reduce RED_WIDTH values each, then all read those
RED_WIDTH = QUANT_THREADS // RED_GROUPS
RED_SIZE = QUANT_THREADS + RED_GROUPS  # a global: Numba needs a literal shape
TILE_WORDS = HEAD_DIM // 4 + 1  # uint32 words per key row of v_quant's tile; +1 spreads column reads
# The one-read K and V passes: a CTA per (segment, head) holds a segment of up to SEGMENT_BLOCKS key
# blocks in registers, each block in a quantizer CTA's layout (QUANT_THREADS threads of it)
SEGMENT_BLOCKS = 2
SEGMENT_KEYS = SEGMENT_BLOCKS * K_BLOCK
SEGMENT_THREADS = SEGMENT_BLOCKS * QUANT_THREADS
SEGMENT_WARPS = SEGMENT_BLOCKS * QUANT_WARPS
