"""The CTA shapes of the attention's quantization passes, without Numba: the launch layer
(h3kernels/_launch/varlen_attention_fp8.py) sizes the grids from them, and
varlen_attention_fp8_quant.py compiles them into the kernels."""
from h3kernels.constants import HEAD_DIM, K_BLOCK

Q_WARPS = 8
Q_ROWS_PER_WARP = 8  # the loads of a warp's rows are all in flight before the first reduction
Q_ROWS_PER_CTA = Q_WARPS * Q_ROWS_PER_WARP
Q_THREADS = 32 * Q_WARPS
Q_WORDS = 2 * Q_ROWS_PER_WARP  # a global: Numba needs a literal shape
KV_THREADS = 128  # 4 warps; a lane holds a quad of channels (4 bf16 in 64 bits) of one key
KV_WARPS = KV_THREADS // 32
KEYS_PER_WARP = K_BLOCK // KV_WARPS  # in the K and V quantizers warp w takes keys w, w + 4, ...
BATCH = 16  # keys a kv_block_kernel lane has in flight at once
TILE_WORDS = HEAD_DIM // 4 + 1  # uint32 words per key row of v_quant's tile; +1 spreads column reads
