"""The public weight preparation: the reference's quantization on the caller's device and kind."""
import numpy as np
import pytest
import torch

import h3kernels
from h3kernels import reference as R
from h3kernels.constants import FC1_OUT, FFN, HIDDEN


@pytest.fixture(scope="module")
def weights():
    g = torch.Generator().manual_seed(torch.seed())
    w1 = (torch.randn(FC1_OUT, HIDDEN, generator=g) * 0.02).bfloat16()
    w1[3] = 0
    w2 = torch.randn(HIDDEN, FFN, generator=g) * 0.02
    return w1, w2


def same(a, b):
    return torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                       b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)


def test_cpu_tensors_give_the_reference(weights):
    w1, w2 = weights
    q1, s1 = h3kernels.prepare_minimax_h3_fc1_weight_fp8(w1)
    r1, rs1 = R.prepare_minimax_h3_fc1_weight_fp8(w1)
    assert same(q1, r1) and same(s1, rs1)
    q2, s2 = h3kernels.prepare_minimax_h3_fc2_weight_fp8(w2.half())
    r2, rs2 = R.prepare_minimax_h3_fc2_weight_fp8(w2.half())
    assert same(q2, r2) and same(s2, rs2) and q2.dtype == torch.float8_e4m3fn


@pytest.mark.parametrize("w,exc,msg", [
    (np.zeros((FC1_OUT, HIDDEN), np.float32), TypeError, "w1: got numpy.ndarray; need a torch tensor or a CuPy array"),
    (torch.zeros(FC1_OUT, 8), ValueError, r"w1: got shape \(28672, 8\); need shape \(28672, 5376\)"),
    (torch.zeros(4, 4, dtype=torch.int32), TypeError, "w1: got torch.int32; need bfloat16, float16 or float32"),
])
def test_bad_weights_are_refused(w, exc, msg):
    with pytest.raises(exc, match=msg):
        h3kernels.prepare_minimax_h3_fc1_weight_fp8(w)


@pytest.mark.gpu
def test_cuda_tensors_give_the_reference_bitwise(weights):
    w1, w2 = weights
    q1, s1 = h3kernels.prepare_minimax_h3_fc1_weight_fp8(w1.cuda())
    r1, rs1 = R.prepare_minimax_h3_fc1_weight_fp8(w1)
    assert q1.is_cuda and same(q1.cpu(), r1) and same(s1.cpu(), rs1)
    q2, s2 = h3kernels.prepare_minimax_h3_fc2_weight_fp8(w2.cuda())
    r2, rs2 = R.prepare_minimax_h3_fc2_weight_fp8(w2)
    assert same(q2.cpu(), r2) and same(s2.cpu(), rs2)


@pytest.mark.gpu
def test_cupy_arrays_return_cupy(weights):
    import cupy

    w1, _ = weights
    w1c = cupy.from_dlpack(w1.cuda().view(torch.int16)).view(cupy.uint16)
    q, s = h3kernels.prepare_minimax_h3_fc1_weight_fp8(w1c)
    assert isinstance(q, cupy.ndarray) and isinstance(s, cupy.ndarray)
    r, rs = R.prepare_minimax_h3_fc1_weight_fp8(w1)
    assert np.array_equal(cupy.asnumpy(q.view(cupy.uint8)), r.view(torch.uint8).numpy())
    assert np.array_equal(cupy.asnumpy(s), rs.numpy())
