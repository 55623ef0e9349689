"""The Hopper launches of minimax_h3_mlp_fp8 (mma form 3, sm_90a): the FC1 and FC2 GEMMs of
cuda_src/mlp_fp8_sm90a.cu on wgmma with TMA loads, and its y quantization kernel.

A build is a value (MlpBuild: the source's constants, its kernels' parameter structs and shared
memory); the shipped one is MlpBuild(). A caller opens an arrays.Call and makes its device
current first (h3kernels/mlp_fp8.py does both); h3kernels/_launch/mlp_fp8.py sends form 3 here.
Every launch function returns the LaunchRecord(s) of its launches.
"""
import dataclasses
import functools
from typing import ClassVar, NamedTuple

from h3kernels._launch.tma import tensor_map
from h3kernels._runtime import arrays, compiler
from h3kernels._runtime.arrays import data_ptr, strides_elems
from h3kernels._runtime.launcher import ParamStruct
from h3kernels._runtime.targets import sm_count
from h3kernels.constants import FC1_OUT, FFN, HIDDEN

SOURCE = "mlp_fp8_sm90a"
ARCH = "sm_90a"  # wgmma and setmaxnreg exist only on the arch-specific target
ARCHS = (ARCH,)  # what compile_check builds this source for
FC1, FC2, QUANT = "h3_mlp_fc1_wgmma", "h3_mlp_fc2_wgmma", "h3_mlp_y_quant"  # the GEMMs' stems

# The tile geometry the warpgroup roles are written for (the source asserts it):
BM = 128  # rows of an output tile: 2 consumer warpgroups x 64
BK = 128  # bytes of K per ring stage: one 128B-swizzled row, and the K span summed inside the tensor core
GEMM_THREADS = 384  # a producer warpgroup and two consumer warpgroups
# Output tile widths (columns; FC1's prepacked, half as many y columns) each GEMM is instantiated
# for, the widest first: the plan takes a narrower one only where the widest would leave much of
# the last wave idle (tile_width). A slice in 4 quarters of 64 columns or 2 halves of 112;
# FC1_OUT and HIDDEN are multiples of both widths.
WIDTHS = (256, 224)
NARROWER_GAIN = 0.95  # a narrower width must shorten the estimated makespan at least this much


def gemm_kernel(stem, width):
    """The entry of GEMM `stem` (FC1 or FC2) at tile width `width`."""
    return f"{stem}_n{width}"


_GEMMS = {gemm_kernel(stem, w): (stem, w) for stem in (FC1, FC2) for w in WIDTHS}

# The kernels' one parameter each, mirroring the structs of cuda_src/mlp_fp8_sm90a.cu: the
# positional parameters they replaced, in that order, so every field kept its offset.
_SPLIT = (("split_whole", "i32"), ("split_parts", "i32"), ("partials", "u64"), ("counters", "u64"))
_PARAMS = {
    FC1: ParamStruct("Fc1Params", (("map_a", "map"), ("map_w1", "map"), ("a_scale", "u64"), ("w1_scale", "u64"),
                                   ("y", "u64"), ("M", "i32"), *_SPLIT)),
    FC2: ParamStruct("Fc2Params", (("map_y_q", "map"), ("map_w2", "map"), ("y_scale", "u64"), ("w2_scale", "u64"),
                                   ("gate", "u64"), ("gate_stride", "i64"), ("gate_rows", "i64"),
                                   ("adaln_index", "u64"), ("residual", "u64"), ("out", "u64"), ("M", "i32"),
                                   *_SPLIT)),
    QUANT: ParamStruct("QuantParams", (("y", "u64"), ("y_q", "u64"), ("y_scale", "u64"))),
}
_PARAMS.update({name: _PARAMS[stem] for name, (stem, _) in _GEMMS.items()})


