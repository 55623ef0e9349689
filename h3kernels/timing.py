"""CUDA-event timing on the caller's torch stream: warm-up, then the median of many runs."""
import statistics


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


def copy_bandwidth_gbs(nbytes, device="cuda", reps=20):
    """GB/s of a torch device-to-device copy of `nbytes` (bytes read + bytes written, over time)."""
    import torch

    n = max(int(nbytes) // 2, 1)
    src = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), reps=reps)
    return 2 * n / (ms * 1e-3) / 1e9, ms


def row_stage_kernel_ms(arg_sets, a_q, a_scale, eps=1e-5, batch=10, reps=20):
    """Median ms of the MLP row kernel alone: `batch` back-to-back launches with prepared arguments,
    cycling through arg_sets (x, x_norm_weight, adaln_scale, adaln_shift, adaln_index) tuples."""
    from . import dispatch, mlp_fp8_row
    from .mlp_fp8 import row_stage_launch_args

    prepared, call = [], None
    for args in arg_sets:
        call = dispatch.Call(dict(zip("xwsti", args), a_q=a_q, a_scale=a_scale))
        prepared.append(row_stage_launch_args(call, *args, eps, a_q, a_scale))
    stream = call.numba_stream()

    def launches():
        for i in range(batch):
            mlp_fp8_row.launch(*prepared[i % len(prepared)], stream=stream)

    with call.numba_device():
        launches()
        return median_ms(launches, warmup=2, reps=reps) / batch


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
