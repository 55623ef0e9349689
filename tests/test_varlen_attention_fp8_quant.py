"""The attention quantization passes (Numba), bitwise against h3kernels.reference: in the CUDA
simulator without a GPU, on the GPU with one."""
import numpy as np
import pytest
import torch

from h3kernels import reference as R
from h3kernels import varlen_attention_fp8_quant as Q
from h3kernels.shapes import cu_seqlens_of
from h3kernels.varlen_attention_fp8_plan import plan_host
from numba.cuda import config

SIM = bool(config.ENABLE_CUDASIM)


def hard_inputs(seqlens, heads):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    t = sum(seqlens)
    q, k, v = (torch.randn(t, heads, 128, generator=g) for _ in range(3))
    k = k + 40 * torch.randn(1, heads, 128, generator=g)  # large per-channel offset: smoothing
    cu = cu_seqlens_of(seqlens)
    long_seg = int(np.argmax(seqlens))
    if seqlens[long_seg] >= 128 and heads > 1:
        # s_k = 0 needs k' = k - mu = 0, i.e. keys equal to their segment's mean: a constant block
        # inside a varying segment still has k' != 0 (and s_k > 0). So head 1's longest segment is
        # constant throughout (mu = 3 exactly): every one of its 128-key blocks gets s_k = 0.
        k[cu[long_seg]:cu[long_seg + 1], 1] = 3.0
    if t > 8:
        v[:, 0, 5] = 0  # a zero V channel
        q[7] = 0  # zero Q rows
    return q.bfloat16(), k.bfloat16(), v.bfloat16(), cu


def run(q, k, v, cu):
    tokens, heads, _ = q.shape
    segs = len(cu) - 1
    blocks = Q.key_blocks(cu)
    bits = lambda x: x.view(torch.int16).numpy().view(np.uint16)
    block_offset = plan_host(cu, heads)[1]
    arrays = dict(q=bits(q), k=bits(k), v=bits(v), cu=np.array(cu, np.int64), blocks=blocks, block_offset=block_offset,
                  q8=np.full((tokens, heads, 128), 0x7F, np.uint8), s_q=np.full((tokens, heads), np.nan, np.float32),
                  mu=np.full((segs, heads, 128), np.nan, np.float32), k8=np.full((tokens, heads, 128), 0x7F, np.uint8),
                  s_k=np.full((len(blocks), heads), np.nan, np.float32),
                  v8t=np.full((heads, 128, len(blocks) * 128), 0x7F, np.uint8),
                  s_v=np.full((segs, heads, 128), np.nan, np.float32),
                  partials=np.full((2, len(blocks), heads, 128), np.nan, np.float32))
    if SIM:
        Q.launch(**arrays)
        return arrays
    from numba import cuda

    dev = {name: cuda.to_device(a) for name, a in arrays.items()}
    Q.launch(**dev)
    return {name: d.copy_to_host() for name, d in dev.items()}


def check(seqlens, heads):
    compare(*hard_inputs(seqlens, heads))


def compare(q, k, v, cu):
    """Every output of the passes on bf16 q, k, v (CPU tensors) against the reference, bitwise."""
    heads = q.shape[1]
    out = run(q, k, v, cu)
    q8, s_q, k8, s_k, v8, s_v = R.quantize_attention_inputs(q, k, v, cu)
    assert np.array_equal(out["q8"], u8(q8)) and np.array_equal(out["s_q"], s_q.numpy())
    assert np.array_equal(out["k8"], u8(k8))
    assert np.array_equal(out["v8t"], Q.v_transposed(u8(v8), cu))  # padding columns included: zeros
    for blk, (seg, first, count) in enumerate(Q.key_blocks(cu)):
        assert np.array_equal(np.broadcast_to(out["s_k"][blk], (count, heads)), s_k[first:first + count].numpy())
    for seg, (a, b) in enumerate(zip(cu, cu[1:])):
        if b > a:
            assert np.array_equal(out["s_v"][seg], s_v[a].numpy())
    assert not np.isnan(out["s_k"]).any() and not np.isnan(out["s_v"]).any()


