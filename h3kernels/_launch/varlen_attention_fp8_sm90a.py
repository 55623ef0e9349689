"""The Hopper launch of minimax_h3_varlen_attention_fp8 (mma form 3, sm_90a): the kernel of
cuda_src/varlen_attention_fp8_sm90a.cu on wgmma with TMA loads, with every constant of that
source and its three tensor maps (q8, k8, v8t of the workspace).

The quantization passes, the workspace and the plan are the mma.sync kernel's
(h3kernels/_launch/varlen_attention_fp8.py, whose _attend sends form 3 here).
"""
import contextlib

from h3kernels._launch import varlen_attention_fp8_plan as plan
from h3kernels._launch.tma import tensor_map
from h3kernels._runtime import compiler
from h3kernels._runtime.targets import sm_count
from h3kernels.constants import HEAD_DIM, K_BLOCK

ARCH = "sm_90a"  # wgmma and setmaxnreg exist only on the arch-specific target
ARCHS = (ARCH,)  # what compile_check builds this source for
FORM = 3  # fp8_mma_form of this family (h3kernels/_runtime/targets.py)

# cuda_src/varlen_attention_fp8_sm90a.cu, built with exactly these (defines()):
CONSUMERS = 2  # softmax warpgroups of 64 query rows each; 3 (measured, not shipped): 192-query
# tiles, 160 registers a consumer, which only the block loop with O in the tensor core fits
BQ = plan.Q_TILE  # queries per work tile: 2 consumer warpgroups x 64 rows
Q_REGS = 0  # 1 (measured, not shipped): the S128 loops' S takes Q from registers (loaded once a tile
# by ldmatrix), the register-A wgmma, instead of reading it from shared memory in every S
BKV = 64  # keys per softmax block, as the mma.sync kernel's (the same running max, the same P)
KSB = K_BLOCK  # keys per K scale block, and per ring stage (one TMA box of K and of V^T)
HD = HEAD_DIM  # 128 e4m3 = one 128-byte swizzled row
STAGES = 4  # TMA ring depth: 4 x 32 KiB
TILE_INTS = plan.TILE_COLS
PRODUCER_REGS = 24  # registers left to the TMA warpgroup (setmaxnreg.dec)
CONSUMER_REGS = 240  # registers of each softmax warpgroup: 64 of O, 64 of a P V partial, 64 of S
# (32 in the block loop), two P fragments
OVERLAP = 0  # 1: each block's softmax runs while the previous block's P V is in the tensor core
# (the same arithmetic, bitwise the same result); 0: S, softmax, P V of each block in turn (both
# with S128 0, the block loop)
PINGPONG = 0  # with OVERLAP 1 or S128: the two consumer warpgroups take turns issuing their
# wgmmas (named barriers), so that one's softmax runs while the other's matrix products do
S128 = 1  # 1 or 2: S of a whole 128-key stage in one wgmma group, its two 64-key halves taken in
# order (the same arithmetic, bitwise the same result), the stage's wgmmas software-pipelined
# (1: the high half's P V, then the next S; 2: the next S, then the high half's P V, which runs
# under the next low half's softmax); 0: one 64-key block at a time (OVERLAP's schedules,
# S_SPLIT's). 1 took 0.79x 0's kernel time on the H200 (docs/hopper.md)
S_SPLIT = 1  # S of a block with 128 / S_SPLIT of the head dimension summed inside the tensor core
# (1: all 128; 2: two k64 halves; 4: each k32 step alone), the partials added in FP32 (the FP8
# wgmma drops bits at every in-core step: docs/hopper.md has the error of each and its cost)
ONE_BLOCK_SYNC = 1  # 1: a segment of one 64-key block computes S with mma.sync (form 0's S, bit
# for bit), since there the reference's P grid holds the output to 0.005, which S summed in the
# FP8 tensor cores misses on some sets; longer segments (bound 0.03) keep wgmma
FOLD_256 = 1  # 1: P's 2^8 bias in ex2's argument (2^(S - (m - 8))) instead of a multiplication of
# each probability: one instruction less per score, P from an argument within an FP32 rounding of
# the unfolded one (so other bits than 0); 0 is measured in ACCUMULATION
FOLD_SCALE = 1  # 1 (needs L_IN_CORE): each score's scaling to log2 units and its subtraction of
# the running max in one FFMA, the block maximum taken on the unscaled scores: one instruction
# less per score, one rounding less (other bits than 0). The FFMA leaves the maximum's own
# argument the rounding error of its product, up to half an ulp of m: the subtracted max lies a
# margin |m| 2^-22 lower, so that for huge scores (queries scaled by 1e30) the maximum's P
# saturates to 448 instead of 0 (NaN rows without the margin), which l from the rounded P follows.
# One-block tiles (P on the reference's grid) keep the unfolded arithmetic. docs/hopper.md
STAGE_MAX = 1  # 1: one running-max update per 128-key stage (both 64-key halves' P against the
# stage's max, both halves' P V onto one accumulator, O and l rescaled once a stage): other P than
# the 64-key blocks' (other bits than 0), within the bounds with the same error against exact
# attention (docs/hopper.md). Only the S128 1 loop with MAX_AHEAD has it: a build that asks for
# another loop, or for O_IN_CORE, gets 0 unless it names STAGE_MAX (defines())
PROMOTE_STAGES = 8  # with STAGE_MAX: the P V partial runs on in the tensor core for this many
# stages (1024 keys), rescaled in registers only in a warp whose max moved, then joins the FP32 O;
# 0: O takes each stage's partial (a multiply-add per element and stage). Chains bounded to 1024
# keys keep the error of long segments at the 64-key partials' (O_IN_CORE's grows with the length)
O_IN_CORE = 0  # 1, 2 (measured, not shipped): P V accumulated onto O in the tensor core (docs/hopper.md)
L_IN_CORE = 1  # 1: each row's sum l from the tensor core (P . 1 beside each block's P V, an m64n8
# wgmma on a tile of ones) in place of 32 FP32 additions per block and thread: l then sums the
# rounded P, not the unrounded one; a one-block tile (P on the reference's grid) keeps the additions
EXACT_L = 0  # 1 (with L_IN_CORE): the loop also sums l in FP32 from the unrounded P, for the lse
# alone (O still divides by the tensor core's sum, so out keeps its bits): launch() takes this
# build for a call that wants the lse, which the contract defines on the unrounded sum
MAX_TREE = 1  # 1: each row's block maximum as a tree of fmaxf (4 dependent steps, not 16); exact
# either way, so the same maximum and the same result
MAX_AHEAD = 1  # 1: the S128 loop takes both 64-key halves' maxima before either half's P, so that
# their reductions and shuffles overlap (the same maxima in the same order: the same result)
STAGED_OUT = 1  # 1: the epilogue's stores of out go through shared memory and leave as whole rows,
# 16 bytes a lane (the fragment's own 4-byte stores touch 8 rows per warp instruction); the same
# values: STAGED_OUT 0 is in VARIANTS
BLOCK_MAX = (("STAGE_MAX", 0),)  # the default loop with a max per 64-key block (the other loops' arithmetic)
# VARIANTS: other schedules of the same arithmetic (bitwise the result of bitwise_peer(variant):
# the default, or for the loops without the stage max BLOCK_MAX, the default's 64-key maxima), none of them
# serialized by a ptxas we build with (12.8, the cuda12 extra's, and 12.9): their pipelined loops
# issue every wgmma on every path (one issued under a condition while others were in flight had
# ptxas serialize them all: C7513 in the OVERLAP builds under 12.8, C7515 in the S128 builds;
# a stand-in with P = 0 or an unread S takes its place). ACCUMULATION: other S sums, P roundings or O sums
# (so other bits), measured for their error and time. bench/hopper_attention.py checks and times both;
# tests/test_varlen_attention_fp8_sm90a.py builds both (no spills, no serialized wgmma, no wgmma
# register touched in flight). docs/hopper.md has the figures.
VARIANTS = ((("MAX_TREE", 0),), (("MAX_AHEAD", 0),), (("STAGES", 2),), (("PINGPONG", 1),), (("S128", 2),),
            (("PINGPONG", 1), ("S128", 2)), (("S128", 0),), (("OVERLAP", 1), ("S128", 0)),
            (("OVERLAP", 1), ("PINGPONG", 1), ("S128", 0)),
            (("MAX_TREE", 0), ("OVERLAP", 1), ("PINGPONG", 1), ("S128", 0)), (("EXACT_L", 1),),
            (("STAGED_OUT", 0),), (("Q_REGS", 1), ("STAGE_MAX", 0)))  # Q_REGS spills 16 bytes beside the stage max
