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
    """This GPU's e4m3 mma.sync ceiling (h3kernels.mma_ceiling), or None when it cannot run."""
    from h3kernels.peers import mma_ceiling

    return mma_ceiling.ceiling_tflops(dev, form,
                                      on_error=lambda err: log("e4m3 mma.sync ceiling: failed " + short(err)))


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
