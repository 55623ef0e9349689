"""The Numba row kernel: bitwise equal to the reference, in the simulator (CI) and on the GPU."""
import contextlib

import numpy as np
import pytest
import torch

from h3kernels import reference as R
from h3kernels.testing import simulator as numba_check
from h3kernels.testing.checks import assert_same_bits, same_bits
from h3kernels.testing.inputs import make_row_inputs
from h3kernels.testing.poison import poisoned_row_workspaces
from h3kernels.constants import HIDDEN
from numba.cuda import config

SIM = bool(config.ENABLE_CUDASIM)


def hard_rows(m, seed, rows=6, device="cpu"):
    """Random rows plus out-of-range indices, zero rows and large magnitudes. The AdaLN tables are
    column chunks of a wider projection (strided views) on `device`."""
    x, w, sc, sh, idx = make_row_inputs(m, rows, device=device, seed=seed)
    if m >= 3:
        idx[0], idx[1] = -1, rows  # out of range
        x[2] = 0  # zero row: a = shift
    if m >= 5:
        x[3] *= 1e15  # large, still finite sum of squares
        x[4] *= 1e25  # sum of squares overflows: r = 0, a = shift
    if m >= 7:
        idx[5] = 2**62
        sh[idx[6] if 0 <= idx[6] < rows else 0] *= 3e4
    if m >= 9:  # t = bf16(1 + -1) = 0 and tiny shifts: a_scale ~ 1e-40, whose inverse overflows
        g = torch.Generator(device=device).manual_seed(seed + 1)
        sc[rows - 1] = -1
        sh[rows - 1] = (torch.randn(HIDDEN, generator=g, device=device) * 1e-37).bfloat16()
        idx[8] = rows - 1
    return x, w, sc, sh, idx


def expected(x, w, sc, sh, idx):
    return R.quantize_rows(R.mlp_row_stage(*(t.cpu() for t in (x, w, sc, sh, idx))))


@pytest.mark.skipif(not SIM, reason="the simulator runs when there is no GPU")
@pytest.mark.parametrize("m", [1, 3, 9, pytest.param(17, marks=pytest.mark.slow)])  # 9: every hard row
def test_simulator_row_kernel_is_bitwise_equal_to_reference(m, seed):
    x, w, sc, sh, idx = hard_rows(m, seed)
    # the simulator's numpy FP32 overflows where the GPU's does, on purpose: the sum of squares
    # of row 4, and 1 / a_scale of row 8
    expect = pytest.warns(RuntimeWarning, match="overflow encountered") if m >= 5 else contextlib.nullcontext()
    with expect:
        a_q, a_s = numba_check.row_stage(x, w, sc, sh, idx)  # into NaN-poisoned outputs
    q, s = expected(x, w, sc, sh, idx)
    assert_same_bits(torch.from_numpy(a_q), q.view(torch.uint8), "a_q")
    assert_same_bits(torch.from_numpy(a_s.view(np.int32)), s.view(torch.int32), "a_scale")