@dataclasses.dataclass(frozen=True)
class MlpBuild:
    """A build of cuda_src/mlp_fp8_sm90a.cu; the defaults are the one that ships."""
    stages: int = 4  # TMA ring depth: 4 x 48 KiB (44 KiB at 224 columns)
    group_m: int = 16  # m-tiles per band of the persistent walk, so the tiles in flight share L2 operands
    producer_regs: int = 24  # registers left to the TMA warpgroup (setmaxnreg.dec)
    # registers of each wgmma warpgroup: 128 FP32 sums + 64 of partials + the rest
    # (24 x 128 + 240 x 256 = 64512 of the SM's 65536; 232 spilled a few bytes)
    consumer_regs: int = 240
    # n8 blocks of a half tile whose global operands (FC1: column scales; FC2: residual, gate and
    # column scales) an epilogue step loads before any of its arithmetic, so that their latencies
    # overlap (16 spills 12 bytes in FC1, ptxas 13.0; 4 measured 1-2% slower: docs/kernels/mlp_sm90.md)
    fc1_epi_blocks: int = 8
    fc2_epi_blocks: int = 8
    quant_threads: int = 256  # y quantization: threads per row (7 16-byte vectors each)
    # both GEMMs' tile width, one of WIDTHS, for measurements; 0 (shipped): the plan's per GEMM and M
    tile_width: int = 0

    kernels: ClassVar[tuple] = (*_GEMMS, QUANT)

    def defines(self):
        """The -D constants of the source (H3_ and the names of its constants)."""
        d = dict(BM=BM, BK=BK, STAGES=self.stages, GROUP_M=self.group_m, PRODUCER_REGS=self.producer_regs,
                 CONSUMER_REGS=self.consumer_regs, FC1_EPI_BLOCKS=self.fc1_epi_blocks,
                 FC2_EPI_BLOCKS=self.fc2_epi_blocks, QUANT_THREADS=self.quant_threads, HIDDEN=HIDDEN, FFN=FFN,
                 FC1_OUT=FC1_OUT)
        return {f"H3_{k}": v for k, v in d.items()}

    def kernel_params(self, name):
        return _PARAMS[name]

    def dynamic_smem(self, name):
        """A GEMM CTA's ring, plus room to align it to 1024 bytes; the quantization needs none."""
        return self.stages * (BM + _GEMMS[name][1]) * BK + 1024 if name in _GEMMS else 0


SHIPPED = MlpBuild()


def shipped_builds(arch):
    """The builds of this source that ship for `arch`: the one."""
    return (SHIPPED,) if arch in ARCHS else ()


def kernel(device_id, name, build=SHIPPED):
    return compiler.kernel(SOURCE, name, ARCH, build, device_id)


MIN_PART_SLICES = 4  # K slices of the shortest part of a split tile: the ring's depth keeps its loads ahead
PART_SLICES = 256 // BK  # split parts' boundaries fall on multiples of this many slices (the source's)


