"""The public weight preparation: the reference's quantization on the caller's device and kind."""
import numpy as np
import pytest
import torch

import h3kernels
from h3kernels import reference as R
from h3kernels.constants import FC1_OUT, FFN, HIDDEN


@pytest.fixture(scope="module")
def cpu_weights(seed_of):
    """bf16 w1 with a zero row (scale 0, codes 0), float32 w2, on the CPU."""
    g = torch.Generator().manual_seed(seed_of("cpu_weights"))
    w1 = (torch.randn(FC1_OUT, HIDDEN, generator=g) * 0.02).bfloat16()
    w1[3] = 0
    w2 = torch.randn(HIDDEN, FFN, generator=g) * 0.02
    return w1, w2


def same(a, b):
    return torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                       b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)


def test_cpu_tensors_give_the_reference(cpu_weights):
    w1, w2 = cpu_weights
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
def test_gpu_arrays_give_the_reference_bitwise(cpu_weights, array_kind):
    """bf16 w1 and float32 w2 on the GPU, as torch tensors or CuPy arrays: the reference's codes and
    scales, bitwise, in arrays of the caller's kind on its device."""
    w1, w2 = cpu_weights
    for prepare, ref, w in ((h3kernels.prepare_minimax_h3_fc1_weight_fp8, R.prepare_minimax_h3_fc1_weight_fp8, w1),
                            (h3kernels.prepare_minimax_h3_fc2_weight_fp8, R.prepare_minimax_h3_fc2_weight_fp8, w2)):
        q, s = prepare(array_kind.to(w.cuda()))
        r, rs = ref(w)
        q, s = array_kind.torch(q, torch.uint8), array_kind.torch(s)
        assert q.is_cuda and same(q.cpu(), r) and same(s.cpu(), rs)
