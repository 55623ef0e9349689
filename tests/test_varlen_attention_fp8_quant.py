"""The attention quantization passes (Numba), bitwise against h3kernels.reference: in the CUDA
simulator without a GPU, on the GPU with one."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from h3kernels import reference as R
from h3kernels.testing import simulator as numba_check
from h3kernels._launch import host
from h3kernels._launch.numba import varlen_attention_fp8_quant as Q
from h3kernels._launch.varlen_attention_fp8_plan import grid_blocks, plan_host
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


def check(seqlens, heads, seed, one_read=None):
    """Every output of the passes (into poisoned arrays) against the reference, bitwise; v8t's
    padding columns included (zeros). one_read: the one-read K and V passes or the four others
    (None: as the operator picks)."""
    mismatches = numba_check.attention_pass_mismatches(*hard_inputs(seqlens, heads, seed), one_read=one_read)
    assert not mismatches, f"differ from the reference: {mismatches}"


# small: the simulator runs ~1,000 threads a second. The first case has an empty segment, a
# one-key one and one of two key blocks; the second adds a block of 127 keys and head 1's constant
# keys. Both fit the one-read passes, and run both ways.
@pytest.mark.skipif(not SIM, reason="the simulator runs when there is no GPU")
@pytest.mark.parametrize("one_read", [True, False])
@pytest.mark.parametrize("seqlens,heads", [([0, 1, 130], 1), pytest.param([0, 1, 127, 0, 130], 2, marks=pytest.mark.slow)])
def test_simulator_passes_equal_the_reference(seqlens, heads, one_read, seed):
    check(seqlens, heads, seed, one_read)


@pytest.mark.gpu
@pytest.mark.parametrize("seqlens,heads", [([0, 1, 127, 128, 129, 0, 300], 2), ([4096], 8), ([700, 0, 33], 56),
                                           ([256, 0, 1, 255, 128, 129, 200], 56)])
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


def edited_inputs(heads, seed, edit):
    """(q, k, v, cu): two segments [5, 65] of random q, k, v with `edit(q, k, v)` applied (in
    place, to the bf16 tensors)."""
    q, k, v, _, cu = make_attention_inputs([5, 65], heads, device="cpu", seed=seed)
    edit(q, k, v)
    return q, k, v, cu


def passes_on(heads, seed, edit):
    """(q, k, v, cu, the passes' outputs) on edited_inputs."""
    q, k, v, cu = edited_inputs(heads, seed, edit)
    return q, k, v, cu, numba_check.attention_passes(q, k, v, cu)


def check_infinite_scales(seed):
    def edit(q, k, v):
        q[3, 0, 7] = float("inf")
        v[40, 0, 100] = float("-inf")

    q, k, v, cu, out = passes_on(1, seed, edit)
    assert np.isinf(out["s_q"][3, 0]) and np.isinf(out["s_v"][1, 0, 100])
    mismatches = numba_check.attention_pass_mismatches(q, k, v, cu, out)  # NaN codes alike, s_k included
    assert not mismatches, f"differ from the reference: {mismatches}"


@pytest.mark.skipif(not SIM, reason="the simulator runs when there is no GPU (GPU twin: test_gpu_tiny_key_scales)")
def test_tiny_key_scales_divide(seed):
    """K's codes come from the division-free quotient where the block's s_k is at least
    MIN_FAST_SCALE_FP32 (2^-90) and from divisions below it: segment 0's keys scaled to s_k about
    7e-29, segment 1's to about 7e-27 (its smallest nonzero codes' k' near 1e-29); both the
    reference's bits, in both K passes."""
    check_tiny_key_scales(seed)


@pytest.mark.gpu
def test_gpu_tiny_key_scales(seed):
    check_tiny_key_scales(seed)


def check_tiny_key_scales(seed):
    def edit(q, k, v):
        k[:5] *= 1e-26
        k[5:] *= 1e-24

    q, k, v, cu = edited_inputs(2, seed, edit)
    for one_read in (True, False):  # the one-read K pass and k_quant_kernel
        out = numba_check.attention_passes(q, k, v, cu, one_read)
        s_k = out["s_k"]
        assert (s_k[0] < 2.0 ** -90).all() and (s_k[1:] > 2.0 ** -90).all(), s_k
        mismatches = numba_check.attention_pass_mismatches(q, k, v, cu, out)
        assert not mismatches, f"one_read={one_read}: differ from the reference: {mismatches}"


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


# A rank's keys on its segments' 128-key grids: segment i's keys here start RANK_INTO[i] keys into
# the whole segment, so its first block ends RANK_INTO[i] % 128 keys short of 128: 0, 5, 70 and
# 127 (a block of one key), and an empty segment. Small: the simulator runs a few thousand threads
# a second.
RANK_SEQLENS, RANK_INTO = [130, 5, 0, 200, 60], (0, 5, 33, 70 + 128, 127)


def rank_blocks(cu):
    return grid_blocks(tuple(cu), RANK_INTO)


def test_grid_blocks_are_the_whole_segments_blocks():
    cu = (0, 130, 135, 135, 335, 395)
    offset, blocks = grid_blocks(cu, (0,) * 5)
    assert np.array_equal(blocks, Q.key_blocks(cu)) and np.array_equal(offset, plan_host(cu, 1)[1])
    assert rank_blocks(cu)[1][:, 2].tolist() == [128, 2, 5, 58, 128, 14, 1, 59]


def segment_amax(x, cu):
    """amax |x| over each segment's keys, f32 [segments, heads, 128] (zeros where empty)."""
    out = torch.zeros((len(cu) - 1, *x.shape[1:]), dtype=torch.float32)
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        if b > a:
            out[i] = x[a:b].float().abs().amax(dim=0)
    return out


def per_key(values, blocks):
    """f32 [n, heads] per block -> per key [tokens, heads] (the reference's k_scale)."""
    return torch.from_numpy(np.repeat(values, blocks[:, 2], axis=0))


@pytest.fixture(scope="module")
def grid_runs(seed_of):
    """The K passes on a rank's grid blocks (RANK_INTO), with head 1's longest segment constant
    (s_k = 0) and a NaN in segment 0's first block at head 0: kv_quant_passes (`plain`: its s_k
    is the blocks' scales the ring combines), then k_given_scale_passes with plain's s_k
    (`given`) and with RN(2 amax / 448) (`big`). mu is the local keys' mean, as good as the whole
    segment's. Its tests are marked slow (the simulator)."""
    _, k, v, cu = hard_inputs(RANK_SEQLENS, 2, seed_of("grid_runs"))
    k[3, 0, 17] = float("nan")
    _, blocks = rank_blocks(cu)
    tokens, heads, n = k.shape[0], k.shape[1], len(blocks)
    mu = R.segment_key_means(k, cu)
    k8 = lambda: np.full((tokens, heads, 128), numba_check.CODE_POISON, np.uint8)
    inputs = dict(k=numba_check.bits16(k), mu=mu.numpy(), blocks=blocks)
    plain = host.quant_passes(Q.kv_quant_passes, dict(
        inputs, v=numba_check.bits16(v), s_v=R.div(segment_amax(v, cu), 448.0).numpy(), k8=k8(),
        s_k=np.full((n, heads), np.nan, np.float32),
        v8t=np.full((heads, 128, n * 128), numba_check.CODE_POISON, np.uint8)))
    amax = np.stack([(k[first:first + count].float() - mu[seg]).abs().amax(dim=(0, 2)).numpy()
                     for seg, first, count in blocks])
    big_scales = R.div(torch.from_numpy(2 * amax), 448.0).numpy()
    scales = host.quant_passes(Q.k_scale_passes, dict(inputs, s_k=np.full((n, heads), np.nan, np.float32)))["s_k"]
    given = host.quant_passes(Q.k_given_scale_passes, dict(inputs, k8=k8(), s_k=plain["s_k"].copy()))
    big = host.quant_passes(Q.k_given_scale_passes, dict(inputs, k8=k8(), s_k=big_scales.copy()))
    return SimpleNamespace(k=k, v=v, cu=cu, blocks=blocks, mu=mu, plain=plain, amax=amax, scales=scales, given=given,
                           big=big, big_scales=big_scales)


@pytest.mark.slow
def test_grid_block_scales_and_given_scales(grid_runs):
    """The K pass on grid blocks: s_k = RN(amax |RN(k - mu)| / 448) per block and head, NaN kept,
    bitwise as torch's, with codes or without (an empty k8); given those scales,
    k_quant_given_kernel writes k_quant_kernel's codes."""
    g = grid_runs
    assert numba_check.same_scales(g.plain["s_k"], R.div(torch.from_numpy(g.amax), 448.0).numpy())
    assert numba_check.same_scales(g.scales, g.plain["s_k"])  # an empty k8: the same scales, no codes
    assert np.isnan(g.plain["s_k"][0, 0]) and (g.plain["s_k"][3:6, 1] == 0).all()  # the NaN; head 1's constant keys
    assert numba_check.same_codes(g.given["k8"], g.plain["k8"])


@pytest.mark.slow
def test_k_quant_given_uses_the_given_scales(grid_runs):
    """Scales RN(2 amax / 448): the reference's codes with those scales given per key."""
    g = grid_runs
    _, _, k8, _, _, _ = R.quantize_attention_inputs(g.k[:0], g.k, g.v, g.cu, k_mean=g.mu,
                                                   k_scale=per_key(g.big_scales, g.blocks))
    assert numba_check.same_codes(g.big["k8"], k8.view(torch.uint8).numpy())
    assert not numba_check.same_codes(g.big["k8"], g.plain["k8"])


def test_segment_sums_add_blocks_in_order(seed):
    """kv_segment_sums_kernel on a rank's blocks: each segment's keys of k added in token order
    per block, the block sums in block order (f32 adds, as torch's), and amax |v|, bitwise."""
    _, k, v, cu = hard_inputs(RANK_SEQLENS, 2, seed)
    v[60, 1, 3] = float("nan")  # an amax keeps it
    offset, blocks = rank_blocks(cu)
    segments, heads, n = len(cu) - 1, k.shape[1], len(blocks)
    shape = (segments, heads, 128)
    out = host.quant_passes(Q.segment_sum_passes, dict(
        k=numba_check.bits16(k), v=numba_check.bits16(v), blocks=blocks, block_offset=offset,
        partials=np.full((2, n, heads, 128), np.nan, np.float32), sums=np.full(shape, np.nan, np.float32),
        v_amax=np.full(shape, np.nan, np.float32)))
    sums = torch.zeros(shape)
    for seg, first, count in blocks:
        part = torch.zeros(shape[1:])
        for t in range(first, first + count):
            part = part + k[t].float()
        sums[seg] = sums[seg] + part
    assert numba_check.same_scales(out["sums"], sums.numpy())
    # segment 0's blocks start at its start, as the plain pass's: sum / L is the reference's mean
    mean = R.div(torch.from_numpy(out["sums"][0]), float(cu[1] - cu[0]))
    assert numba_check.same_scales(mean.numpy(), R.segment_key_means(k, cu)[0].numpy())
    assert numba_check.same_scales(out["v_amax"], segment_amax(v, cu).numpy())
    assert np.isnan(out["v_amax"][0, 1, 3])
