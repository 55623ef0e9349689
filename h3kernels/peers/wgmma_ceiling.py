"""The e4m3 wgmma ceiling of the current GPU (sm_90a): the yardstick of the wgmma family
(fp8_mma_form 3), as h3kernels.peers.mma_ceiling is that of the mma.sync forms. Back-to-back
m64n256k32 wgmmas with both operands in shared memory, one CTA per SM."""
from h3kernels._launch import wgmma_ceiling as launch
from h3kernels._runtime import targets

FAMILY = "wgmma"


def measure_wgmma_tflops(device_id=0, iters=4096, reps=10, **variant):
    """Tensor TFLOP/s of dense back-to-back e4m3 wgmma on every SM (median of reps). ValueError
    on a device that is not compute capability 9.0. `variant` overrides defines of the build
    (WARPGROUPS, K_STEPS: h3kernels/_launch/wgmma_ceiling.py)."""
    import numpy as np
    import torch

    from h3kernels.testing.timing import median_ms

    arch = targets.device_arch(device_id)
    if arch != "sm_90":
        raise ValueError(f"the wgmma ceiling needs compute capability 9.0 (sm_90a); device {device_id} is {arch}")
    with torch.cuda.device(device_id):
        ctas = targets.sm_count(device_id)
        k, d = launch.kernel(device_id, **variant)
        threads = 128 * d["WARPGROUPS"]
        sink = torch.zeros(ctas * threads, dtype=torch.float32, device=f"cuda:{device_id}")
        stream = torch.cuda.current_stream().cuda_stream
        ms = median_ms(lambda: k.launch(stream, (ctas, 1), threads, (sink.data_ptr(), np.int32(iters))), reps=reps)
    return launch.flops(ctas, iters, d) / (ms * 1e-3) / 1e12


def ceiling_tflops(device_id, on_error=None):
    """measure_wgmma_tflops, or None where it cannot run (not sm_90, no compiler...; on_error(err)
    hears why): a benchmark still reports its operators' times without the ceiling."""
    try:
        return measure_wgmma_tflops(device_id)
    except Exception as err:
        if on_error is not None:
            on_error(err)
        return None
