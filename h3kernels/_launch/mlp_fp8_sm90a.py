"""The Hopper launches of minimax_h3_mlp_fp8 (mma form 3, sm_90a): the FC1 and FC2 GEMMs of
cuda_src/mlp_fp8_sm90a.cu on wgmma with TMA loads, and its y quantization kernel, with every
constant of that source and the TMA tensor maps the GEMMs take.

A caller opens an arrays.Call and makes its device current first (h3kernels/mlp_fp8.py does
both); h3kernels/_launch/mlp_fp8.py sends form 3 here.
"""
import functools
import os
from typing import NamedTuple

from h3kernels._launch.tma import tensor_map
from h3kernels._runtime import arrays, compiler
from h3kernels._runtime.arrays import data_ptr, strides_elems
from h3kernels._runtime.targets import sm_count
from h3kernels.constants import FC1_OUT, FFN, HIDDEN

ARCH = "sm_90a"  # wgmma and setmaxnreg exist only on the arch-specific target
ARCHS = (ARCH,)  # what compile_check builds this source for
FORM = 3  # fp8_mma_form of this family (h3kernels/_runtime/targets.py)

# cuda_src/mlp_fp8_sm90a.cu, built with exactly these (defines()):
BM = 128  # rows of an output tile: 2 consumer warpgroups x 64
BN = 256  # columns of an output tile (FC1: prepacked, 128 logical y columns); FFN and HIDDEN are multiples
BK = 128  # bytes of K per ring stage: one 128B-swizzled row, and the K span summed inside the tensor core
STAGES = 4  # TMA ring depth: 4 x 48 KiB
GROUP_M = 16  # tile groups per band of the persistent walk, so the tiles in flight share L2 operands
CLUSTER_M = 1  # CTAs per cluster; 2: pairs on vertically adjacent tiles, each loading half of B for both
# (multicast): correct, but 30% slower on the H200 (docs/hopper.md)
PROMOTE_N64 = 1  # 1: four 64-column partials in turn per slice, 0: two 128-column partials, one at a time
PROMOTE_K = BK  # K summed inside the tensor core per partial before its FP32 addition; 256 (two slices)
# is measured in bench/hopper_mlp.py (fewer additions, more error: other bits)
A_REGS = 0  # 1: A loaded once per slice into registers (ldmatrix) for the four quarters' wgmmas, which
# then read only B from shared memory; the same bits
PRODUCER_REGS = 24  # registers left to the TMA warpgroup (setmaxnreg.dec)
CONSUMER_REGS = 240  # registers of each wgmma warpgroup: 128 FP32 sums + 64 of partials + the rest
# (24 x 128 + 240 x 256 = 64512 of the SM's 65536; 232 spilled a few bytes with PROMOTE_N64)
# n8 blocks of a half tile whose global operands (FC1: column scales; FC2: residual, gate and
# column scales) an epilogue step loads before any of its arithmetic, so that their latencies
# overlap (16 spills 12 bytes in FC1, ptxas 13.0; 4 measured 1-2% slower: docs/hopper.md)
FAST_SILU = 1  # FC1's SiLU from the special-function unit's exp and reciprocal (measured: docs/hopper.md)
FC1_EPI_BLOCKS = 8
FC2_EPI_BLOCKS = 8
QUANT_THREADS = 256  # y quantization: threads per row (7 16-byte vectors each)
GEMM_THREADS = 384


def smem_bytes(d):
    """Dynamic shared memory of a GEMM CTA built with the constants d (defines()): the ring, plus
    room to align it to 1024 bytes."""
    return d["STAGES"] * (BM + BN) * d["BK"] + 1024


SMEM_BYTES = smem_bytes(dict(STAGES=STAGES, BK=BK))  # the default build's
DYNAMIC_SMEM = {"h3_mlp_fc1_wgmma": SMEM_BYTES, "h3_mlp_fc2_wgmma": SMEM_BYTES}

