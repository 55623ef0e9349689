"""The launches of minimax_h3_varlen_attention_fp8: the quantization passes (Numba,
h3kernels/_launch/numba/varlen_attention_fp8_quant.py) into the call's scratch, then the kernel
of cuda_src/varlen_attention_fp8.cu, with every constant of that source, or for the wgmma
family (form 3) the Hopper kernel of cuda_src/varlen_attention_fp8_sm90a.cu
(varlen_attention_fp8_sm90a.py).

Scratch (h3kernels/_runtime/workspace.py): one buffer per call from the caller's allocator on
its stream, laid out by layout(): q8, k8, v8t, s_q, s_k, mu, s_v, the passes' partial sums (q8 and s_q
empty for the Hopper kernel, which quantizes Q itself). The
segment plan is the device's copy, built once per plan (workspace.PlanCache).
"""
import contextlib
import dataclasses
import functools
from typing import ClassVar

import numpy as np

from h3kernels._launch import numba_ptx
from h3kernels._launch import varlen_attention_fp8_plan as plan
from h3kernels._launch import varlen_attention_fp8_sm90a as hopper
from h3kernels._launch.numba import geometry as G
from h3kernels._runtime import compiler, targets, workspace
from h3kernels._runtime.arrays import data_ptr
from h3kernels.constants import HEAD_DIM, K_BLOCK

SOURCE = "varlen_attention_fp8"
ARCHS = ("sm_120a", "sm_90", "sm_89")
KERNEL = "h3_varlen_attention_fp8"

# cuda_src/varlen_attention_fp8.cu, built with exactly these (AttentionBuild.defines()):
BQ = plan.Q_TILE  # queries per work tile: 128
BKV = 64  # keys per pipeline block; 64 rather than 128 keeps S at 32 registers
KSB = K_BLOCK  # keys per K scale block: 128
HD = HEAD_DIM
STAGES = 4  # cp.async ring depth
THREADS = 256  # 8 warps x 16 query rows
TILE_INTS = plan.TILE_COLS  # plan columns: start, len, first query, head, segment, query end, first key block
SMEM_BYTES = BQ * HD + STAGES * 2 * BKV * HD  # Q tile + ring of K and V^T blocks: 80 KiB
PARAMS = ("u64", "i32", "u64", "u64", "u64", "u64", "u64", "u64", "u64", "i32", "i64", "f32",
          "u64", "u64", "u64", "i32", "f32", "u64")  # then lse (0: not wanted), q, mu, tokens, softmax_scale,
# q_bounds (each segment's query rows; the plan's)

LOG2E = 1.4426950408889634
ALIGN = 256
CAPTURE_ADVICE = ("minimax_h3_varlen_attention_fp8: this stream is capturing a CUDA graph, and the call would build "
                  "a new segment plan; call it once with the same cu_seqlens_host before the capture")
PARTIAL_CAPTURE_ADVICE = ("minimax_h3_varlen_attention_fp8_partial: this stream is capturing a CUDA graph, and the "
                          "call would build a new segment plan; call it once with the same cu_seqlens_q and "
                          "cu_seqlens_k before the capture")


@dataclasses.dataclass(frozen=True)
class AttentionBuild:
    """A build of cuda_src/varlen_attention_fp8.cu: the arch it is compiled for and its mma form."""
    arch: str
    form: int = 0
    kernels: ClassVar[tuple] = (KERNEL,)

    def defines(self):
        # sm_90 runs each e4m3 mma as conversions to f16 plus two HMMAs; with Q held in registers
        # ptxas keeps its converted copy live across the key loop and spills, so there Q is re-read
        # from shared memory for every block. The warp-uniform skip of an O rescale by 1 (online
        # softmax) also costs sm_90 the last registers it has, so there O is always rescaled.
        registers_to_spare = int(self.arch != "sm_90")
        return dict(BQ=BQ, BKV=BKV, KSB=KSB, HD=HD, STAGES=STAGES, THREADS=THREADS, TILE_INTS=TILE_INTS,
                    Q_IN_REGS=registers_to_spare, SKIP_SETTLED_RESCALE=registers_to_spare, H3_MMA_FORM=self.form)

    def kernel_params(self, name):
        return PARAMS

    def dynamic_smem(self, name):
        return SMEM_BYTES


