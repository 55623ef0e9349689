"""The e4m3 wgmma ceiling of the current GPU (sm_90a): the yardstick of the wgmma family
(fp8_mma_form 3), as h3kernels.peers.mma_ceiling is that of the mma.sync forms. Back-to-back
m64n256k32 wgmmas with both operands in shared memory, one CTA per SM."""
from h3kernels._launch import wgmma_ceiling as launch
from h3kernels._runtime import targets

FAMILY = "wgmma"


def measure_wgmma_tflops(device_id=0, iters=4096, reps=10, build=None):
    """Tensor TFLOP/s of dense back-to-back e4m3 wgmma on every SM (median of reps). ValueError
    on a device that is not compute capability 9.0. build: a wgmma_ceiling.CeilingBuild (default:
    two warpgroups of m64n256k32, four per commit group)."""
    import numpy as np
    import torch

    from h3kernels.timing import median_ms

    arch = targets.device_arch(device_id)
    if arch != "sm_90":
        raise ValueError(f"the wgmma ceiling needs compute capability 9.0 (sm_90a); device {device_id} is {arch}")
    build = build or launch.CeilingBuild()
    with torch.cuda.device(device_id):
        ctas = targets.sm_count(device_id)
        k = launch.kernel(device_id, build)
        sink = torch.zeros(ctas * build.threads, dtype=torch.float32, device=f"cuda:{device_id}")
        stream = torch.cuda.current_stream().cuda_stream
        ms = median_ms(lambda: k.launch(stream, (ctas, 1), build.threads, (sink.data_ptr(), np.int32(iters))),
                       reps=reps)
    return build.flops(ctas, iters) / (ms * 1e-3) / 1e12


def ceiling_tflops(device_id, on_error=None):
    """measure_wgmma_tflops, or None where it cannot run (not sm_90, no compiler...; on_error(err)
    hears why): a benchmark still reports its operators' times without the ceiling."""
    try:
        return measure_wgmma_tflops(device_id)
    except Exception as err:
        if on_error is not None:
            on_error(err)
        return None
