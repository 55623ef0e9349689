"""What the benchmark scripts share: timestamped logging, short error text, the mma ceiling."""
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
    try:
        from h3kernels import mma_ceiling

        return mma_ceiling.measure_tflops(dev, form)
    except Exception as err:
        log("e4m3 mma.sync ceiling: failed " + short(err))
        return None