@pytest.mark.skipif(not SIM, reason="the simulator runs when there is no GPU")
def test_simulator_row_kernel_clears_the_words_the_gemms_need_zeroed(seed):
    """The MLP call has its row kernel zero FC2's flags or the split counters (no memset launch):
    CTA 0 clears all of them, more words than it has threads; the rows come out as without them."""
    from h3kernels._launch import host
    from h3kernels._launch.numba import mlp_fp8_row

    m = 2
    x, w, sc, sh, idx = make_row_inputs(m, 3, seed=seed)
    quads = lambda t: numba_check.bits16(t).view(np.uint64)
    arrays = dict(x_quads=quads(x), norm_w_quads=quads(w), scale_flat=numba_check._table_quads(sc),
                  shift_flat=numba_check._table_quads(sh), index=idx.numpy(),
                  a_q_quads=np.full((m, HIDDEN // 4), 0x7F7F7F7F, np.uint32), a_scale=np.full(m, np.nan, np.float32),
                  zero=np.full(1000, -7, np.int32))
    out = host._on_runner(lambda **a: mlp_fp8_row.launch(a["x_quads"], a["norm_w_quads"], a["scale_flat"],
                                                          a["shift_flat"], sc.stride(0) // 4, sc.shape[0], a["index"],
                                                          1e-5, a["a_q_quads"], a["a_scale"], a["zero"]), arrays)
    assert not out["zero"].any()
    q, s = expected(x, w, sc, sh, idx)
    assert_same_bits(torch.from_numpy(out["a_q_quads"].view(np.uint8)), q.view(torch.uint8), "a_q")


def nonfinite_rows(seed, device="cpu"):
    """Rows with a NaN, an Inf (sum of squares inf: r = 0, inf * 0 = NaN), and a NaN in the shift
    table row they use: their amax and scale are NaN (codes 0, as the reference's); a row using an
    Inf in the shift table: scale inf, codes of a / inf (zeros, NaN for the Inf); row 0 is clean."""
    x, w, sc, sh, idx = make_row_inputs(5, 3, device=device, seed=seed)
    idx[:] = torch.tensor([0, 0, 0, 2, 1])
    x[1, 17] = float("nan")
    x[2, 4000] = float("inf")
    sh[2, 5] = float("nan")
    sh[1, 9] = float("inf")
    return x, w, sc, sh, idx


def nan_codes_alike(q):
    """e4m3 bytes with both NaN codes (0x7F, 0xFF) as 0x7F: a NaN's sign differs between runners."""
    return torch.from_numpy(numba_check.nan_codes_alike(q.view(torch.uint8).cpu().numpy()))


def assert_scales_match(got, want):
    """Bitwise, except that a NaN scale only has to be a NaN (payloads differ between runners)."""
    assert numba_check.same_scales(got.cpu().numpy(), want.cpu().numpy()), (got, want)


@pytest.mark.skipif(not SIM, reason="the simulator runs when there is no GPU")
def test_simulator_nonfinite_rows_give_nan_scales(seed):
    x, w, sc, sh, idx = nonfinite_rows(seed)
    with pytest.warns(RuntimeWarning, match="invalid value encountered"):  # inf * 0, inf / inf: NaN, as on the GPU
        a_q, a_s = numba_check.row_stage(x, w, sc, sh, idx, scale_poison=0.0)  # NaN scales are expected here
    q, s = expected(x, w, sc, sh, idx)
    assert s[1:4].isnan().all() and not s[0].isnan() and s[4] == float("inf")
    assert_same_bits(nan_codes_alike(torch.from_numpy(a_q)), nan_codes_alike(q), "a_q")
    assert_scales_match(torch.from_numpy(a_s), s)


@pytest.mark.gpu
def test_gpu_nonfinite_rows_give_nan_scales(seed, array_kind):
    import h3kernels

    x, w, sc, sh, idx = nonfinite_rows(seed, "cuda")
    a_q, a_s = h3kernels.minimax_h3_mlp_fp8_row_stage(*(array_kind.to(t) for t in (x, w, sc, sh, idx)))
    q, s = expected(x, w, sc, sh, idx)
    assert_same_bits(nan_codes_alike(array_kind.torch(a_q, torch.uint8)), nan_codes_alike(q), "a_q")
    assert_scales_match(array_kind.torch(a_s), s)


def run_gpu(m, seed, kind, stream=False, workspaces=False):
    """The row stage on the GPU for `kind`'s arrays (conftest.ArrayKind) against the reference,
    bitwise; into poisoned caller workspaces, or on a new stream of that kind where x is written
    behind a delay (a launch on any other stream would read the NaN poison)."""
    import h3kernels

    x, w, sc, sh, idx = hard_rows(m, seed, device="cuda")
    assert sc.stride(0) == 6 * HIDDEN  # column chunks, not copies
    args = [kind.to(t) for t in (x, w, sc, sh, idx)]
    ws = {name: kind.to(t) for name, t in poisoned_row_workspaces(m).items()} if workspaces else {}
    if stream:
        x_late = kind.nan_like(args[0])
        with kind.side_stream():
            kind.delay()
            kind.write(x_late, args[0])
            a_q, a_s = h3kernels.minimax_h3_mlp_fp8_row_stage(x_late, *args[1:], **ws)
    else:
        a_q, a_s = h3kernels.minimax_h3_mlp_fp8_row_stage(*args, **ws)
        torch.cuda.synchronize()
    if workspaces:
        assert kind.ptr(a_q) == kind.ptr(ws["workspace_a_q"])  # written in place
    a_q, a_s = kind.torch(a_q, torch.uint8), kind.torch(a_s)
    q, s = expected(x, w, sc, sh, idx)
    assert_same_bits(a_q, q.view(torch.uint8), "a_q")
    assert_same_bits(a_s.view(torch.int32), s.view(torch.int32), "a_scale")
    return a_q, a_s


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 17, 1000, 16384])
@pytest.mark.parametrize("workspaces", [False, True])
def test_gpu_row_kernel_is_bitwise_equal_to_reference(m, workspaces, seed, array_kind):
    run_gpu(m, seed, array_kind, workspaces=workspaces)


@pytest.mark.gpu
def test_gpu_row_kernel_runs_on_the_callers_stream(seed, array_kind):
    run_gpu(4096, seed, array_kind, stream=True)


@pytest.mark.gpu
def test_gpu_row_kernel_repeated_runs_identical(seed):
    import h3kernels

    x, w, sc, sh, idx = hard_rows(3000, seed, device="cuda")
    first = h3kernels.minimax_h3_mlp_fp8_row_stage(x, w, sc, sh, idx)
    for _ in range(3):
        again = h3kernels.minimax_h3_mlp_fp8_row_stage(x, w, sc, sh, idx)
        assert same_bits(again[0], first[0]) and same_bits(again[1], first[1])