SPLIT_PARAMS = ("i32", "i32", "u64", "u64")  # whole tiles, parts per later tile, partials, counters
FC1_PARAMS = ("map",) * 2 + ("u64",) * 3 + ("i32",) + SPLIT_PARAMS  # map_a, map_w1, a_scale, w1_scale, y, M
# map_y_q, map_w2, y_scale, w2_scale, gate, its stride and rows, adaln_index, residual, out, M
FC2_PARAMS = ("map",) * 2 + ("u64",) * 3 + ("i64", "i64") + ("u64",) * 3 + ("i32",) + SPLIT_PARAMS
MIN_PART_SLICES = 4  # K slices of the shortest part of a split tile: the ring's depth keeps its loads ahead
QUANT_PARAMS = ("u64",) * 3  # y, y_q, y_scale


def defines(arch=ARCH, form=FORM, **variant):
    """The -D constants of cuda_src/mlp_fp8_sm90a.cu (one build: sm_90a, form 3); `variant`
    overrides some (bench/hopper_mlp.py compares builds)."""
    d = dict(BM=BM, BN=BN, BK=BK, STAGES=STAGES, GROUP_M=GROUP_M, CLUSTER_M=CLUSTER_M, PROMOTE_N64=PROMOTE_N64,
             PROMOTE_K=PROMOTE_K, A_REGS=A_REGS, PRODUCER_REGS=PRODUCER_REGS,
             CONSUMER_REGS=CONSUMER_REGS, FC1_EPI_BLOCKS=FC1_EPI_BLOCKS, FC2_EPI_BLOCKS=FC2_EPI_BLOCKS,
             FAST_SILU=FAST_SILU,
             QUANT_THREADS=QUANT_THREADS, HIDDEN=HIDDEN, FFN=FFN, FC1_OUT=FC1_OUT)
    d.update(variant)
    return d


_kernels = compiler.cache({})  # (device id, variant) -> (fc1, fc2, quant, resident CTAs, CLUSTER_M)


def set_constants(text):
    """Sets launch constants from "NAME=VALUE ..." in place of this module's, with the shared
    memory sizes that follow from them: a candidate build run through the operator, the tests and
    the benches before it becomes the default (set_constants_from_env). Call it before the first
    launch; loaded kernels and plans are forgotten."""
    global SMEM_BYTES
    names = defines()
    for item in text.split():
        name, _, value = item.partition("=")
        if name not in names or not value.lstrip("-").isdigit():
            raise ValueError(f"launch constant: got {item!r}; need NAME=INTEGER with NAME one of {sorted(names)}")
        globals()[name] = int(value)
    SMEM_BYTES = smem_bytes(defines())
    DYNAMIC_SMEM.update(h3_mlp_fc1_wgmma=SMEM_BYTES, h3_mlp_fc2_wgmma=SMEM_BYTES)
    _kernels.clear()
    _plan.cache_clear()


DEFINES_ENV = "H3KERNELS_MLP_SM90A_DEFINES"


def set_constants_from_env():
    """set_constants from $H3KERNELS_MLP_SM90A_DEFINES ("BK=64 PROMOTE_K=64 STAGES=9"), where it is
    set: how the test suite (tests/conftest.py) and bench/hopper_mlp.py run a candidate build."""
    text = os.environ.get(DEFINES_ENV, "")
    if text:
        set_constants(text)


def kernels(device_id, variant=()):
    """The three kernels on a device; `variant`: sorted (name, value) pairs overriding defines()."""
    g = _kernels.get((device_id, variant))
    if g is None:
        d = defines(**dict(variant))
        ident = ("nvrtc", "mlp_fp8_sm90a", tuple(sorted(d.items())))
        image = lambda: compiler.compile_cubin("mlp_fp8_sm90a", ARCH, d)[0]  # noqa: E731

        def load(name, params, smem=0):
            return compiler.load_kernel(ident, image, name, device_id, params, smem)

        fc1 = load("h3_mlp_fc1_wgmma", FC1_PARAMS, smem_bytes(d))
        fc2 = load("h3_mlp_fc2_wgmma", FC2_PARAMS, smem_bytes(d))
        quant = load("h3_mlp_y_quant", QUANT_PARAMS)
        cluster = d["CLUSTER_M"]
        slots = sm_count(device_id)
        if cluster > 1:  # pairs must sit on two SMs of one GPC: fewer may be resident than SMs / 2
            slots = min(slots, cluster * resident_clusters(fc1, cluster, slots))
        g = _kernels[(device_id, variant)] = (fc1, fc2, quant, slots, cluster)
    return g


