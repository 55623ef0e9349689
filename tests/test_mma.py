"""One m16n8k32 tile per mma form against a float64 product, and the forms against each other."""
import numpy as np
import pytest
import torch


def random_e4m3(shape, g):
    v = torch.randn(shape, generator=g) * 4
    return torch.clamp(v, -448, 448).to(torch.float8_e4m3fn)


@pytest.mark.gpu
def test_every_form_matches_float64_and_each_other(seed):
    import cupy

    from h3kernels.peers import mma_ceiling

    g = torch.Generator().manual_seed(seed)
    for _ in range(20):
        a, b = random_e4m3((16, 32), g), random_e4m3((8, 32), g)
        exact = a.double() @ b.double().T
        # an FP32 sum of 32 exact products, in the hardware's order: within 32 roundings of
        # 2**-24 of the sum of magnitudes (sm_90 emulates the form with two k=16 HMMAs)
        bound = 32 * 2.0 ** -24 * (a.double().abs() @ b.double().abs().T)
        first = None
        for form in mma_ceiling.supported_forms(0):
            got = cupy.asnumpy(mma_ceiling.mma_tile(cupy.asarray(a.view(torch.uint8).numpy()),
                                                    cupy.asarray(b.view(torch.uint8).numpy()), form))
            assert ((torch.from_numpy(got).double() - exact).abs() <= bound).all(), form
            if first is None:
                first = got
            np.testing.assert_array_equal(got, first)  # every form: bitwise the same sums


@pytest.mark.gpu
def test_ceiling_is_measured():
    from h3kernels.peers import mma_ceiling

    assert mma_ceiling.measure_tflops(0, 0, iters=256, reps=3) > 10


@pytest.mark.gpu
def test_wgmma_ceiling_is_measured_on_compute_capability_9():
    from h3kernels._launch.wgmma_ceiling import CeilingBuild
    from h3kernels.peers import mma_ceiling, wgmma_ceiling

    if torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("wgmma needs compute capability 9.0")
    # the e4m3 wgmma issues at several times the emulated mma.sync rate on Hopper (docs/kernels/mlp_sm90.md)
    assert wgmma_ceiling.measure_wgmma_tflops(0, iters=256, reps=3) > 2 * mma_ceiling.measure_tflops(0, 0, iters=256,
                                                                                                     reps=3)
    # on a caller's operand bytes (finite e4m3: the exponent's top bit clear), one tile pair per SM
    g = torch.Generator(device="cuda").manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    a, b = (torch.randint(0, 256, (sms * n,), generator=g, device="cuda", dtype=torch.uint8) & 0xBF
            for n in (CeilingBuild.a_bytes, CeilingBuild.b_bytes))
    assert wgmma_ceiling.measure_wgmma_tflops(0, iters=256, reps=3, operands=(a, b)) > 2 * mma_ceiling.measure_tflops(
        0, 0, iters=256, reps=3)


def test_wgmma_ceiling_is_none_with_the_reason_off_compute_capability_9(monkeypatch):
    from h3kernels._runtime import targets
    from h3kernels.peers import wgmma_ceiling

    monkeypatch.setattr(targets, "device_arch", lambda dev: "sm_120a")
    errors = []
    assert wgmma_ceiling.ceiling_tflops(0, on_error=errors.append) is None
    assert len(errors) == 1 and "compute capability 9.0" in str(errors[0])


def test_wgmma_ceiling_refuses_operands_too_short_for_every_sm(monkeypatch):
    from h3kernels._launch.wgmma_ceiling import CeilingBuild
    from h3kernels._runtime import targets
    from h3kernels.peers import wgmma_ceiling

    monkeypatch.setattr(targets, "device_arch", lambda dev: "sm_90")
    monkeypatch.setattr(targets, "sm_count", lambda dev: 4)
    a = torch.zeros(4 * CeilingBuild.a_bytes, dtype=torch.uint8)
    for b, what in ((torch.zeros(4 * CeilingBuild.b_bytes - 1, dtype=torch.uint8), "at least 131072"),
                    (torch.zeros(4 * CeilingBuild.b_bytes // 2, dtype=torch.int16), "1-byte")):
        with pytest.raises(ValueError, match=what):
            wgmma_ceiling.ceiling_launch(0, operands=(a, b))
