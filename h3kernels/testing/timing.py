"""CUDA-event timing on the caller's torch stream: warm-up, then the median of many runs."""
import statistics

from h3kernels.constants import FC1_OUT, FFN, HEAD_DIM, HIDDEN


def median_ms(fn, warmup=3, reps=20, setup=None):
    """Median milliseconds of fn() over `reps` runs; setup(i), if given, runs untimed before run i
    (rotate inputs there so that repeated runs do not measure the L2 cache)."""
    import torch

    for i in range(warmup):
        if setup:
            setup(i)
        fn()
    times = []
    for i in range(reps):
        if setup:
            setup(i)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


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
    """Median ms of the MLP row kernel alone: `batch` back-to-back launches with prepared arguments,
    cycling through arg_sets (x, x_norm_weight, adaln_scale, adaln_shift, adaln_index) tuples."""
    from h3kernels._runtime import arrays as dispatch
    from h3kernels._launch.numba import mlp_fp8_row
    from h3kernels.mlp_fp8 import row_stage_launch_args

    prepared, call = [], None
    for args in arg_sets:
        call = dispatch.Call(dict(zip("xwsti", args), a_q=a_q, a_scale=a_scale))
        prepared.append(row_stage_launch_args(call, *args, eps, a_q, a_scale))
    stream = call.numba_stream()
    cur = {}
    with call.numba_device():
        return median_ms_batched(lambda: mlp_fp8_row.launch(*cur["args"], stream=stream), batch=batch, warmup=2,
                                 reps=reps, setup=lambda i: cur.update(args=prepared[i % len(prepared)]))


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


def median_ms_batched(fn, batch=4, warmup=1, reps=5, setup=None):
    """Median over `reps` of (time of `batch` back-to-back fn() calls between one pair of CUDA
    events) / batch. Each call's host work overlaps the previous call's GPU work, so per-call
    host latency drops out once the GPU time per call exceeds it (median_ms includes it: the GPU
    is idle when each of its runs starts); the first call of a batch still adds 1/batch of it.
    setup(i) runs before call i inside the timed region: keep it host-only (pick an input set)."""
    import torch

    for i in range(warmup * batch):
        if setup:
            setup(i)
        fn()
    times = []
    for r in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for b in range(batch):
            if setup:
                setup(r * batch + b)
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / batch)
    return statistics.median(times)


def attention_quant_kernel_ms(q, k, v, cu_seqlens, cu_seqlens_host, budget_ms=150.0, reps=5):
    """(total, {kernel name: ms}): median ms of the attention's quantization passes alone, and of
    each pass alone. varlen_attention_fp8_quant.launch (or one pass) with the arguments the
    operator gives it (varlen_attention_fp8.quant_launch_args), into a workspace of our own,
    back-to-back launches between one pair of events, the batch sized to about budget_ms per timed
    run. q, k, v, cu_seqlens: torch CUDA tensors."""
    import torch

    from h3kernels._runtime import arrays as dispatch
    from h3kernels import varlen_attention_fp8 as attn
    from h3kernels._launch.numba import varlen_attention_fp8_quant as quant
    from h3kernels._launch.varlen_attention_fp8_plan import plan_host

    cu = tuple(int(c) for c in cu_seqlens_host)
    tokens, heads = int(q.shape[0]), int(q.shape[1])
    blocks = torch.from_numpy(quant.key_blocks(cu)).to(q.device)
    block_offset = torch.from_numpy(plan_host(cu, heads)[1]).to(q.device)
    parts, nbytes = attn.layout(tokens, heads, len(cu) - 1, int(blocks.shape[0]))
    mem = torch.empty(nbytes, dtype=torch.uint8, device=q.device)
    call = dispatch.Call(dict(q=q, k=k, v=v, cu_seqlens=cu_seqlens))
    args = attn.quant_launch_args(call, q, k, v, cu_seqlens, blocks, block_offset, mem.data_ptr(), mem, parts)
    stream = call.numba_stream()
    with call.numba_device():
        one = lambda: quant.launch(*args, stream=stream)
        one()
        batch = max(1, min(20, int(budget_ms / max(median_ms(one, warmup=1, reps=3), 1e-3))))
        total = median_ms_batched(one, batch=batch, warmup=1, reps=reps)
        each = {name: median_ms_batched(run, batch=batch, warmup=1, reps=reps)
                for name, run in quant.passes(*args, stream=stream)}
        return total, each


def mlp_flops(m):
    return 2 * m * HIDDEN * FC1_OUT + 2 * m * FFN * HIDDEN


def attention_flops(seqlens, heads):
    return 4 * sum(int(n) ** 2 for n in seqlens) * heads * HEAD_DIM