def resident_clusters(kernel, cluster, sms):
    """How many clusters of `cluster` CTAs of `kernel` (one per SM) can be resident at once
    (cuOccupancyMaxActiveClusters); sms // cluster if the driver cannot say. A persistent grid
    larger than that would run its last clusters in a second wave."""
    try:
        from cuda.bindings import driver as cu

        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = cluster * (sms // cluster), 1, 1
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = GEMM_THREADS, 1, 1
        cfg.sharedMemBytes = kernel.smem
        cfg.numAttrs = 0  # the kernel's compile-time cluster dimensions apply
        err, n = cu.cuOccupancyMaxActiveClusters(cu.CUfunction(kernel.ptr), cfg)
        if err != cu.CUresult.CUDA_SUCCESS or n <= 0:
            return sms // cluster
        return min(int(n), sms // cluster)
    except Exception:  # an older cuda-bindings: the SM count is the upper bound
        return sms // cluster


def tile_groups(m, n_tiles, cluster):
    """Output tiles of a GEMM, counted in groups of `cluster` vertically adjacent tiles."""
    return -(-(-(-m // BM)) // cluster) * n_tiles


def work_split(groups, slots, slices, step=1):
    """(whole, parts): the persistent walk's work units (cuda_src/mlp_fp8_sm90a.cu, wgmma_gemm).
    With `slots` CTA groups resident, `groups` tiles run in ceil(groups / slots) waves, the last
    with r = groups % slots tiles while the other slots idle: those r tiles are split into
    parts = slots // r ranges of their `slices` K slices, so the last wave is about parts times
    shorter. No split where r is 0 or above slots / 2, or where a part would fall under
    MIN_PART_SLICES. Part boundaries fall on multiples of `step` slices (the kernel's K loop
    step), and every part gets at least one step: an empty part would wait for a slice that is
    never loaded."""
    r = groups % slots
    parts = min(slots // r, slices // MIN_PART_SLICES, slices // step) if r else 1
    return (groups - r, parts) if parts > 1 else (groups, 1)


def part_slices(d):
    """The kernel's PART_SLICES with the constants d: split parts' boundaries fall on multiples
    of it, which are whole steps of the K loop and 256 bytes of K in every build (so that builds
    of the same sums split a tile the same way)."""
    loop_step = (d["PROMOTE_K"] // d["BK"] if d["PROMOTE_N64"] else 1) * (2 if d["A_REGS"] == 2 else 1)
    return max(256 // d["BK"], loop_step)


def slice_bytes(variant):
    """BK of a build: the bytes of K per ring stage and TMA box row."""
    return dict(variant).get("BK", BK)


COUNTER_BYTES = 4
PARTIAL_BYTES = BM * BN * 4  # one part's FP32 sums of one tile
ALIGN = 256  # the partials' offset in the workspace


class Plan(NamedTuple):
    """The persistent walks of FC1 and FC2 (gemm 0 and 1) at one M on one device."""
    split: tuple  # per GEMM: (CTAs, whole tiles, parts of each later tile); parts 1: no split
    whole: tuple  # per GEMM: (CTAs, tiles, 1), every tile whole
    counter_bytes: int  # the head of the workspace, zero before a launch that splits
    workspace_bytes: int  # counters and partial sums, shared by the two GEMMs; 0: neither splits


def plan(device_id, m, variant=()):
    """The Plan of the two GEMMs at M rows on a device (work_split per GEMM)."""
    *_, slots, cluster = kernels(device_id, variant)
    return _plan(m, slots, cluster, variant)


@functools.lru_cache(maxsize=64)
def _plan(m, slots, cluster, variant):
    """plan() for `slots` resident CTAs in clusters of `cluster` (cached per M, as the scratch
    layouts are; set_constants clears it)."""
    d = defines(**dict(variant))
    split, whole, counters, partials = [], [], 0, 0
    for n_tiles, k in ((FC1_OUT // BN, HIDDEN), (HIDDEN // BN, FFN)):
        groups = tile_groups(m, n_tiles, cluster)
        done, parts = work_split(groups, slots // cluster, k // d["BK"], part_slices(d))
        units = done + (groups - done) * parts
        split.append((cluster * min(units, slots // cluster), done, parts))
        whole.append((cluster * min(groups, slots // cluster), groups, 1))
        if parts > 1:
            tiles = (groups - done) * cluster
            counters = max(counters, 2 * tiles * COUNTER_BYTES)
            partials = max(partials, tiles * parts * PARTIAL_BYTES)
    counters = -(-counters // ALIGN) * ALIGN
    return Plan(tuple(split), tuple(whole), counters, counters + partials if partials else 0)


def walk(call, m, gemm, variant, split, whole_tiles):
    """(CTAs, the GEMM kernel's four split parameters, an array to hold until the launch is
    queued) of FC1 (gemm 0) or FC2 (1). split: the workspace (an address, its counters zero), or
    None: the launch zeroes one of its own on the call's stream. whole_tiles: every tile whole
    (for measurements)."""
    p = plan(call.device_id, m, variant)
    ctas, whole, parts = p.split[gemm]
    if whole_tiles or parts == 1:
        ctas, whole, parts = p.whole[gemm]
        return ctas, (whole, 1, 0, 0), None
    held = None
    if split is None:
        held = workspace(call, m, variant)
        split = data_ptr(held)
    return ctas, (whole, parts, split + p.counter_bytes, split), held


def workspace(call, m, variant=()):
    """A split workspace for launches at M rows (plan().workspace_bytes, its counters zeroed on
    the call's stream, which every launch leaves zeroed), or None where neither GEMM splits: a
    bench makes one and passes its address to its launches instead of each launch making its own."""
    p = plan(call.device_id, m, variant)
    if not p.workspace_bytes:
        return None
    held = call.empty((p.workspace_bytes,), arrays.E4M3)
    call.zero(data_ptr(held), p.counter_bytes)
    return held


def launch_fc1(call, m, a_q, a_scale, w1_q, w1_scale, y, variant=(), split=None, whole_tiles=False):
    """y <- SwiGLU(FC1(a_q)) on the call's stream (a persistent grid: one CTA per SM at most),
    the last wave's tiles split over K as plan() says. Arguments are addresses; split and
    whole_tiles as in walk()."""
    fc1, _, _, _, cluster = kernels(call.device_id, variant)
    bk = slice_bytes(variant)
    maps = (tensor_map(a_q, m, HIDDEN, BM, bk), tensor_map(w1_q, FC1_OUT, HIDDEN, BN // cluster, bk))
    ctas, params, _held = walk(call, m, 0, variant, split, whole_tiles)
    fc1.launch(call.stream_ptr, (ctas, 1), GEMM_THREADS, (*maps, a_scale, w1_scale, y, m, *params))


def launch_y_quant(call, m, y, y_q, y_scale, variant=()):
    """y_q, y_scale <- the per-token e4m3 quantization of y (addresses), one CTA per row."""
    kernels(call.device_id, variant)[2].launch(call.stream_ptr, (m, 1), QUANT_THREADS, (y, y_q, y_scale))


def launch_fc2_gemm(call, m, y_q, y_scale, w2_q, w2_scale, gate, adaln_index, residual, out, variant=(),
                    split=None, whole_tiles=False):
    """out <- residual + gate * FC2(y_q) on the call's stream. gate is the table (its row stride
    and rows are parameters); split and whole_tiles as in walk(); the rest are addresses."""
    _, fc2, _, _, cluster = kernels(call.device_id, variant)
    bk = slice_bytes(variant)
    maps = (tensor_map(y_q, m, FFN, BM, bk), tensor_map(w2_q, HIDDEN, FFN, BN // cluster, bk))
    ctas, params, _held = walk(call, m, 1, variant, split, whole_tiles)
    fc2.launch(call.stream_ptr, (ctas, 1), GEMM_THREADS,
               (*maps, y_scale, w2_scale, data_ptr(gate), strides_elems(gate)[0], gate.shape[0], adaln_index,
                residual, out, m, *params))


def launch_fc2(call, m, y, y_q, y_scale, w2_q, w2_scale, gate, adaln_index, residual, out, variant=(),
               split=None):
    """y_q, y_scale <- quantize(y), then out <- residual + gate * FC2(y_q), on the call's stream."""
    launch_y_quant(call, m, y, y_q, y_scale, variant)
    launch_fc2_gemm(call, m, y_q, y_scale, w2_q, w2_scale, gate, adaln_index, residual, out, variant, split)