@pytest.mark.skipif(not SIM, reason="the simulator runs when there is no GPU")
def test_simulator_passes_equal_the_reference():
    check([0, 1, 127, 0, 130], heads=2)  # small: the simulator runs ~1,000 threads a second


@pytest.mark.gpu
@pytest.mark.parametrize("seqlens,heads", [([0, 1, 127, 128, 129, 0, 300], 2), ([4096], 8), ([700, 0, 33], 56)])
def test_gpu_passes_equal_the_reference(seqlens, heads):
    check(seqlens, heads)


def test_v_layout_permutes_each_16_key_group_and_zero_pads():
    perm = Q.v_key_at(np.arange(128))
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


def test_infinite_q_and_v_scales_divide():
    """An Inf in a Q row or a V channel makes that scale inf; its codes are those of x / inf (zeros,
    NaN for the Inf itself), as the reference's, not the NaNs that inv = 0 would give."""
    if not SIM:
        pytest.skip("the simulator runs when there is no GPU (the GPU twin is test_gpu_infinite_scales)")
    check_infinite_scales()


@pytest.mark.gpu
def test_gpu_infinite_scales():
    check_infinite_scales()


def passes_and_reference(heads, seed, edit):
    """The passes and the reference on two segments [5, 65] of random q, k, v (float32, before
    `edit(q, k, v)` and the bf16 rounding)."""
    g = torch.Generator().manual_seed(seed)
    cu = [0, 5, 70]
    q, k, v = (torch.randn(cu[-1], heads, 128, generator=g) for _ in range(3))
    edit(q, k, v)
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    return cu, run(q, k, v, cu), R.quantize_attention_inputs(q, k, v, cu)


def u8(t):
    return t.view(torch.uint8).numpy()


def check_infinite_scales():
    def edit(q, k, v):
        q[3, 0, 7] = float("inf")
        v[40, 0, 100] = float("-inf")

    cu, out, (q8, s_q, k8, s_k, v8, s_v) = passes_and_reference(1, 9, edit)
    nan_alike = lambda a: np.where((a & 0x7F) == 0x7F, 0x7F, a)
    assert np.isinf(out["s_q"][3, 0]) and np.isinf(out["s_v"][1, 0, 100])
    assert np.array_equal(nan_alike(out["q8"]), nan_alike(u8(q8)))
    assert np.array_equal(nan_alike(out["v8t"]), nan_alike(Q.v_transposed(u8(v8), cu)))
    assert np.array_equal(out["k8"], u8(k8))

def test_nan_scales_give_zero_codes():
    """A NaN in a Q row, a K element or a V channel makes that row's s_q, the segment and head's
    s_k and that channel's s_v NaN (amaxes keep NaN, as the reference's torch amax), with zero
    codes; the Python or PTX max would drop the NaN and quantize against the other values."""
    if not SIM:
        pytest.skip("the simulator runs when there is no GPU (the GPU twin is test_gpu_nan_scales)")
    check_nan_scales()


@pytest.mark.gpu
def test_gpu_nan_scales():
    check_nan_scales()


def check_nan_scales():
    def edit(q, k, v):
        q[3, 1, 7] = float("nan")
        k[40, 0, 100] = float("nan")
        v[20, 1, 9] = float("nan")

    cu, out, (q8, s_q, k8, s_k, v8, s_v) = passes_and_reference(2, 10, edit)
    assert np.isnan(out["s_q"][3, 1]) and np.isnan(out["s_k"][1:, 0]).all() and np.isnan(out["s_v"][1, 1, 9])
    assert np.array_equal(np.isnan(out["s_q"]), s_q.isnan().numpy())
    assert np.array_equal(out["q8"], u8(q8)) and np.array_equal(out["k8"], u8(k8))
    assert np.array_equal(out["v8t"], Q.v_transposed(u8(v8), cu))
    assert (out["q8"][3, 1] == 0).all() and (out["k8"][5:, 0] == 0).all()
