"""The Hopper launch of minimax_h3_varlen_attention_fp8 (mma form 3, sm_90a): the kernel of
cuda_src/varlen_attention_fp8_sm90a.cu on wgmma with TMA loads, its build, its one parameter
struct and its three tensor maps (the caller's bf16 q, which the kernel quantizes itself; k8 and
v8t of the workspace). docs/kernels/attention_sm90.md describes the kernel.

The K and V quantization passes, the workspace and the plan are the mma.sync kernel's
(h3kernels/_launch/varlen_attention_fp8.py, whose _attend sends form 3 here, without the Q pass).
"""
import dataclasses
import functools
from typing import ClassVar

from h3kernels._launch import varlen_attention_fp8_plan as plan
from h3kernels._launch.tma import tensor_map
from h3kernels._runtime import compiler, launcher
from h3kernels._runtime.targets import sm_count
from h3kernels.constants import HEAD_DIM, K_BLOCK

SOURCE = "varlen_attention_fp8_sm90a"
ARCH = "sm_90a"  # wgmma and setmaxnreg exist only on the arch-specific target
ARCHS = (ARCH,)
KERNEL = "h3_varlen_attention_fp8_wgmma"

# The kernel's shape (cuda_src/varlen_attention_fp8_sm90a_layout.cuh takes these as -D constants)
BQ = plan.Q_TILE  # queries per work tile: two consumer warpgroups of 64 rows
BKV = 64  # keys per P fragment pair: half a ring stage
KSB = K_BLOCK  # keys per K scale block and per ring stage (one TMA box of K and of V^T)
HD = HEAD_DIM  # 128 e4m3 = one 128-byte swizzled row
STAGES = 4  # TMA ring depth: 4 x 32 KiB
THREADS = 128 * (1 + BQ // 64)  # the loading warpgroup and the two consumers
ONES_BYTES = 1024  # e4m3 1.0 in every byte: the B operand of each row's P . 1
OUT_STAGING = (BQ // 16) * 16 * (2 * HD + 16)  # 16 rows of out per consumer warp, 16 bytes of padding each
Q_STAGED = BQ * 2 * HD  # the tile's bf16 Q as TMA stages it, for the consumers to quantize
# the e4m3 Q tile, the ring, the ones tile, out's staging, the staged bf16 Q, room to align to 1024 bytes
SMEM_BYTES = BQ * HD + STAGES * 2 * KSB * HD + ONES_BYTES + OUT_STAGING + Q_STAGED + 1024
Q_ALIGN = 16  # TMA reads q from a 16-byte-aligned address

# The kernel's one __grid_constant__ parameter, AttentionParams: the maps, then the mma.sync
# kernel's parameters in its order less q8 and s_q (the kernel quantizes Q), k8, v8t and v_pitch
# (which the maps carry)
PARAMS = launcher.ParamStruct("AttentionParams", (
    ("map_q", "map"), ("map_k", "map"), ("map_v", "map"), ("tiles", "u64"), ("n_tiles", "i32"),
    ("s_k", "u64"), ("s_v", "u64"), ("out", "u64"), ("heads", "i32"),
    ("scale_log2", "f32"), ("lse", "u64"), ("q", "u64"), ("mu", "u64"), ("tokens", "i32"),
    ("softmax_scale", "f32"), ("q_bounds", "u64")))


@dataclasses.dataclass(frozen=True)
class AttentionBuild:
    """A build of cuda_src/varlen_attention_fp8_sm90a.cu. lse: the exact-l build, which also sums
    l in FP32 from the unrounded P for the lse (the contract defines it on that sum); out keeps
    its bits. A call that wants the lse runs it."""
    lse: bool = False
    kernels: ClassVar[tuple] = (KERNEL,)

    def defines(self):
        return dict(BQ=BQ, BKV=BKV, KSB=KSB, HD=HD, RING_STAGES=STAGES, TILE_INTS=plan.TILE_COLS,
                    EXACT_L=int(self.lse), H3_MMA_FORM=0)

    def kernel_params(self, name):
        return PARAMS

    def dynamic_smem(self, name):
        return SMEM_BYTES


BUILDS = {False: AttentionBuild(), True: AttentionBuild(lse=True)}  # by whether the call wants the lse


def shipped_builds(arch):
    """The builds of this source that ship for `arch`: both lse variants on sm_90a."""
    return (AttentionBuild(lse=False), AttentionBuild(lse=True)) if arch in ARCHS else ()


def maps(q, q_rows, k8, k_rows, v8t, heads, v_pitch):
    """(map_q, map_k, map_v): the tensor maps (128 bytes each) of the caller's bf16 q [q_rows,
    heads * 128] (boxes of 128 tokens x one head's 256 bytes, unswizzled), the workspace's k8
    [k_rows, heads * 128] (128 x 128-byte boxes: 128 tokens of one head) and v8t [heads * 128,
    v_pitch] (128 channels x 128 keys); rows past the end read as zeros."""
    pitch = heads * HD
    return (tensor_map(q, q_rows, 2 * pitch, BQ, 2 * HD), tensor_map(k8, k_rows, pitch, KSB),
            tensor_map(v8t, heads * HD, v_pitch, HD))


@functools.lru_cache(maxsize=256)
def launch_values(q_map, k8, v8t, k_rows, v_pitch, tiles, n_tiles, s_k, s_v, out, heads, scale_log2, lse, q, mu,
                  tokens, softmax_scale, q_bounds):
    """PARAMS of a launch, its maps those of q_map (q's bf16 values, `tokens` rows, at a
    Q_ALIGN-aligned address: q itself or an aligned copy), the workspace's k8 (k_rows) and v8t
    (v_pitch keys). A function of these numbers alone: a call that repeats them (the same buffers
    and segments every step) reuses the one struct, whose image the launcher keeps instead of
    packing it again."""
    map_q, map_k, map_v = maps(q_map, tokens, k8, k_rows, v8t, heads, v_pitch)
    return PARAMS(map_q=map_q, map_k=map_k, map_v=map_v, tiles=tiles, n_tiles=n_tiles, s_k=s_k, s_v=s_v, out=out,
                  heads=heads, scale_log2=scale_log2, lse=lse, q=q, mu=mu, tokens=tokens,
                  softmax_scale=softmax_scale, q_bounds=q_bounds)


def launch(call, n_tiles, build, values):
    """The kernel of `build` on the call's stream over n_tiles plan tiles, a persistent grid of at
    most one CTA per SM; values: PARAMS(...). Returns the LaunchRecord."""
    k = compiler.kernel(SOURCE, KERNEL, ARCH, build, call.device_id)
    return k.launch(call.stream_ptr, (min(n_tiles, sm_count(call.device_id)), 1), THREADS, values)