ACCUMULATION = ((("FOLD_256", 0),), (("FOLD_SCALE", 0),), (("FOLD_SCALE", 0), ("L_IN_CORE", 0)),
                (("FOLD_SCALE", 0), ("L_IN_CORE", 0), ("O_IN_CORE", 1)),
                (("FOLD_SCALE", 0), ("L_IN_CORE", 0), ("O_IN_CORE", 2)),
                (("FOLD_SCALE", 0), ("L_IN_CORE", 0), ("ONE_BLOCK_SYNC", 0)), (("S128", 0), ("S_SPLIT", 4)),
                (("FOLD_SCALE", 0), ("L_IN_CORE", 0), ("ONE_BLOCK_SYNC", 0), ("S128", 0), ("S_SPLIT", 2)),
                (("FOLD_SCALE", 0), ("L_IN_CORE", 0), ("ONE_BLOCK_SYNC", 0), ("S128", 0), ("S_SPLIT", 4)),
                (("CONSUMERS", 3), ("O_IN_CORE", 2), ("S128", 0)),
                (("CONSUMERS", 3), ("O_IN_CORE", 2), ("OVERLAP", 1), ("S128", 0)), BLOCK_MAX,
                (("PROMOTE_STAGES", 0),), (("O_IN_CORE", 2), ("STAGE_MAX", 1)))
