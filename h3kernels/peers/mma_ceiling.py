"""The e4m3 mma.sync ceiling of the current GPU, and a single m16n8k32 tile per mma form.

Both benchmarks measure their operator against this ceiling; the tile lets tests check the
fragment layout and that every mma form gives the same sums."""
from h3kernels._runtime import compiler, targets

CHAINS = 8  # as in cuda_src/mma_ceiling.cu
FLOP_PER_MMA = 2 * 16 * 8 * 32


def supported_forms(device_id=0):
    return targets.MMA_FORMS[targets.arch_for(targets.device_cc(device_id))]


def mma_tile(a, b, form=0):
    """a: uint8 CuPy [16, 32] e4m3 bits, b: uint8 [8, 32] (B^T); returns float32 [16, 8] = a @ b.T."""
    import cupy

    d = cupy.full((16, 8), cupy.nan, dtype=cupy.float32)
    f = compiler.get_function("mma_ceiling", "h3_mma_tile", a.device.id, {"H3_MMA_FORM": form})
    f((1,), (32,), (a, b, d))
    return d


def measure_tflops(device_id=0, form=0, iters=4096, reps=10):
    """Tensor TFLOP/s of dense back-to-back e4m3 mma.sync on every SM (median of reps)."""
    import cupy
    import numpy as np

    from h3kernels._runtime.arrays import cupy_stream
    from h3kernels.timing import median_ms

    with cupy.cuda.Device(device_id):
        sms = targets.device_properties(device_id)["multiProcessorCount"]
        blocks, threads = sms * 8, 128
        sink = cupy.zeros(blocks * threads, dtype=cupy.float32)
        f = compiler.get_function("mma_ceiling", "h3_mma_ceiling", device_id, {"H3_MMA_FORM": form})

        def run():
            f((blocks,), (threads,), (sink, np.int32(iters), np.uint32(0x9E3779B9)))

        import torch

        with torch.cuda.device(device_id):
            stream = torch.cuda.current_stream()
            with cupy_stream(stream.cuda_stream, device_id):
                ms = median_ms(run, reps=reps)
    flops = blocks * (threads // 32) * iters * CHAINS * FLOP_PER_MMA
    return flops / (ms * 1e-3) / 1e12


def ceiling_tflops(device_id, form, on_error=None):
    """measure_tflops, or None when the ceiling kernel cannot run here (on_error(err) hears why):
    a benchmark still reports its operators' times without the ceiling."""
    try:
        return measure_tflops(device_id, form)
    except Exception as err:
        if on_error is not None:
            on_error(err)
        return None
