"""The launches of minimax_h3_mlp_fp8: the row kernel (Numba, h3kernels/_launch/numba/mlp_fp8_row.py)
and the FC1 and FC2 GEMMs of cuda_src/mlp_fp8.cu, with every constant of that source.

All three go through launcher.Kernel on the caller's stream, and each launch function returns
the LaunchRecord(s) of its launches; a caller opens an arrays.Call and makes its device current
first (h3kernels/mlp_fp8.py does both). A build of the GEMMs is a value, MmaMlpBuild(arch, form).
"""
import dataclasses
import functools
from typing import ClassVar

from h3kernels._launch import mlp_fp8_sm90a, numba_ptx
from h3kernels._runtime import compiler, targets
from h3kernels._runtime.arrays import data_ptr, strides_elems
from h3kernels._runtime.targets import MMA_FORMS, device_arch, sm_count
from h3kernels.constants import FC1_OUT, FC2_FLAG_COLS, FC2_FLAG_ROWS, FFN, HIDDEN, ROW_THREADS, fc2_flag_count

SOURCE = "mlp_fp8"
ARCHS = ("sm_120a", "sm_90", "sm_89")
FC1, FC2 = "h3_mlp_fc1", "h3_mlp_fc2"

# cuda_src/mlp_fp8.cu, built with exactly these (MmaMlpBuild.defines()):
BM = FC2_FLAG_ROWS  # rows of an output tile (and of an FC2 ready flag's row band): 128
BN = 128  # columns of an output tile (FC1: prepacked, 64 logical y columns)
BK = 128  # bytes of K per pipeline stage
STAGES = 3  # cp.async ring depth
THREADS = 256  # GEMM warps: 8, as 2 along M x 4 along N, 64 x 32 outputs each
GROUP_M = 16  # m-tiles per band of the persistent walk, so the tiles in flight share L2 operands
PRODUCERS = 64  # FC2: 2 more warps that quantize y beside the GEMM warps
CHUNK_COLS = FC2_FLAG_COLS  # FC2: y columns per ready flag: 1024
GROUP_ROWS = 16  # FC2: rows of y one producer claim quantizes
SMEM_BYTES = STAGES * (BM + BN) * BK  # dynamic shared memory of both GEMMs: 96 KiB

# the kernels' positional parameters (launcher formats)
_PARAMS = {FC1: ("u64",) * 5 + ("i32",),  # a_q, a_scale, w1_q, w1_scale, y, M
           # y, y_q, y_scale, w2_q, w2_scale, gate, its stride and rows, adaln_index, residual, out, flags, M
           FC2: ("u64",) * 6 + ("i64", "i64") + ("u64",) * 4 + ("i32",)}
ROW_QUADS = HIDDEN // 4


@dataclasses.dataclass(frozen=True)
class MmaMlpBuild:
    """A build of cuda_src/mlp_fp8.cu: the arch and the mma form (fp8_common.cuh's H3_MMA_FORM)."""
    arch: str
    form: int = 0

    kernels: ClassVar[tuple] = (FC1, FC2)

    def defines(self):
        # sm_90 emulates each e4m3 mma with conversions and HMMAs: there FC1 fits two k32 steps of a
        # stage in registers and FC2 (fewer registers per thread, for its producer warps) one.
        sm90 = self.arch == "sm_90"
        return dict(BM=BM, BN=BN, BK=BK, STAGES=STAGES, THREADS=THREADS, GROUP_M=GROUP_M, PRODUCERS=PRODUCERS,
                    CHUNK_COLS=CHUNK_COLS, GROUP_ROWS=GROUP_ROWS, HIDDEN=HIDDEN, FFN=FFN, FC1_OUT=FC1_OUT,
                    KS_STEP_FC1=2 if sm90 else 4, KS_STEP_FC2=1 if sm90 else 4, H3_MMA_FORM=self.form)

    def kernel_params(self, name):
        return _PARAMS[name]

    def dynamic_smem(self, name):
        return SMEM_BYTES


def shipped_builds(arch):
    """The builds of this source that ship for `arch`: one per mma form of the arch."""
    return tuple(MmaMlpBuild(arch, form) for form in MMA_FORMS.get(arch, ()))


@functools.lru_cache(maxsize=64)
def build_for(arch, form):
    """The build of `arch` and mma form `form`, one instance per pair: the loader's lookup of a
    launch hashes a build it has seen."""
    return MmaMlpBuild(arch, form)


def kernel(device_id, name, form):
    """GEMM `name` built for the device's arch and mma form `form` (loaded once)."""
    arch = device_arch(device_id)
    return compiler.kernel(SOURCE, name, arch, build_for(arch, form), device_id)


ALIGN = 256


