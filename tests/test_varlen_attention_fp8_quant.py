"""The attention quantization passes (Numba), bitwise against h3kernels.reference: in the CUDA
simulator without a GPU, on the GPU with one."""
import numpy as np
import pytest

from h3kernels.testing import simulator as numba_check
from h3kernels._launch.numba import varlen_attention_fp8_quant as Q
from h3kernels.testing.inputs import make_attention_inputs
from numba.cuda import config

# These tests launch the passes on a few segments: grids far smaller than the GPU, by design.
pytestmark = pytest.mark.filterwarnings("ignore:.*will likely result in GPU under-utilization")

SIM = bool(config.ENABLE_CUDASIM)


def hard_inputs(seqlens, heads, seed):
    # a large per-channel offset of K: what smoothing removes
    q, k, v, _, cu = make_attention_inputs(seqlens, heads, device="cpu", seed=seed, k_offset=40.0)
    t = cu[-1]
    long_seg = int(np.argmax(seqlens))
    if seqlens[long_seg] >= 128 and heads > 1:
        # s_k = 0 needs k' = k - mu = 0, i.e. keys equal to their segment's mean: a constant block
        # inside a varying segment still has k' != 0 (and s_k > 0). So head 1's longest segment is
        # constant throughout (mu = 3 exactly): every one of its 128-key blocks gets s_k = 0.
        k[cu[long_seg]:cu[long_seg + 1], 1] = 3.0
    if t > 8:
        v[:, 0, 5] = 0  # a zero V channel
        q[7] = 0  # zero Q rows
    return q, k, v, cu


def check(seqlens, heads, seed):
    """Every output of the passes (into poisoned arrays) against the reference, bitwise; v8t's
    padding columns included (zeros)."""
    mismatches = numba_check.attention_pass_mismatches(*hard_inputs(seqlens, heads, seed))
    assert not mismatches, f"differ from the reference: {mismatches}"


# small: the simulator runs ~1,000 threads a second. The first case has an empty segment, a
# one-key one and one of two key blocks; the second adds a block of 127 keys and head 1's constant keys.
@pytest.mark.skipif(not SIM, reason="the simulator runs when there is no GPU")
@pytest.mark.parametrize("seqlens,heads", [([0, 1, 130], 1), pytest.param([0, 1, 127, 0, 130], 2, marks=pytest.mark.slow)])
def test_simulator_passes_equal_the_reference(seqlens, heads, seed):
    check(seqlens, heads, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("seqlens,heads", [([0, 1, 127, 128, 129, 0, 300], 2), ([4096], 8), ([700, 0, 33], 56)])
def test_gpu_passes_equal_the_reference(seqlens, heads, seed):
    check(seqlens, heads, seed)


def test_v_layout_permutes_each_16_key_group_and_zero_pads():
    perm = Q.v_key_at(np.arange(128, dtype=np.uint64)).astype(np.int64)
    assert sorted(perm.tolist()) == list(range(128))
    assert perm[:16].tolist() == [0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15]
    assert (perm // 16 == np.arange(128) // 16).all()
    v8 = np.arange(1, 1 + 150 * 2 * 128, dtype=np.int64).reshape(150, 2, 128) % 251 + 1
    v8 = v8.astype(np.uint8)  # no zero codes: padding is told apart
    cu = [0, 3, 3, 150]  # blocks: (seg 0, 0, 3), (seg 2, 3, 128), (seg 2, 131, 19)
    vt = Q.v_transposed(v8, cu)
    assert vt.shape == (2, 128, 3 * 128)
    for b, (first, count) in enumerate([(0, 3), (3, 128), (131, 19)]):
        for p in range(128):
            col = vt[:, :, b * 128 + p]
            if perm[p] < count:
                assert np.array_equal(col, v8[first + perm[p]])
            else:
                assert not col.any()


@pytest.mark.skipif(not SIM, reason="the simulator runs when there is no GPU (GPU twin: test_gpu_infinite_scales)")
def test_infinite_q_and_v_scales_divide(seed):
    """An Inf in a Q row or a V channel makes that scale inf; its codes are those of x / inf (zeros,
    NaN for the Inf itself), as the reference's, not the NaNs that inv = 0 would give."""
    with pytest.warns(RuntimeWarning, match="invalid value encountered"):  # inf / inf: NaN, as on the GPU
        check_infinite_scales(seed)


@pytest.mark.gpu
def test_gpu_infinite_scales(seed):
    check_infinite_scales(seed)


def passes_on(heads, seed, edit):
    """(q, k, v, cu, the passes' outputs) on two segments [5, 65] of random q, k, v with
    `edit(q, k, v)` applied (in place, to the bf16 tensors)."""
    q, k, v, _, cu = make_attention_inputs([5, 65], heads, device="cpu", seed=seed)
    edit(q, k, v)
    return q, k, v, cu, numba_check.attention_passes(q, k, v, cu)


def check_infinite_scales(seed):
    def edit(q, k, v):
        q[3, 0, 7] = float("inf")
        v[40, 0, 100] = float("-inf")

    q, k, v, cu, out = passes_on(1, seed, edit)
    assert np.isinf(out["s_q"][3, 0]) and np.isinf(out["s_v"][1, 0, 100])
    mismatches = numba_check.attention_pass_mismatches(q, k, v, cu, out)  # NaN codes alike, s_k included
    assert not mismatches, f"differ from the reference: {mismatches}"


@pytest.mark.skipif(not SIM, reason="the simulator runs when there is no GPU (GPU twin: test_gpu_nan_scales)")
def test_nan_scales_give_zero_codes(seed):
    """A NaN in a Q row, a K element or a V channel makes that row's s_q, the segment and head's
    s_k and that channel's s_v NaN (amaxes keep NaN, as the reference's torch amax), with zero
    codes; the Python or PTX max would drop the NaN and quantize against the other values."""
    check_nan_scales(seed)


@pytest.mark.gpu
def test_gpu_nan_scales(seed):
    check_nan_scales(seed)


def check_nan_scales(seed):
    def edit(q, k, v):
        q[3, 1, 7] = float("nan")
        k[40, 0, 100] = float("nan")
        v[20, 1, 9] = float("nan")

    q, k, v, cu, out = passes_on(2, seed, edit)
    assert np.isnan(out["s_q"][3, 1]) and np.isnan(out["s_k"][1:, 0]).all() and np.isnan(out["s_v"][1, 1, 9])
    mismatches = numba_check.attention_pass_mismatches(q, k, v, cu, out)  # NaN where the reference's are
    assert not mismatches, f"differ from the reference: {mismatches}"
    assert (out["q8"][3, 1] == 0).all() and (out["k8"][5:, 0] == 0).all()
