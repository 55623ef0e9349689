"""Timing on the caller's torch stream: CUDA events (warm-up, then the median of many runs) for
GPU time, and host_ms_per_call for the host time of one operator call while the GPU is busy."""
import itertools
import statistics
import time

from h3kernels.constants import FC1_OUT, FFN, HEAD_DIM, HIDDEN, K_BLOCK
from h3kernels.timing import median_ms, median_ms_batched  # noqa: F401 (the benches' and tests' timers)


def copy_bandwidth_gbs(nbytes, device="cuda", reps=20, batch=10):
    """(GB/s, ms) of a torch device-to-device copy of `nbytes` (bytes read + bytes written, over
    time), timed as the kernels are: `batch` back-to-back copies per event pair (median_ms_batched).
    One copy per event pair would charge it a launch gap the batched kernel timings do not pay."""
    import torch

    n = max(int(nbytes) // 2, 1)
    src = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    ms = median_ms_batched(lambda: dst.copy_(src), batch=batch, warmup=2, reps=reps)
    return 2 * n / (ms * 1e-3) / 1e9, ms


def row_stage_kernel_ms(arg_sets, a_q, a_scale, eps=1e-5, batch=10, reps=20):
    """Median ms of the MLP row kernel alone: `batch` back-to-back launches through the launch
    layer, cycling through arg_sets (x, x_norm_weight, adaln_scale, adaln_shift, adaln_index) tuples."""
    from h3kernels._launch import mlp_fp8 as launch
    from h3kernels._runtime import arrays

    call = arrays.Call(dict(x=arg_sets[0][0], a_q=a_q, a_scale=a_scale))
    cur = {}
    out = arrays.data_ptr(a_q), arrays.data_ptr(a_scale)
    previous = call.make_current()
    try:
        return median_ms_batched(lambda: launch.launch_row(call, *cur["args"], eps, *out), batch=batch,
                                 warmup=2, reps=reps, setup=lambda i: cur.update(args=arg_sets[i % len(arg_sets)]))
    finally:
        arrays.restore(previous)


def row_stage_vs_copy(sets, a_q, a_s, rounds=5):
    """The MLP row kernel's effective bandwidth against a torch copy of the same bytes (x read,
    a_q and a_s written; sets as row_stage_kernel_ms's arg_sets): row_stage_kernel_ms and
    copy_bandwidth_gbs in alternating rounds, the round with the median kernel/copy bandwidth
    ratio reported, so that a clock or neighbour change during the run moves both sides. Returns
    that round's dict(ratio, kernel_ms, kernel_gbs, copy_ms, copy_gbs), plus bytes and rounds
    (every round's dict, in run order)."""
    x = sets[0][0]
    nbytes = sum(t.numel() * t.element_size() for t in (x, a_q, a_s))
    runs = []
    for _ in range(rounds):
        kernel_ms = row_stage_kernel_ms(sets, a_q, a_s)
        copy_gbs, copy_ms = copy_bandwidth_gbs(nbytes)
        kernel_gbs = nbytes / (kernel_ms * 1e-3) / 1e9
        runs.append(dict(ratio=kernel_gbs / copy_gbs, kernel_ms=kernel_ms, kernel_gbs=kernel_gbs, copy_ms=copy_ms,
                         copy_gbs=copy_gbs))
    median = sorted(runs, key=lambda r: r["ratio"])[len(runs) // 2]
    return dict(median, bytes=nbytes, rounds=runs)


class QuantPasses:
    """The attention's quantization launches (_launch.varlen_attention_fp8.quant_launches) of q,
    k, v (torch CUDA) over the segments of cu_seqlens_host, into a workspace of their own
    (`mem`, laid out as `parts`), ready to run on their own; with_q False: without the Q pass, as
    a call of the Hopper kernel runs them (_launch.varlen_attention_fp8.runs_q_pass)."""

    def __init__(self, q, k, v, cu_seqlens, cu_seqlens_host, with_q=True):
        import torch

        from h3kernels._launch import varlen_attention_fp8 as launch
        from h3kernels._launch.varlen_attention_fp8_plan import one_read, plan_arrays
        from h3kernels._runtime import arrays

        self.cu_host = tuple(int(c) for c in cu_seqlens_host)
        self.tokens, self.heads, self.segments = int(q.shape[0]), int(q.shape[1]), len(self.cu_host) - 1
        _, block_offset, blocks = (torch.from_numpy(a.copy()).to(q.device)
                                   for a in plan_arrays(self.cu_host, self.heads)[:3])
        self.n = int(blocks.shape[0])
        self.parts, nbytes = launch.layout(self.tokens, self.heads, self.segments, self.n, with_q)
        self.mem = torch.empty(nbytes, dtype=torch.uint8, device=q.device)
        self._keep = (q, k, v, cu_seqlens, block_offset, blocks)  # the addresses below stay valid
        self.call = arrays.Call(dict(q=q, k=k, v=v, cu_seqlens=cu_seqlens))
        self.launches = launch.quant_launches(self.call.device_id, self.tokens, self.heads, self.segments, self.n,
                                              q.data_ptr(), k.data_ptr(), v.data_ptr(), cu_seqlens.data_ptr(),
                                              cu_seqlens.stride(0), block_offset.data_ptr(), blocks.data_ptr(),
                                              self.mem.data_ptr(), one_read(self.cu_host), with_q)

    def run(self, chosen=None):
        """Launches every pass (or the `chosen` launches) on the call's stream; the call's device
        must be current."""
        for _, kern, grid, threads, values in (self.launches if chosen is None else chosen):
            kern.launch(self.call.stream_ptr, grid, threads, values)


def attention_quant_kernel_ms(q, k, v, cu_seqlens, cu_seqlens_host, budget_ms=150.0, reps=5, with_q=True):
    """(total, {kernel name: ms}): median ms of the attention's quantization passes alone, and of
    each pass alone (QuantPasses; with_q as there), back-to-back between one pair of events, the
    batch sized to about budget_ms per timed run. q, k, v, cu_seqlens: torch CUDA tensors."""
    from h3kernels._runtime import arrays

    passes = QuantPasses(q, k, v, cu_seqlens, cu_seqlens_host, with_q)
    previous = passes.call.make_current()
    try:
        one = lambda: passes.run()
        one()
        batch = max(1, min(20, int(budget_ms / max(median_ms(one, warmup=1, reps=3), 1e-3))))
        total = median_ms_batched(one, batch=batch, warmup=1, reps=reps)
        each = {p[0]: median_ms_batched(lambda p=p: passes.run([p]), batch=batch, warmup=1, reps=reps)
                for p in passes.launches}
        return total, each
    finally:
        arrays.restore(previous)


_SPIN = r"""
extern "C" __global__ void h3_spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""


QUANT_PASSES_OF_COPY_WANTED = 0.70  # the attention's quantization passes: this share of a copy's rate


def attention_quant_pass_bytes(lens, heads, with_q=True):
    """{pass: bytes it reads and writes} for segments `lens` (the launches of
    _launch.varlen_attention_fp8.quant_launches: bf16 in, e4m3 out, f32 scales, the two f32
    partial sums per key block and channel; V written in whole key blocks). Segments that all
    take the one-read passes (plan.one_read) read K and V once and write no partial sums;
    with_q False: no Q pass (the Hopper kernel's calls)."""
    from h3kernels._launch.varlen_attention_fp8_plan import one_read

    tokens, blocks = sum(lens), sum(-(-n // K_BLOCK) for n in lens)
    e, segs = tokens * heads * HEAD_DIM, len(lens)
    part = 2 * blocks * heads * HEAD_DIM * 4  # the K and V partial sums
    seg_stat = segs * heads * HEAD_DIM * 4  # mu or s_v
    k_pass = 2 * e + e + seg_stat + 4 * blocks * heads
    v_pass = 2 * e + blocks * K_BLOCK * heads * HEAD_DIM + seg_stat
    q_pass = {"q_kernel": 2 * e + e + 4 * tokens * heads} if with_q else {}
    if one_read((0, *itertools.accumulate(lens))):
        return {**q_pass, "k_segment_kernel": k_pass, "v_segment_kernel": v_pass}
    return {**q_pass, "kv_block_kernel": 4 * e + part, "kv_segment_kernel": part + 2 * seg_stat,
            "k_quant_kernel": k_pass, "v_quant_kernel": v_pass}


def attention_quant_least_bytes(lens, heads):
    """The least any quantization scheme moves: q, k, v read once as bf16, written once as e4m3."""
    return 3 * 3 * sum(lens) * heads * HEAD_DIM


def attention_kernel_alone(q, k, v, cu_seqlens, cu_seqlens_host, form=-1, build=None):
    """Runs one call of minimax_h3_varlen_attention_fp8 (torch CUDA tensors q, k, v, cu_seqlens
    and its host copy; fp8_mma_form `form`) through the launch layer and returns a function that
    launches the attention kernel alone again on the same arguments (its LaunchRecord's replay;
    the scratch stays as the call left it, held by the function: the quantization passes are not
    rerun). build: another AttentionBuild of the wgmma kernel (form 3 calls only) to replay the
    launch with, the same grid and parameters (default: the kernel the call ran)."""
    import torch

    from h3kernels._launch import varlen_attention_fp8_sm90a as hopper
    from h3kernels._runtime import arrays, compiler, targets
    from h3kernels.varlen_attention_fp8 import attend

    scratch = []
    out, _, record = attend(q, k, v, cu_seqlens, None, cu_seqlens_host, None, form, False, keep=scratch)
    torch.cuda.synchronize()
    if record is None:
        raise RuntimeError("the call launched no attention kernel (no tokens, or an empty plan)")
    call = arrays.Call(dict(q=q, k=k, v=v, cu_seqlens=cu_seqlens))
    if build is not None:
        ran = targets.operator_form(call.device_id, form)
        if targets.form_family(ran) != targets.WGMMA:
            raise ValueError(f"build: another build of the wgmma kernel replays a form 3 call; this call ran form {ran}")
        record = record._replace(kernel=compiler.kernel(hopper.SOURCE, hopper.KERNEL, hopper.ARCH, build,
                                                        call.device_id))

    def replay():
        previous = call.make_current()
        try:
            return record.replay()
        finally:
            arrays.restore(previous)

    replay.arrays = (q, out, *scratch)  # the record holds their addresses: they live as long as the replay
    return replay


def mlp_gemms_alone(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, gate, residual, fc1_weight_q,
                    fc1_weight_scale, fc2_weight_q, fc2_weight_scale, workspaces, build=None):
    """Runs one call of minimax_h3_mlp_fp8 with fp8_mma_form 3 (torch CUDA tensors; `workspaces`:
    its workspace keywords, a_q to y_scale at least, which keep what the call computed) and
    returns (fc1, fc2): functions that launch its FC1 GEMM (into workspace_y) and its FC2 GEMM
    (into a tensor of their own, fc2.arrays[1]) alone again on those operands, with the call's
    work split (or that of the build's tile_width where it is not 0), in `build` (an MlpBuild;
    default the shipped one). For the wgmma family only."""
    import h3kernels
    from h3kernels._launch import mlp_fp8_sm90a as hopper
    from h3kernels._runtime import arrays
    from h3kernels._runtime.arrays import data_ptr

    h3kernels.minimax_h3_mlp_fp8(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, gate, residual,
                                 fc1_weight_q, fc1_weight_scale, fc2_weight_q, fc2_weight_scale, fp8_mma_form=3,
                                 **workspaces)
    m = x.shape[0]
    call = arrays.Call(dict(x=x))
    build = build or hopper.SHIPPED
    split = hopper.workspace(call, m, build.tile_width)
    split_ptr = None if split is None else data_ptr(split)
    ws = {k: data_ptr(v) for k, v in workspaces.items()}
    out = residual.new_empty(residual.shape)
    args1 = (m, ws["workspace_a_q"], ws["workspace_a_scale"], data_ptr(fc1_weight_q), data_ptr(fc1_weight_scale),
             ws["workspace_y"])
    args2 = (m, ws["workspace_y_q"], ws["workspace_y_scale"], data_ptr(fc2_weight_q), data_ptr(fc2_weight_scale),
             gate, data_ptr(adaln_index), data_ptr(residual), data_ptr(out))

    def on_call_stream(launch, args):
        def run():
            previous = call.make_current()
            try:
                return launch(call, *args, split=split_ptr, build=build)
            finally:
                arrays.restore(previous)
        run.arrays = (split, out)  # the launches hold their addresses
        return run

    return on_call_stream(hopper.launch_fc1, args1), on_call_stream(hopper.launch_fc2_gemm, args2)


def occupy_gpu(ms):
    """Enqueues one kernel that keeps the GPU busy for about `ms` milliseconds on torch's
    current stream (it spins on the global timer, so clocks do not change its length)."""
    import cupy
    import numpy as np
    import torch

    from h3kernels._runtime.arrays import cupy_stream

    dev = torch.cuda.current_device()
    kernel = _spin_kernels.get(dev)
    if kernel is None:
        with cupy.cuda.Device(dev):
            kernel = _spin_kernels[dev] = cupy.RawKernel(_SPIN, "h3_spin")
    with cupy.cuda.Device(dev), cupy_stream(torch.cuda.current_stream().cuda_stream, dev):
        kernel((1,), (1,), (np.uint64(int(ms * 1e6)),))


_spin_kernels = {}


def host_ms_per_call(fn, calls=200, warmup=20, round_calls=50, min_busy_ms=20.0):
    """Host milliseconds per fn() (the median of `calls` timed calls, time.perf_counter) while
    the GPU is busy, so that no call can wait on it: calls run in rounds of `round_calls`, each
    queued behind a spin kernel (occupy_gpu) sized to outlast the round's host time. Returns
    dict(median_ms, mean_ms, p90_ms, calls, busy_rounds, rounds): busy_rounds counts the rounds
    whose GPU work was still queued when their last call returned (all of them, for a valid
    figure)."""
    import torch

    t0 = time.perf_counter()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    est_ms = (time.perf_counter() - t0) * 1e3 / max(warmup, 1)  # host + GPU time: an upper bound
    times, busy, rounds = [], 0, 0
    while len(times) < calls:
        n = min(round_calls, calls - len(times))
        occupy_gpu(max(min_busy_ms, 3.0 * n * est_ms))
        for _ in range(n):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        end = torch.cuda.Event()
        end.record()
        busy += not end.query()
        rounds += 1
        torch.cuda.synchronize()
    ms = sorted(1e3 * t for t in times)
    return dict(median_ms=statistics.median(ms), mean_ms=statistics.fmean(ms), p90_ms=ms[int(0.9 * (len(ms) - 1))],
                calls=len(ms), busy_rounds=busy, rounds=rounds)


def mlp_gemm_flops(m):
    """(FC1's, FC2's) FLOPs at M rows."""
    return 2 * m * HIDDEN * FC1_OUT, 2 * m * FFN * HIDDEN


def mlp_flops(m):
    return sum(mlp_gemm_flops(m))


def attention_flops(seqlens, heads):
    return 4 * sum(int(n) ** 2 for n in seqlens) * heads * HEAD_DIM
