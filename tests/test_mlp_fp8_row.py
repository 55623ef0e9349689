"""The Numba row kernel: bitwise equal to the reference, in the simulator (CI) and on the GPU."""
import numpy as np
import pytest
import torch

from h3kernels import reference as R
from h3kernels.testing import simulator as numba_check
from h3kernels.testing.inputs import make_row_inputs
from h3kernels.constants import HIDDEN
from numba.cuda import config

SIM = bool(config.ENABLE_CUDASIM)


def hard_rows(m, rows=6, device="cpu"):
    """Random rows plus out-of-range indices, zero rows and large magnitudes. The AdaLN tables are
    column chunks of a wider projection (strided views) on `device`."""
    x, w, sc, sh, idx = make_row_inputs(m, rows, device=device, seed=torch.seed() % 2**31)
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
        sc[rows - 1] = -1
        sh[rows - 1] = (torch.randn(HIDDEN, device=device) * 1e-37).bfloat16()
        idx[8] = rows - 1
    return x, w, sc, sh, idx


def expected(x, w, sc, sh, idx):
    return R.quantize_rows(R.mlp_row_stage(*(t.cpu() for t in (x, w, sc, sh, idx))))


def assert_same_bits(got, want, what):
    got, want = got.cpu().reshape(got.shape[0], -1), want.cpu().reshape(want.shape[0], -1)
    bad = (got != want).nonzero()
    if len(bad):
        rows = sorted(set(bad[:, 0].tolist()))
        first = [(r, c, int(got[r, c]), int(want[r, c])) for r, c in bad[:5].tolist()]
        raise AssertionError(f"{what}: {len(bad)} of {got.numel()} differ, in rows {rows[:20]}; "
                             f"first (row, col, got, want): {first}")


@pytest.mark.skipif(not SIM, reason="the simulator runs when there is no GPU")
@pytest.mark.parametrize("m", [1, 3, 17])
def test_simulator_row_kernel_is_bitwise_equal_to_reference(m):
    x, w, sc, sh, idx = hard_rows(m)
    a_q, a_s = numba_check.row_stage(x, w, sc, sh, idx)  # into NaN-poisoned outputs
    q, s = expected(x, w, sc, sh, idx)
    assert_same_bits(torch.from_numpy(a_q), q.view(torch.uint8), "a_q")
    assert_same_bits(torch.from_numpy(a_s.view(np.int32)), s.view(torch.int32), "a_scale")


def nonfinite_rows(device="cpu"):
    """Rows with a NaN, an Inf (sum of squares inf: r = 0, inf * 0 = NaN), and a NaN in the shift
    table row they use: their amax and scale are NaN (codes 0, as the reference's); a row using an
    Inf in the shift table: scale inf, codes of a / inf (zeros, NaN for the Inf); row 0 is clean."""
    x, w, sc, sh, idx = make_row_inputs(5, 3, device=device, seed=12)
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
    assert numba_check.same_scales(got.cpu().numpy(), want.cpu().numpy())


@pytest.mark.skipif(not SIM, reason="the simulator runs when there is no GPU")
def test_simulator_nonfinite_rows_give_nan_scales():
    x, w, sc, sh, idx = nonfinite_rows()
    a_q, a_s = numba_check.row_stage(x, w, sc, sh, idx, scale_poison=0.0)  # NaN scales are expected here
    q, s = expected(x, w, sc, sh, idx)
    assert s[1:4].isnan().all() and not s[0].isnan() and s[4] == float("inf")
    assert_same_bits(nan_codes_alike(torch.from_numpy(a_q)), nan_codes_alike(q), "a_q")
    assert_scales_match(torch.from_numpy(a_s), s)


@pytest.mark.gpu
def test_gpu_nonfinite_rows_give_nan_scales():
    import h3kernels

    x, w, sc, sh, idx = nonfinite_rows("cuda")
    a_q, a_s = h3kernels.minimax_h3_mlp_fp8_row_stage(x, w, sc, sh, idx)
    q, s = expected(x, w, sc, sh, idx)
    assert_same_bits(nan_codes_alike(a_q), nan_codes_alike(q), "a_q")
    assert_scales_match(a_s, s)