ONES_BYTES = 1024


def bitwise_peer(variant):
    """The build whose bits a schedule of VARIANTS gives: the default where it keeps the default's
    stage max and chains, else BLOCK_MAX."""
    keys = ("STAGE_MAX", "PROMOTE_STAGES")
    return () if all(defines(**dict(variant))[k] == defines()[k] for k in keys) else BLOCK_MAX


def shape(consumers=CONSUMERS):
    """(queries per tile, threads, dynamic shared memory bytes) of a build with that many consumer
    warpgroups: the Q tile, the ring, the ones tile, out's staging (STAGED_OUT: 16 rows of out
    per consumer warp, 16 bytes of padding each; also in the builds without it: one size), room
    to align."""
    bq = 64 * consumers
    staging = 4 * consumers * 16 * (2 * HD + 16)
    return bq, 128 * (1 + consumers), bq * HD + STAGES * 2 * KSB * HD + ONES_BYTES + staging + 1024


_, THREADS, SMEM_BYTES = shape()
REGS = {2: (PRODUCER_REGS, CONSUMER_REGS), 3: (24, 160)}  # setmaxnreg per consumer count: at most 65536 in all
DYNAMIC_SMEM = {"h3_varlen_attention_fp8_wgmma": SMEM_BYTES}
# map_q, map_k, map_v, tiles, n_tiles, block_offset, s_q, s_k, s_v, out, heads, scale_log2, lse
# (0: not wanted), q, mu, tokens, softmax_scale, q_bounds
PARAMS = ("map",) * 3 + ("u64", "i32", "u64", "u64", "u64", "u64", "u64", "i32", "f32", "u64", "u64", "u64", "i32",
                         "f32", "u64")


def defines(arch=ARCH, form=FORM, **variant):
    """The -D constants of cuda_src/varlen_attention_fp8_sm90a.cu (one build: sm_90a, form 3)."""
    d = dict(BKV=BKV, KSB=KSB, HD=HD, STAGES=STAGES, TILE_INTS=TILE_INTS, OVERLAP=OVERLAP, PINGPONG=PINGPONG, S128=S128,
             MAX_TREE=MAX_TREE, MAX_AHEAD=MAX_AHEAD, S_SPLIT=S_SPLIT, ONE_BLOCK_SYNC=ONE_BLOCK_SYNC,
             FOLD_256=FOLD_256, FOLD_SCALE=FOLD_SCALE, STAGE_MAX=STAGE_MAX, PROMOTE_STAGES=PROMOTE_STAGES,
             O_IN_CORE=O_IN_CORE, L_IN_CORE=L_IN_CORE, EXACT_L=EXACT_L,
             STAGED_OUT=STAGED_OUT, CONSUMERS=CONSUMERS, Q_REGS=Q_REGS, H3_MMA_FORM=0)
    d.update(variant)
    # the stage max lives in the S128 1 loop with MAX_AHEAD; the builds that ask for another loop
    # or for O in the tensor core keep the 64-key maxima they were measured with unless they name it
    if "STAGE_MAX" not in variant and (d["S128"] != 1 or not d["MAX_AHEAD"] or d["O_IN_CORE"]
                                       or d.get("DBG_PERF", 0) & 18):
        d["STAGE_MAX"] = 0
    if "PROMOTE_STAGES" not in variant and (not d["STAGE_MAX"] or d["O_IN_CORE"]):
        d["PROMOTE_STAGES"] = 0
    producer, consumer = REGS[d["CONSUMERS"]]  # the tile and the registers follow the consumer count
    d.setdefault("BQ", shape(d["CONSUMERS"])[0])
    d.setdefault("PRODUCER_REGS", producer)
    d.setdefault("CONSUMER_REGS", consumer)
    return d


