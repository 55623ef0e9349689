"""The e4m3 wgmma ceiling of the current GPU (sm_90a): the yardstick of the wgmma family
(fp8_mma_form 3), as h3kernels.peers.mma_ceiling is that of the mma.sync forms. Back-to-back
m64n256k32 wgmmas with both operands in shared memory, one CTA per SM."""
from h3kernels._launch import wgmma_ceiling as launch
from h3kernels._runtime import targets

FAMILY = "wgmma"


def ceiling_launch(device_id=0, iters=4096, build=None, operands=None):
    """(launch, FLOPs): a function that launches the ceiling once on the current stream (iters
    wgmma groups per warpgroup), and the tensor FLOPs of one launch. ValueError on a device that
    is not compute capability 9.0, or for operands that are not as below. build: a
    wgmma_ceiling.CeilingBuild (default: two warpgroups of m64n256k32, four per commit group).
    operands: None (a fixed pattern of finite e4m3 bytes), or (a, b), two contiguous 1-byte
    tensors on the device (e4m3 or uint8) of at least SMs x CeilingBuild.a_bytes and SMs x b_bytes
    elements: each CTA's tiles then hold a GEMM's own operand bits (lab/mlp_power.py)."""
    import numpy as np
    import torch

    arch = targets.device_arch(device_id)
    if arch != "sm_90":
        raise ValueError(f"the wgmma ceiling needs compute capability 9.0 (sm_90a); device {device_id} is {arch}")
    build = build or launch.CeilingBuild()
    ctas = targets.sm_count(device_id)
    src = (0, 0)
    if operands is not None:
        for name, t, need in zip("ab", operands, (ctas * build.a_bytes, ctas * build.b_bytes)):
            if not t.is_contiguous() or t.element_size() != 1 or t.numel() < need:
                raise ValueError(f"operands: {name} must be a contiguous 1-byte tensor of at least {need} "
                                 f"elements; got {tuple(t.shape)} {t.dtype}")
        src = tuple(t.data_ptr() for t in operands)
    with torch.cuda.device(device_id):
        k = launch.kernel(device_id, build)
        sink = torch.zeros(ctas * build.threads, dtype=torch.float32, device=f"cuda:{device_id}")

    def run():
        k.launch(torch.cuda.current_stream().cuda_stream, (ctas, 1), build.threads,
                 (sink.data_ptr(), np.int32(iters), *src))

    return run, build.flops(ctas, iters)


def measure_wgmma_tflops(device_id=0, iters=4096, reps=10, build=None, operands=None):
    """Tensor TFLOP/s of dense back-to-back e4m3 wgmma on every SM (median of reps): ceiling_launch
    timed."""
    import torch

    from h3kernels.timing import median_ms

    run, flops = ceiling_launch(device_id, iters, build, operands)
    with torch.cuda.device(device_id):
        ms = median_ms(run, reps=reps)
    return flops / (ms * 1e-3) / 1e12


def ceiling_tflops(device_id, on_error=None):
    """measure_wgmma_tflops, or None where it cannot run (not sm_90, no compiler...; on_error(err)
    hears why): a benchmark still reports its operators' times without the ceiling."""
    try:
        return measure_wgmma_tflops(device_id)
    except Exception as err:
        if on_error is not None:
            on_error(err)
        return None
