"""The GPU's FP32 -> e4m3 conversion near every rounding midpoint, against the contract's rounding."""
import numpy as np
import pytest
import torch

from h3kernels import reference as R


def near_midpoints(seed):
    """Every midpoint between adjacent finite e4m3 values, +-4 ulps, both signs, plus random values."""
    vals = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()[:0x7F]
    mid = ((vals[:-1].astype(np.float64) + vals[1:]) / 2).astype(np.float32)
    u = mid.view(np.uint32).astype(np.int64)
    around = np.concatenate([u + d for d in range(-4, 5)]).astype(np.uint32).view(np.float32)
    rng = np.random.default_rng(seed)
    rand = (rng.standard_normal(1 << 20) * 2.0 ** rng.integers(-12, 9, 1 << 20)).astype(np.float32)
    v = np.concatenate([around, rand])
    return np.concatenate([v, -v])


def convert_gpu(v):
    import cupy

    from h3kernels._runtime import compiler

    inp = cupy.asarray(v)
    out = cupy.full(v.shape, 0x7F, dtype=cupy.uint8)
    f = compiler.get_function("fp8_convert", "h3_f32_to_e4m3", inp.device.id)
    f((256,), (256,), (inp, out, np.int64(v.size)))
    return cupy.asnumpy(out)


@pytest.mark.gpu
def test_gpu_conversion_is_correctly_rounded_next_to_every_midpoint(seed):
    v = near_midpoints(seed)
    want = R.e4m3(torch.from_numpy(v)).view(torch.uint8).numpy()
    got = convert_gpu(v)
    bad = np.nonzero(got != want)[0]
    assert len(bad) == 0, [(float(v[i]), int(got[i]), int(want[i])) for i in bad[:8]]
    torch_gpu = R.e4m3(torch.from_numpy(v).cuda()).view(torch.uint8).cpu().numpy()
    assert np.array_equal(torch_gpu, want)  # torch's own CUDA conversion agrees too
