"""GPU time of a function on the caller's torch stream, by CUDA events: the median of one call
per event pair (host latency included: the GPU is idle when each run starts), or of back-to-back
calls (host work overlapped). The peers and the benches time with these."""
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


def median_ms_batched(fn, batch=4, warmup=1, reps=5, setup=None, warm_ms=30.0):
    """Median over `reps` of (time of `batch` back-to-back fn() calls between one pair of CUDA
    events) / batch. Each call's host work overlaps the previous call's GPU work, so per-call
    host latency drops out once the GPU time per call exceeds it (median_ms includes it: the GPU
    is idle when each of its runs starts); the first call of a batch still adds 1/batch of it.
    setup(i) runs before call i inside the timed region: keep it host-only (pick an input set).
    Warm-up: `warmup` batches, and more until `warm_ms` of wall time has passed: a GPU left idle
    (a compile before the first call) idles at a low SM clock (the H200: 345 MHz against 1980
    under load), and a warm-up counted in calls of a 0.15 ms operator may end before it rises."""
    import time

    import torch

    i, t0 = 0, time.perf_counter()
    while i < warmup * batch or (time.perf_counter() - t0) * 1e3 < warm_ms:
        for _ in range(batch):
            if setup:
                setup(i)
            fn()
            i += 1
        torch.cuda.synchronize()
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