def work_split(tiles, slots, slices, step=PART_SLICES):
    """(whole, parts): the persistent walk's work units (cuda_src/mlp_fp8_sm90a_gemm.cuh). With
    `slots` CTAs resident, `tiles` tiles run in ceil(tiles / slots) waves, the last with
    r = tiles % slots tiles while the other slots idle: those r tiles are split into
    parts = slots // r ranges of their `slices` K slices, so the last wave is about parts times
    shorter. No split where r is 0 or above slots / 2, or where a part would fall under
    MIN_PART_SLICES. Part boundaries fall on multiples of `step` slices, and every part gets at
    least one step: an empty part would wait for a slice that is never loaded."""
    r = tiles % slots
    parts = min(slots // r, slices // MIN_PART_SLICES, slices // step) if r else 1
    return (tiles - r, parts) if parts > 1 else (tiles, 1)


def makespan(m, n, slices, slots, width):
    """The busiest CTA's work, in K slices of 256-column tiles, when `slots` CTAs walk the
    M x n output in BM x width tiles of `slices` K slices each, split as work_split says: whole
    waves, then at most one part of a split tile per CTA (units are dealt round-robin)."""
    tiles = -(-m // BM) * (n // width)
    whole, parts = work_split(tiles, slots, slices)
    if parts == 1:
        busiest = -(-tiles // slots) * slices
    else:
        steps = slices // PART_SLICES
        longest = max((p + 1) * steps // parts - p * steps // parts for p in range(parts))
        busiest = whole // slots * slices + PART_SLICES * longest
    return busiest * width / 256


def tile_width(m, n, slices, slots):
    """The GEMM's tile width at M rows: the widest of WIDTHS unless a narrower one shortens the
    busiest CTA's work (makespan) by NARROWER_GAIN. At M = 256 on 132 SMs, FC1 in 256-column
    tiles runs 224 tiles in two waves, the second 92 wide; in 224-column tiles 256 tiles, the
    second wave 124 wide: 0.875x the makespan."""
    best = WIDTHS[0]
    for width in WIDTHS[1:]:
        if makespan(m, n, slices, slots, width) <= NARROWER_GAIN * makespan(m, n, slices, slots, best):
            best = width
    return best


COUNTER_BYTES = 4
ALIGN = 256  # the partials' offset in the workspace


def partial_bytes(width):
    """One part's FP32 sums of one tile."""
    return BM * width * 4


class Plan(NamedTuple):
    """The persistent walks of FC1 and FC2 (gemm 0 and 1) at one M on one device."""
    split: tuple  # per GEMM: (CTAs, whole tiles, parts of each later tile); parts 1: no split
    counter_bytes: int  # the head of the workspace, zero before a launch that splits
    workspace_bytes: int  # counters and partial sums, shared by the two GEMMs; 0: neither splits
    width: tuple  # per GEMM: its tile width (tile_width)


def plan(device_id, m, width=0):
    """The Plan of the two GEMMs at M rows on a device (work_split per GEMM); width: both GEMMs'
    tile width (0: tile_width's choice for each)."""
    return plan_for(m, sm_count(device_id), width)


@functools.lru_cache(maxsize=64)
def plan_for(m, slots, width=0):
    """plan() with `slots` CTAs resident, one per SM (cached per M, as the scratch layouts are)."""
    if width not in (0, *WIDTHS):
        raise ValueError(f"tile width: got {width}, need one of {WIDTHS} (or 0: the plan's)")
    split, widths, counters, partials = [], [], 0, 0
    for n, k in ((FC1_OUT, HIDDEN), (HIDDEN, FFN)):
        w = width or tile_width(m, n, k // BK, slots)
        tiles = -(-m // BM) * (n // w)
        whole, parts = work_split(tiles, slots, k // BK)
        units = whole + (tiles - whole) * parts
        split.append((min(units, slots), whole, parts))
        widths.append(w)
        if parts > 1:
            counters = max(counters, 2 * (tiles - whole) * COUNTER_BYTES)
            partials = max(partials, (tiles - whole) * parts * partial_bytes(w))
    counters = -(-counters // ALIGN) * ALIGN
    return Plan(tuple(split), counters, counters + partials if partials else 0, tuple(widths))


def walk(call, m, gemm, split, width=0):
    """(CTAs, tile width, the GEMM's SplitK fields (split_whole, split_parts, partials,
    counters), an array to hold until the launch is queued) of FC1 (gemm 0) or FC2 (1). split:
    the workspace (an address, its counters zero), or None: the launch zeroes one of its own on
    the call's stream. width: as plan()'s."""
    p = plan(call.device_id, m, width)
    ctas, whole, parts = p.split[gemm]
    if parts == 1:
        return ctas, p.width[gemm], (whole, 1, 0, 0), None
    held = None
    if split is None:
        held = workspace(call, m, width)  # the same plan's
        split = data_ptr(held)
    return ctas, p.width[gemm], (whole, parts, split + p.counter_bytes, split), held


def workspace(call, m, width=0):
    """A split workspace for launches at M rows (plan().workspace_bytes, its counters zeroed on
    the call's stream, which every launch leaves zeroed), or None where neither GEMM splits: a
    bench makes one and passes its address to its launches instead of each launch making its own
    (a LaunchRecord's replay needs it to stay alive). width: as plan()'s."""
    p = plan(call.device_id, m, width)
    if not p.workspace_bytes:
        return None
    held = call.empty((p.workspace_bytes,), arrays.E4M3)
    call.zero(data_ptr(held), p.counter_bytes)
    return held


# The parameter values of each kernel, a function of the call's numbers alone: a call that repeats
# them (the usual case: the same buffers every step) reuses the one struct, whose image the
# launcher then keeps instead of packing it again.
@functools.lru_cache(maxsize=256)
def fc1_values(m, width, a_q, a_scale, w1_q, w1_scale, y, split_whole, split_parts, partials, counters):
    return _PARAMS[FC1](map_a=tensor_map(a_q, m, HIDDEN, BM, BK), map_w1=tensor_map(w1_q, FC1_OUT, HIDDEN, width, BK),
                        a_scale=a_scale, w1_scale=w1_scale, y=y, M=m, split_whole=split_whole,
                        split_parts=split_parts, partials=partials, counters=counters)


@functools.lru_cache(maxsize=256)
def quant_values(y, y_q, y_scale):
    return _PARAMS[QUANT](y=y, y_q=y_q, y_scale=y_scale)


@functools.lru_cache(maxsize=256)
def fc2_values(m, width, y_q, y_scale, w2_q, w2_scale, gate, gate_stride, gate_rows, adaln_index, residual, out,
               split_whole, split_parts, partials, counters):
    return _PARAMS[FC2](map_y_q=tensor_map(y_q, m, FFN, BM, BK), map_w2=tensor_map(w2_q, HIDDEN, FFN, width, BK),
                        y_scale=y_scale, w2_scale=w2_scale, gate=gate, gate_stride=gate_stride, gate_rows=gate_rows,
                        adaln_index=adaln_index, residual=residual, out=out, M=m, split_whole=split_whole,
                        split_parts=split_parts, partials=partials, counters=counters)


def launch_fc1(call, m, a_q, a_scale, w1_q, w1_scale, y, split=None, build=SHIPPED):
    """y <- SwiGLU(FC1(a_q)) on the call's stream (a persistent grid: one CTA per SM at most),
    in the tile width plan() picks (or the build's), the last wave's tiles split over K as it says. Arguments are
    addresses; split as in walk(). Returns the LaunchRecord."""
    ctas, width, split_fields, _held = walk(call, m, 0, split, build.tile_width)
    fc1 = kernel(call.device_id, gemm_kernel(FC1, width), build)
    return fc1.launch(call.stream_ptr, (ctas, 1), GEMM_THREADS,
                      fc1_values(m, width, a_q, a_scale, w1_q, w1_scale, y, *split_fields))


def launch_y_quant(call, m, y, y_q, y_scale, build=SHIPPED):
    """y_q, y_scale <- the per-token e4m3 quantization of y (addresses), one CTA per row.
    Returns the LaunchRecord."""
    return kernel(call.device_id, QUANT, build).launch(call.stream_ptr, (m, 1), build.quant_threads,
                                                       quant_values(y, y_q, y_scale))


def launch_fc2_gemm(call, m, y_q, y_scale, w2_q, w2_scale, gate, adaln_index, residual, out, split=None,
                    build=SHIPPED):
    """out <- residual + gate * FC2(y_q) on the call's stream. gate is the table (its row stride
    and rows are parameters); split as in walk(); the rest are addresses. Returns the
    LaunchRecord."""
    ctas, width, split_fields, _held = walk(call, m, 1, split, build.tile_width)
    fc2 = kernel(call.device_id, gemm_kernel(FC2, width), build)
    return fc2.launch(call.stream_ptr, (ctas, 1), GEMM_THREADS,
                      fc2_values(m, width, y_q, y_scale, w2_q, w2_scale, data_ptr(gate), strides_elems(gate)[0],
                                 gate.shape[0], adaln_index, residual, out, *split_fields))


def launch_fc2(call, m, y, y_q, y_scale, w2_q, w2_scale, gate, adaln_index, residual, out, split=None,
               build=SHIPPED):
    """y_q, y_scale <- quantize(y), then out <- residual + gate * FC2(y_q), on the call's stream.
    Returns the two LaunchRecords (quantization, GEMM)."""
    return (launch_y_quant(call, m, y, y_q, y_scale, build),
            launch_fc2_gemm(call, m, y_q, y_scale, w2_q, w2_scale, gate, adaln_index, residual, out, split, build))