def shipped_builds(arch):
    """The builds of this source that ship for `arch`: one per mma form of the arch."""
    return tuple(AttentionBuild(arch, form) for form in targets.MMA_FORMS[arch]) if arch in ARCHS else ()


def attention_build(device_id, form, exact_lse):
    """The build a call runs: the Hopper family's for form 3 (its exact-l build when the call wants
    the lse of the true scores), else this kernel's for the device's arch and `form`; one instance
    of each, so that the loader's lookup hashes a build it has seen."""
    if targets.form_family(form) == targets.WGMMA:
        return hopper.BUILDS[exact_lse]
    return _mma_build(targets.device_arch(device_id), form)


@functools.lru_cache(maxsize=64)
def _mma_build(arch, form):
    return AttentionBuild(arch, form)


@functools.lru_cache(maxsize=64)
def layout(tokens, heads, segments, key_blocks, with_q=True):
    """({name: (byte offset, shape, raw dtype)}, size in bytes) of the workspace; with_q False: q8
    and s_q hold no rows (runs_q_pass)."""
    q_rows = tokens if with_q else 0
    parts = (("q8", (q_rows, heads, HEAD_DIM), "uint8"), ("k8", (tokens, heads, HEAD_DIM), "uint8"),
             ("v8t", (heads, HEAD_DIM, key_blocks * K_BLOCK), "uint8"), ("s_q", (q_rows, heads), "float32"),
             ("s_k", (key_blocks, heads), "float32"), ("mu", (segments, heads, HEAD_DIM), "float32"),
             ("s_v", (segments, heads, HEAD_DIM), "float32"),
             ("partials", (2, key_blocks, heads, HEAD_DIM), "float32"))
    out, off = {}, 0
    for name, shape, dt in parts:
        out[name] = (off, shape, dt)
        off += -(-int(np.prod(shape)) * np.dtype(dt).itemsize // ALIGN) * ALIGN
    return out, max(off, ALIGN)


@functools.lru_cache(maxsize=64)
def _offsets(tokens, heads, segments, key_blocks, with_q=True):
    parts, nbytes = layout(tokens, heads, segments, key_blocks, with_q)
    return tuple(parts[n][0] for n in ("q8", "k8", "v8t", "s_q", "s_k", "mu", "s_v", "partials")), nbytes


def quant_launches(device_id, tokens, heads, segments, n, q, k, v, cu, cu_stride, block_offset, blocks, base,
                   one_read=False, with_q=True):
    """[(name, kernel, grid (x, y), threads, values)] of the quantization passes: q, k, v, cu (the device
    cu_seqlens, int32, `cu_stride` elements apart) and the plan's block_offset (int32) and
    blocks (int64 [n, 3]) as addresses; the workspace at `base` (layout()). one_read: every
    segment has at most SEGMENT_KEYS keys (plan.one_read), so the K and V passes read them once;
    with_q False: no Q pass (the Hopper kernel quantizes Q itself, runs_q_pass)."""
    return [(name, numba_ptx.kernel(name, device_id), grid, threads, values) for name, grid, threads, values in
            _quant_values(tokens, heads, segments, n, q, k, v, cu, cu_stride, block_offset, blocks, base, one_read,
                          with_q)]


def runs_q_pass(build):
    """Whether the attention kernel of `build` (attention_build's) reads the Q pass's q8 and s_q:
    the mma.sync kernel does; the Hopper kernel quantizes each Q tile itself, bit for bit alike."""
    return not isinstance(build, hopper.AttentionBuild)


@functools.lru_cache(maxsize=64)
def _quant_values(tokens, heads, segments, n, q, k, v, cu, cu_stride, block_offset, blocks, base, one_read=False,
                  with_q=True):
    """quant_launches without the kernels: ((name, grid, threads, values), ...). Every value is a
    function of these ints alone, so a call that repeats them (the same arrays, plan and
    workspace: the usual steady state) reuses the tuples instead of building them again."""
    (o_q8, o_k8, o_v8t, o_sq, o_sk, o_mu, o_sv, o_part), _ = _offsets(tokens, heads, segments, n, with_q)
    out = []
    add = lambda *launch: out.append(launch)  # noqa: E731
    if with_q:
        _q_pass(add, tokens * heads, q, base + o_q8, base + o_sq)
    if one_read:
        if segments and tokens:
            _one_read_passes(add, tokens, heads, segments, n, k, v, _cu_values(segments, cu, cu_stride), block_offset,
                             base + o_mu, base + o_k8, base + o_sk, base + o_sv, base + o_v8t)
        return tuple(out)
    _kv_block_pass(add, tokens, heads, n, k, v, blocks, base + o_part)
    if segments and tokens:
        add("kv_segment_kernel", (segments, heads), G.SEG_THREADS,
            (*_cu_values(segments, cu, cu_stride),
             *_segment_reduction(segments, heads, n, block_offset, base + o_part, base + o_mu, base + o_sv)))
    _kv_passes(add, tokens, heads, segments, n, k, v, base + o_mu, base + o_sv, blocks, base + o_k8, base + o_sk,
               base + o_v8t)
    return tuple(out)


def _cu_values(segments, cu, cu_stride):
    """The device cu_seqlens (int32 at address cu, cu_stride elements apart) as a Numba array's
    fields."""
    return 0, 0, segments + 1, 4, cu, segments + 1, 4 * cu_stride


def _one_read_passes(add, tokens, heads, segments, n, k, v, cu_values, block_offset, mu, k8, s_k, s_v, v8t):
    """The K and V passes in one read (segments of at most SEGMENT_KEYS keys): a CTA per (segment,
    head) of each, into mu, k8, s_k and s_v, v8t (addresses) of the workspace."""
    vec, words, plane = numba_ptx.vector, tokens * heads * 32, heads * HEAD_DIM
    block_offsets = vec(block_offset, segments + 1, 4)
    add("k_segment_kernel", (segments, heads), G.SEGMENT_THREADS,
        (*vec(k, words, 8), *cu_values, *block_offsets, *vec(mu, segments * plane, 4), *vec(k8, words, 4),
         *vec(s_k, n * heads, 4), heads))
    add("v_segment_kernel", (segments, heads), G.SEGMENT_THREADS,
        (*vec(v, words, 8), *cu_values, *block_offsets, *vec(s_v, segments * plane, 4),
         *vec(v8t, heads * HEAD_DIM * n * K_BLOCK // 4, 4), heads, n))


def _kv_block_pass(add, tokens, heads, n, k, v, blocks, partials):
    """The pass over the n key blocks of k and v (`tokens` tokens) that writes each block's K sums
    and V amaxes into partials (f32 [2, n, heads, 128]; addresses)."""
    if n:
        vec, words = numba_ptx.vector, tokens * heads * HEAD_DIM // 4
        add("kv_block_kernel", (-(-n // G.KV_WARPS) * heads, 1), G.KV_BLOCK_THREADS,
            (*vec(k, words, 8), *vec(v, words, 8), *_blocks_array(blocks, n),
             *vec(partials, 2 * n * heads * HEAD_DIM, 4), heads, n))


def _segment_reduction(segments, heads, n, block_offset, partials, out_k, out_v):
    """The arguments a segment kernel (kv_segment_kernel after its cu, kv_segment_sums_kernel)
    takes: block_offset (int32 [segments + 1]), the partials (f32 [2, n, heads, 128]) and its two
    outputs (f32 [segments, heads, 128]), as addresses."""
    arr = numba_ptx.array_values
    return (*numba_ptx.vector(block_offset, segments + 1, 4), *arr(partials, (2, n, heads, HEAD_DIM), 4),
            *arr(out_k, (segments, heads, HEAD_DIM), 4), *arr(out_v, (segments, heads, HEAD_DIM), 4))


def _blocks_array(blocks, n):
    """The plan's key blocks (int64 [n, 3] at address `blocks`) as a Numba array's fields."""
    return 0, 0, 3 * n, 8, blocks, n, 3, 24, 8


def _q_pass(add, rows, q, q8, s_q):
    """The Q pass over `rows` (token, head) rows of q into q8 and s_q (addresses)."""
    if rows:
        vec = numba_ptx.vector
        add("q_kernel", (-(-rows // G.Q_ROWS_PER_CTA), 1), G.Q_THREADS,
            (*vec(q, rows * 32, 8), *vec(q8, rows * 32, 4), *vec(s_q, rows, 4), rows))


def _k_pass(add, tokens, heads, segments, n, k, mu, blocks, k8, s_k, k_scale_given=False, k8_words=None):
    """The K pass over the n key blocks of k (`tokens` tokens), centred on mu (f32 [segments,
    heads, 128] address), into k8 and s_k (addresses); with k_scale_given, s_k holds the K scales
    already and the pass reads them; k8_words 0: no codes, the scales alone."""
    if n:
        vec, words, plane = numba_ptx.vector, tokens * heads * 32, heads * HEAD_DIM
        add("k_quant_given_kernel" if k_scale_given else "k_quant_kernel", (n * heads, 1), G.QUANT_THREADS,
            (*vec(k, words, 8), *vec(mu, segments * plane, 4), *_blocks_array(blocks, n),
             *vec(k8, words if k8_words is None else k8_words, 4), *vec(s_k, n * heads, 4), heads))


def _kv_passes(add, tokens, heads, segments, n, k, v, mu, s_v, blocks, k8, s_k, v8t, k_scale_given=False):
    """The K pass (_k_pass) and the V pass over the n key blocks of v, scaled by s_v (f32
    [segments, heads, 128] address), into v8t (address)."""
    _k_pass(add, tokens, heads, segments, n, k, mu, blocks, k8, s_k, k_scale_given)
    if n:
        vec, words, plane = numba_ptx.vector, tokens * heads * 32, heads * HEAD_DIM
        add("v_quant_kernel", (n * heads, 1), G.QUANT_THREADS,
            (*vec(v, words, 8), *vec(s_v, segments * plane, 4), *_blocks_array(blocks, n),
             *vec(v8t, heads * HEAD_DIM * n * K_BLOCK // 4, 4), heads, n))


def partial_launches(device_id, tokens_q, tokens_k, heads, segments, n, q, k, v, mu, s_v, s_k, blocks, base,
                     with_q=True):
    """The passes of run_partial: the Q pass over q (where with_q), the K and V passes over the key
    block with the caller's mu and s_v (f32 [segments, heads, 128] addresses; no K/V statistics
    passes) and, where s_k is an address, the caller's K scales (f32 [n, heads]), into the
    workspace at `base` laid out for max(tokens_q, tokens_k) tokens."""
    (o_q8, o_k8, o_v8t, o_sq, o_sk, _, _, _), _ = _offsets(max(tokens_q, tokens_k), heads, segments, n, with_q)
    out = []
    add = lambda name, grid, threads, values: out.append((name, numba_ptx.kernel(name, device_id), grid, threads,
                                                          values))
    if with_q:
        _q_pass(add, tokens_q * heads, q, base + o_q8, base + o_sq)
    _kv_passes(add, tokens_k, heads, segments, n, k, v, mu, s_v, blocks, base + o_k8,
               base + o_sk if s_k is None else s_k, base + o_v8t, k_scale_given=s_k is not None)
    return out


def run(call, q, k, v, cu_seqlens, cu_host, heads, scale, out, form, lse=None, keep=None):
    """out <- attention of q, k, v over the segments of cu_host (a tuple), on the call's stream,
    and lse (f32 [heads, tokens]) <- the log-sum-exp of each row's true scores when given. The
    call's device must be current. Returns the attention kernel's LaunchRecord (None: no tiles);
    keep (a list), when given, receives the call's scratch, which a replay of the record reads."""
    tokens = int(q.shape[0])
    segments = len(cu_host) - 1
    cu_stride = cu_seqlens.stride(0) if call.kind == "torch" else cu_seqlens.strides[0] // 4
    one_read = plan.one_read(cu_host)
    passes = lambda n, block_offset, blocks, base, with_q: quant_launches(
        call.device_id, tokens, heads, segments, n, data_ptr(q), data_ptr(k), data_ptr(v), data_ptr(cu_seqlens),
        cu_stride, block_offset, blocks, base, one_read, with_q)
    return _attend(call, attention_build(call.device_id, form, lse is not None), (cu_host, heads),
                   lambda: plan.plan_arrays(cu_host, heads), tokens, segments, heads, passes, q, out, lse, None, None,
                   scale, CAPTURE_ADVICE, keep)


def run_partial(call, q, k, v, cu_q, cu_k, heads, scale, out, lse, mu, s_v, s_k, form, exact_lse=True):
    """The ring's step on the call's stream: the queries of segment i of q (rows cu_q[i] ..
    cu_q[i + 1]) against the keys of segment i of k, v (cu_k), K centred on mu and V scaled by s_v
    (the caller's f32 [segments, heads, 128] arrays: the whole segments' statistics), K scaled
    per 128-key block from each segment's first key in k, by s_k (f32 [key blocks, heads]) where
    given, else by the block's own amax. out and lse (f32 [heads, q tokens]) are
    written for the rows of segments that have keys here, and left as they are elsewhere; the
    lse of the true scores, or with exact_lse False that of the sum out is divided by (the
    wgmma form's build without the lse's own FP32 sum). The call's device must be current.
    Returns the attention kernel's LaunchRecord (None: no tiles)."""
    tokens_q, tokens_k = int(q.shape[0]), int(k.shape[0])
    segments = len(cu_q) - 1
    s_k = None if s_k is None else data_ptr(s_k)
    passes = lambda n, block_offset, blocks, base, with_q: partial_launches(
        call.device_id, tokens_q, tokens_k, heads, segments, n, data_ptr(q), data_ptr(k), data_ptr(v), data_ptr(mu),
        data_ptr(s_v), s_k, blocks, base, with_q)
    return _attend(call, attention_build(call.device_id, form, exact_lse), ("cross", cu_q, cu_k, heads),
                   lambda: plan.cross_plan_arrays(cu_q, cu_k, heads), max(tokens_q, tokens_k), segments, heads, passes,
                   q, out, lse, data_ptr(mu), data_ptr(s_v), scale, PARTIAL_CAPTURE_ADVICE, s_k=s_k)


def _attend(call, build, plan_key, make_plan, ws_tokens, segments, heads, passes, q, out, lse, mu, s_v, scale,
            advice, keep=None, s_k=None):
    """What run and run_partial share: the device plan make_plan() gives (built once per key on
    the host), the call's scratch laid out for ws_tokens tokens, the passes
    `passes(n, block_offset, blocks, base, with_q)` gives (with_q: runs_q_pass(build)), then the
    attention kernel of `build` (an AttentionBuild of this module or of the Hopper family's).
    mu, s_v and s_k: addresses, or None
    for the scratch's own (which the passes fill); advice: the error's words under a capture that
    would need a new plan. Returns the attention kernel's LaunchRecord; the
    scratch goes back to the caller's allocator, stream-ordered, when the launches are queued."""
    plans = workspace.plans(call.device_id)
    capturing = call.capturing
    held_plan = plans.take(plan_key, make_plan, capturing, advice)
    launched = False
    try:
        n_tiles, _, n, _ = held_plan.rows
        if not n_tiles:
            return None
        tiles, block_offset, blocks, q_bounds = held_plan.ptrs
        with_q = runs_q_pass(build)  # else the Hopper kernel, which quantizes Q itself from q
        offsets, size = _offsets(ws_tokens, heads, segments, n, with_q)
        tokens = int(q.shape[0])
        # the Hopper kernel's TMA reads q from a 16-byte boundary; q itself needs only 8 (the Q
        # pass's quads): a q off that boundary is copied to one at the scratch's end
        q_bytes = tokens * heads * HEAD_DIM * 2
        q_copy = not with_q and data_ptr(q) % hopper.Q_ALIGN != 0
        held = workspace.scratch(call, size + (q_bytes if q_copy else 0))
        if keep is not None:
            keep += [held, held_plan]
        base, stream = data_ptr(held), call.stream_ptr
        o_q8, o_k8, o_v8t, o_sq, o_sk, o_mu, o_sv, _ = offsets
        launched = True
        for _, kern, grid, threads, values in passes(n, block_offset, blocks, base, with_q):
            kern.launch(stream, grid, threads, values)
        s_v = base + o_sv if s_v is None else s_v
        mu = base + o_mu if mu is None else mu
        s_k = base + o_sk if s_k is None else s_k
        lse_ptr = 0 if lse is None else data_ptr(lse)
        if not with_q:  # K rows past the keys' tokens are masked, whatever they hold
            q_map = data_ptr(q)
            if q_copy:
                q_map = base + size
                call.copy(q_map, data_ptr(q), q_bytes)
            values = hopper.launch_values(q_map, base + o_k8, base + o_v8t, ws_tokens, n * K_BLOCK, tiles,
                                          n_tiles, s_k, s_v, data_ptr(out), heads,
                                          scale * LOG2E, lse_ptr, data_ptr(q), mu, tokens, scale, q_bounds)
            return hopper.launch(call, n_tiles, build, values)
        f = compiler.kernel(SOURCE, KERNEL, build.arch, build, call.device_id)
        return f.launch(stream, (min(n_tiles, f.grid_cap(THREADS)), 1), THREADS,
                        (tiles, n_tiles, base + o_q8, base + o_sq, base + o_k8, s_k,
                         base + o_v8t, s_v, data_ptr(out), heads, n * K_BLOCK, scale * LOG2E, lse_ptr,
                         data_ptr(q), mu, tokens, scale, q_bounds))
    finally:
        plans.release(held_plan, call.stream_ptr, capturing, launched)


STATISTICS_CAPTURE_ADVICE = ("the ring's statistics passes: this stream is capturing a CUDA graph, and the call "
                             "would build a new block plan; call it once with the same boundaries before the capture")


def run_segment_sums(call, k, v, cu_k, heads, k_sum, v_amax):
    """k_sum, v_amax (f32 [segments, heads, 128]) <- each segment's keys of k added (blocks from
    each segment's first key, kv_block_kernel's order) and amax |v|, on the call's stream; the
    call's device must be current."""
    segments = len(cu_k) - 1
    with _held_plan(call, ("blocks", cu_k), lambda: plan._blocks(cu_k)) as (block_offset, blocks, n):
        if not n:
            call.zero(data_ptr(k_sum), segments * heads * HEAD_DIM * 4)
            call.zero(data_ptr(v_amax), segments * heads * HEAD_DIM * 4)
            return
        held = workspace.scratch(call, 2 * n * heads * HEAD_DIM * 4)  # held until the launches are queued
        part = data_ptr(held)
        add = lambda *launch: _launch_passes(call, (launch,))  # noqa: E731
        _kv_block_pass(add, int(k.shape[0]), heads, n, data_ptr(k), data_ptr(v), blocks, part)
        add("kv_segment_sums_kernel", (segments, heads), G.SEG_THREADS,
            _segment_reduction(segments, heads, n, block_offset, part, data_ptr(k_sum), data_ptr(v_amax)))


def grid_block_count(cu_k, firsts):
    """The blocks of run_key_block_scales: those of plan.grid_blocks."""
    return int(plan.grid_blocks(cu_k, firsts)[0][-1])


def run_key_block_scales(call, k, cu_k, firsts, heads, k_mean, s_k):
    """s_k (f32 [blocks, heads]) <- RN(amax |RN(k - k_mean)| / 448) over each block of
    plan.grid_blocks(cu_k, firsts): the K pass on those blocks with no codes (an empty k8); on the
    call's stream, the call's device current."""
    segments, tokens = len(cu_k) - 1, int(k.shape[0])
    with _held_plan(call, ("grid", cu_k, firsts), lambda: plan.grid_blocks(cu_k, firsts)) as (_, blocks, n):
        _k_pass(lambda *launch: _launch_passes(call, (launch,)), tokens, heads, segments, n, data_ptr(k),
                data_ptr(k_mean), blocks, 0, data_ptr(s_k), k8_words=0)


@contextlib.contextmanager
def _held_plan(call, key, make):
    """(block_offset, blocks, n) of the device copy of make()'s (block_offset, blocks), held while
    the body queues its launches."""
    plans = workspace.plans(call.device_id)
    capturing = call.capturing
    held = plans.take(key, make, capturing, STATISTICS_CAPTURE_ADVICE)
    try:
        yield held.ptrs[0], held.ptrs[1], held.rows[1]
    finally:
        plans.release(held, call.stream_ptr, capturing)


def _launch_passes(call, passes):
    for name, grid, threads, values in passes:
        numba_ptx.kernel(name, call.device_id).launch(call.stream_ptr, grid, threads, values)