@functools.lru_cache(maxsize=64)
def scratch_layout(m, names, split_bytes=0):
    """(total bytes, {name: byte offset}) of one scratch allocation holding the buffers `names`
    (of a_q, a_scale, y, y_q, y_scale, flags: those the caller gave no workspace for) and, where
    split_bytes > 0, form 3's split workspace ("split"), each 256-byte aligned: one allocator call
    for all of them. (0, {}) when there is nothing to hold. (Cached: read the dict only.)"""
    sizes = dict(a_q=m * HIDDEN, a_scale=4 * m, y=2 * m * FFN, y_q=m * FFN, y_scale=4 * m, flags=4 * fc2_flag_count(m),
                 split=split_bytes)
    offsets, off = {}, 0
    for name in tuple(names) + (("split",) if split_bytes else ()):
        offsets[name] = off
        off += -(-sizes[name] // ALIGN) * ALIGN
    return off, offsets


def row_values(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps, a_q, a_scale, zero=0, zero_words=0):
    """The row kernel's flattened parameters: x, x_norm_weight, a_q as quad views, the AdaLN
    tables as flat quads from their bases (row i at i * stride quads), adaln_index, a_scale
    (a_q and a_scale: addresses), and `zero_words` int32 words at `zero` that it clears for the
    GEMMs after it (gemm_zero_words). Validation guarantees the alignment and contiguity these
    views assume."""
    return row_values_at(x.shape[0], data_ptr(x), data_ptr(x_norm_weight), data_ptr(adaln_scale),
                         data_ptr(adaln_shift), strides_elems(adaln_scale)[0], adaln_scale.shape[0],
                         data_ptr(adaln_index), eps, a_q, a_scale, zero, zero_words)


@functools.lru_cache(maxsize=64)
def row_values_at(m, x, x_norm_weight, adaln_scale, adaln_shift, stride, rows, adaln_index, eps, a_q, a_scale,
                  zero=0, zero_words=0):
    """row_values from M, the arrays' addresses, the tables' row stride (elements) and rows. A
    function of these numbers alone: a call that repeats them reuses the tuple."""
    span = ((rows - 1) * stride + HIDDEN) // 4  # quads from the base through the last row's end
    vec = numba_ptx.vector
    return (0, 0, m * ROW_QUADS, 8, x, m, ROW_QUADS, 8 * ROW_QUADS, 8,
            *vec(x_norm_weight, ROW_QUADS, 8), *vec(adaln_scale, span, 8),
            *vec(adaln_shift, span, 8), stride // 4, rows, *vec(adaln_index, m, 8), eps,
            0, 0, m * ROW_QUADS, 4, a_q, m, ROW_QUADS, 4 * ROW_QUADS, 4, *vec(a_scale, m, 4),
            *vec(zero, zero_words, 4))


def launch_row(call, x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps, a_q, a_scale):
    """a_q, a_scale (addresses) <- the row stage of x, on the call's stream: one CTA per row.
    Returns the LaunchRecord (None where M is 0)."""
    m = x.shape[0]
    if m:
        return launch_row_at(call, m, row_values(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps, a_q,
                                                 a_scale))
    return None


def launch_row_at(call, m, values):
    """launch_row with the kernel's parameters given (row_values_at; M >= 1): one CTA per row.
    Returns the LaunchRecord."""
    return numba_ptx.kernel("row_kernel", call.device_id).launch(call.stream_ptr, (m, 1), ROW_THREADS, values)


def gemm_zero_words(form, m, flags, split, counter_bytes):
    """(address, int32 words) that the GEMMs of a call need zeroed before FC1, which the row
    kernel clears (row_values' zero, zero_words): the FC2 tile flags (forms 0 and 2), the split
    counters where a GEMM splits (form 3: `split`, its workspace; every launch leaves them
    zeroed again), else nothing."""
    if targets.form_family(form) != targets.WGMMA:
        return flags, fc2_flag_count(m)
    return (split, counter_bytes // 4) if split else (0, 0)


def launch_fc1(call, form, m, a_q, a_scale, w1_q, w1_scale, y, split=None):
    """y <- SwiGLU(FC1(a_q)) on the call's stream (a persistent grid: one CTA per SM at most).
    Arguments are addresses. Form 3 runs the wgmma family (mlp_fp8_sm90a), the last wave's
    tiles split over K in `split` (its workspace, mlp_fp8_sm90a.plan), or in one of the launch's
    own where it is None. Returns the LaunchRecord."""
    if targets.form_family(form) == targets.WGMMA:
        return mlp_fp8_sm90a.launch_fc1(call, m, a_q, a_scale, w1_q, w1_scale, y, split=split)
    ctas = min(-(-m // BM) * (FC1_OUT // BN), sm_count(call.device_id))
    return kernel(call.device_id, FC1, form).launch(call.stream_ptr, (ctas, 1), THREADS,
                                                    (a_q, a_scale, w1_q, w1_scale, y, m))


def launch_fc2(call, form, m, y, y_q, y_scale, w2_q, w2_scale, gate, adaln_index, residual, out, flags,
               split=None):
    """out <- residual + gate * FC2(quantize(y)) on the call's stream; flags must be zero. gate is
    the table (its row stride and rows are parameters); the rest are addresses. Form 3 runs the
    wgmma family (mlp_fp8_sm90a: a y quantization kernel, then the GEMM; flags unused; split as
    in launch_fc1). Returns the LaunchRecord(s): form 3's are (quantization, GEMM)."""
    if targets.form_family(form) == targets.WGMMA:
        return mlp_fp8_sm90a.launch_fc2(call, m, y, y_q, y_scale, w2_q, w2_scale, gate, adaln_index, residual, out,
                                        split=split)
    ctas = min(-(-m // BM) * (HIDDEN // BN), sm_count(call.device_id))
    return kernel(call.device_id, FC2, form).launch(
        call.stream_ptr, (ctas, 1), THREADS + PRODUCERS,
        (y, y_q, y_scale, w2_q, w2_scale, data_ptr(gate), strides_elems(gate)[0], gate.shape[0], adaln_index,
         residual, out, flags, m))