def run_gpu(m, kind="torch", stream=False, workspaces=False):
    import h3kernels

    x, w, sc, sh, idx = hard_rows(m, device="cuda")
    assert sc.stride(0) == 6 * HIDDEN  # column chunks, not copies
    args = [x, w, sc, sh, idx]
    ws = {}
    if workspaces:
        ws = dict(workspace_a_q=torch.full((m, HIDDEN), 0x7F, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn),
                  workspace_a_scale=torch.full((m,), float("nan"), device="cuda"))
    if kind == "cupy":
        import cupy

        def to(t):
            if t.dtype == torch.bfloat16:
                return cupy.from_dlpack(t.view(torch.int16)).view(cupy.uint16)
            return cupy.from_dlpack(t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t)
        args = [to(a) for a in args]
        ws = {k: to(v) for k, v in ws.items()}
    if stream:
        x_late = torch.full_like(args[0], float("nan"))
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            torch.cuda._sleep(50_000_000)  # a long wait on the side stream before x is written there:
            x_late.copy_(args[0])  # a launch on any other stream would read the NaN poison
            args[0] = x_late
            a_q, a_s = h3kernels.minimax_h3_mlp_fp8_row_stage(*args, **ws)
        s.synchronize()
    else:
        a_q, a_s = h3kernels.minimax_h3_mlp_fp8_row_stage(*args, **ws)
        torch.cuda.synchronize()
    if kind == "cupy":
        a_q, a_s = torch.from_dlpack(a_q.view("uint8")), torch.from_dlpack(a_s)
    else:
        assert isinstance(a_q, torch.Tensor) and a_q.dtype == torch.float8_e4m3fn
        a_q = a_q.view(torch.uint8)
    if workspaces and kind == "torch":
        assert a_q.data_ptr() == ws["workspace_a_q"].data_ptr()
    q, s = expected(x, w, sc, sh, idx)
    assert_same_bits(a_q, q.view(torch.uint8), "a_q")
    assert_same_bits(a_s.view(torch.int32), s.view(torch.int32), "a_scale")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 17, 1000, 16384])
@pytest.mark.parametrize("workspaces", [False, True])
def test_gpu_row_kernel_is_bitwise_equal_to_reference(m, workspaces):
    run_gpu(m, workspaces=workspaces)


@pytest.mark.gpu
def test_gpu_row_kernel_with_cupy_inputs_returns_cupy():
    run_gpu(333, kind="cupy", workspaces=True)


@pytest.mark.gpu
def test_gpu_row_kernel_runs_on_the_callers_stream():
    run_gpu(4096, stream=True)


@pytest.mark.gpu
def test_gpu_row_kernel_cupy_stream():
    import cupy

    import h3kernels

    x, w, sc, sh, idx = hard_rows(2048, device="cuda")
    conv = lambda t: cupy.from_dlpack(t.view(torch.int16)).view(cupy.uint16)
    xc, wc, scc, shc = conv(x), conv(w), conv(sc), conv(sh)
    idx_c = cupy.from_dlpack(idx)
    xs = cupy.full(xc.shape, 0x7FC0, dtype=cupy.uint16)  # NaN poison
    busy = cupy.ones(1 << 28, dtype=cupy.float32)
    torch.cuda.synchronize()
    with cupy.cuda.Stream(non_blocking=True) as s:
        for _ in range(20):  # keep s busy before x is written there
            busy *= 1.0001
        xs[...] = xc  # only stream order makes this visible to the kernel
        a_q, a_s = h3kernels.minimax_h3_mlp_fp8_row_stage(xs, wc, scc, shc, idx_c)
        assert isinstance(a_q, cupy.ndarray)
        s.synchronize()
    q, sref = expected(x, w, sc, sh, idx)
    assert_same_bits(torch.from_numpy(cupy.asnumpy(a_q.view(cupy.uint8))), q.view(torch.uint8), "a_q")
    assert_same_bits(torch.from_numpy(cupy.asnumpy(a_s).view(np.int32)), sref.view(torch.int32), "a_scale")


@pytest.mark.gpu
def test_gpu_row_kernel_repeated_runs_identical():
    import h3kernels

    x, w, sc, sh, idx = hard_rows(3000, device="cuda")
    first = h3kernels.minimax_h3_mlp_fp8_row_stage(x, w, sc, sh, idx)
    for _ in range(3):
        again = h3kernels.minimax_h3_mlp_fp8_row_stage(x, w, sc, sh, idx)
        assert torch.equal(again[0].view(torch.uint8), first[0].view(torch.uint8))
        assert torch.equal(again[1], first[1])