_kernels = compiler.cache({})  # (device id, variant) -> (kernel, SMs, threads)


def attention_kernel(device_id, variant=()):
    """(the kernel on a device, the SMs, its threads); `variant`: sorted (name, value) pairs
    overriding defines()."""
    k = _kernels.get((device_id, variant))
    if k is None:
        d = defines(**dict(variant))
        ident = ("nvrtc", "varlen_attention_fp8_sm90a", tuple(sorted(d.items())))
        image = lambda: compiler.compile_cubin("varlen_attention_fp8_sm90a", ARCH, d)[0]  # noqa: E731
        _, threads, smem = shape(d["CONSUMERS"])
        f = compiler.load_kernel(ident, image, "h3_varlen_attention_fp8_wgmma", device_id, PARAMS, smem)
        k = _kernels[(device_id, variant)] = (f, sm_count(device_id), threads)
    return k


def maps(q8, q_rows, k8, k_rows, v8t, heads, v_pitch, q_tile=BQ):
    """The three tensor maps (128 bytes each) of the workspace's q8 [q_rows, heads * 128] and
    k8 [k_rows, heads * 128] (128 x 128-byte boxes: 128 tokens of one head) and v8t [heads * 128,
    v_pitch] (128 channels x 128 keys); rows past the end read as zeros."""
    pitch = heads * HD
    return (tensor_map(q8, q_rows, pitch, q_tile), tensor_map(k8, k_rows, pitch, KSB),
            tensor_map(v8t, heads * HD, v_pitch, HD))


LSE_VALUE = 9  # values[LSE_VALUE] in launch(): the lse pointer (0: not wanted)
_build = [()]  # the variant of launches given none (use_build)


@contextlib.contextmanager
def use_build(variant):
    """Within the block, launches given no variant take `variant` (sorted (name, value) pairs
    overriding defines()): tests and benches run other builds through the operator."""
    previous, _build[0] = _build[0], tuple(variant)
    try:
        yield
    finally:
        _build[0] = previous


def build(variant=None):
    """The variant a launch runs: `variant`, else use_build's."""
    return _build[0] if variant is None else variant


def parse_variant(text):
    """The variant of "NAME=VALUE[,NAME=VALUE ...]" (the benches' --builds): sorted (name, value)
    pairs, as use_build and launch take them."""
    return tuple(sorted((k, int(v)) for k, v in (kv.split("=") for kv in text.split(","))))


def q_tile(variant=None):
    """Queries per plan tile of the build a launch runs (build(variant))."""
    return shape(dict(build(variant)).get("CONSUMERS", CONSUMERS))[0]


def launch(call, n_tiles, the_maps, values, variant=None):
    """The kernel on the call's stream over n_tiles plan tiles, a persistent grid of at most one
    CTA per SM. values: the parameters after the maps (PARAMS); variant: build(variant). A call
    that wants the lse runs the EXACT_L build of that variant."""
    variant = build(variant)
    if values[LSE_VALUE] and dict(variant).get("L_IN_CORE", L_IN_CORE):  # else l is in FP32 already
        variant = tuple(sorted({**dict(variant), "EXACT_L": 1}.items()))
    f, sms, threads = attention_kernel(call.device_id, variant)
    f.launch(call.stream_ptr, (min(n_tiles, sms), 1), threads, (*the_maps, *values))
