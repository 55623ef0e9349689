"""What the benchmark scripts share: timestamped logging, short error text, the mma ceiling, host time per call."""
import time

T0 = time.time()


def elapsed():
    """Seconds since the benchmark process imported this module."""
    return time.time() - T0


def log(msg):
    print(f"[{elapsed():6.1f}s] {msg}", flush=True)


def short(err, n=240):
    s = f"{type(err).__name__}: {err}".replace("\n", " ")
    return s if len(s) <= n else s[:n] + " ..."


def ceiling_tflops(dev, form):
    """This GPU's e4m3 ceiling of the instruction family of `form` (wgmma for form 3, mma.sync
    otherwise: h3kernels.cli.bench.ceiling_tflops), or None when it cannot run."""
    from h3kernels.cli.bench import ceiling_tflops as family_ceiling

    return family_ceiling(dev, form, on_error=lambda err: log(f"e4m3 ceiling of form {form}: failed " + short(err)))


def host_ms(fn, calls=5):
    """Host milliseconds per fn() call, each issued while the GPU is still busy with an earlier
    call, so that no call waits for it; a call that synchronizes shows about its GPU time here."""
    import torch

    torch.cuda.synchronize()
    fn()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    ms = (time.perf_counter() - t) * 1e3 / calls
    torch.cuda.synchronize()
    return ms
