"""Property-based fuzzing (hypothesis) of shapes, AdaLN rows, indices and segment lists against
h3kernels.reference.

On the GPU both operators run end to end, H3KERNELS_FUZZ_EXAMPLES cases each (default 200), and
every case goes through the same element-by-element checks as the hand-picked tests
(test_mlp_fp8.check_all, test_varlen_attention_fp8.check_accuracy). Without a GPU the same
strategies drive the Numba kernels in the CUDA simulator (row kernel; attention quantization
passes) bitwise against the reference, with fewer and smaller cases: the simulator runs about a
thousand threads a second.
"""
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from h3kernels import reference as R
from h3kernels.testing import simulator as numba_check
from h3kernels.constants import HIDDEN
from numba.cuda import config
from test_mlp_fp8 import weights  # noqa: F401 (the module-scoped fixture of prepared weights)

SIM = bool(config.ENABLE_CUDASIM)
GPU_EXAMPLES = int(os.environ.get("H3KERNELS_FUZZ_EXAMPLES", "200"))
SIM_EXAMPLES = 6
SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large]


@st.composite
def mlp_rows(draw, max_m, max_rows):
    """(m, rows, index list): indices mostly in range, some negative, some past the table, one huge."""
    m = draw(st.integers(1, max_m))
    rows = draw(st.integers(1, max_rows))
    index = st.one_of(st.integers(0, rows - 1), st.integers(-3, -1), st.integers(rows, rows + 3),
                      st.just(2**62))
    return m, rows, draw(st.lists(index, min_size=m, max_size=m))


def segment_lists(max_len, max_segments):
    """Segment lengths with empty segments and lengths around the 64- and 128-key block edges."""
    length = st.one_of(st.integers(0, max_len), st.sampled_from([0, 1, 63, 64, 65, 127, 128, 129]))
    return st.lists(length, min_size=1, max_size=max_segments).filter(lambda s: sum(s) > 0)


def row_inputs(m, rows, index, seed, device):
    """x with per-row magnitudes from 1e-30 to 1e20 (zero rows; squares that overflow FP32), AdaLN tables as column chunks."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    mag = torch.pow(10.0, torch.randint(-30, 21, (m, 1), generator=g).double()).float()
    mag[torch.rand(m, 1, generator=g) < 0.1] = 0
    x = (torch.randn(m, HIDDEN, generator=g) * mag).bfloat16()
    w = (1 + 0.1 * torch.randn(HIDDEN, generator=g)).bfloat16()
    mod = (0.5 * torch.randn(rows, 6 * HIDDEN, generator=g)).bfloat16()
    idx = torch.tensor(index, dtype=torch.int64)
    to = lambda t: t.to(device)
    return to(x), to(w), to(mod)[:, HIDDEN:2 * HIDDEN], to(mod)[:, 3 * HIDDEN:4 * HIDDEN], to(idx), g


# --- CPU: the simulator ----------------------------------------------------------------------------

@pytest.mark.skipif(not SIM, reason="the simulator runs when there is no GPU")
@settings(max_examples=SIM_EXAMPLES, deadline=None, suppress_health_check=SLOW)
@given(case=mlp_rows(max_m=3, max_rows=8), seed=st.integers(0, 2**31 - 1))
def test_simulator_row_kernel_fuzz(case, seed):
    from test_mlp_fp8_row import assert_same_bits

    m, rows, index = case
    x, w, sc, sh, idx, _ = row_inputs(m, rows, index, seed, "cpu")
    a_q, a_s = numba_check.row_stage(x, w, sc, sh, idx)
    q, s = R.quantize_rows(R.mlp_row_stage(x, w, sc, sh, idx))
    assert_same_bits(torch.from_numpy(a_q), q.view(torch.uint8), "a_q")
    assert_same_bits(torch.from_numpy(a_s.view(np.int32)), s.view(torch.int32), "a_scale")


@pytest.mark.skipif(not SIM, reason="the simulator runs when there is no GPU")
@settings(max_examples=SIM_EXAMPLES, deadline=None, suppress_health_check=SLOW)
@given(seqlens=segment_lists(max_len=140, max_segments=4), heads=st.integers(1, 2),
       k_offset=st.sampled_from([0.0, 40.0]), seed=st.integers(0, 2**31 - 1))
def test_simulator_attention_quantization_fuzz(seqlens, heads, k_offset, seed):
    from test_varlen_attention_fp8 import random_inputs

    q, k, v, _, cu = random_inputs(seqlens, heads, k_offset, seed)
    assert not numba_check.attention_pass_mismatches(q, k, v, cu)


# --- GPU: both operators end to end ----------------------------------------------------------------

@pytest.mark.gpu
@settings(max_examples=GPU_EXAMPLES, deadline=None, suppress_health_check=SLOW + [HealthCheck.function_scoped_fixture])
@given(case=mlp_rows(max_m=300, max_rows=64), out_mode=st.sampled_from([None, "residual", "x"]),
       caller_ws=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_gpu_mlp_fuzz(weights, case, out_mode, caller_ws, seed):
    from test_mlp_fp8 import check_all, run_op, workspaces

    m, rows, index = case
    x, w, sc, sh, idx, g = row_inputs(m, rows, index, seed, "cuda")
    gate = torch.randn(rows, 2 * HIDDEN, generator=g).bfloat16().cuda()[:, HIDDEN:]
    residual = torch.randn(m, HIDDEN, generator=g).bfloat16().cuda()
    inp = dict(x=x, x_norm_weight=w, adaln_scale=sc, adaln_shift=sh, adaln_index=idx, gate=gate, residual=residual)
    keep = {k: v.clone() for k, v in inp.items()}  # out may overwrite x or residual
    ws = workspaces(m)
    out = run_op(inp, weights, out_mode, ws if caller_ws else {})
    torch.cuda.synchronize()
    if not caller_ws:  # the stages are checked through workspaces: run again into ours
        inp = {k: v.clone() for k, v in keep.items()}
        out2 = run_op(inp, weights, out_mode, ws)
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), out2.view(torch.int16))
    check_all(keep, weights, out, ws, f"fuzz m={m} rows={rows} seed={seed}", report_exact=False)


@pytest.mark.gpu
@settings(max_examples=GPU_EXAMPLES, deadline=None, suppress_health_check=SLOW)
@given(seqlens=segment_lists(max_len=700, max_segments=6), heads=st.sampled_from([1, 2, 3, 8]),
       k_offset=st.sampled_from([0.0, 30.0]), host=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_gpu_attention_fuzz(seqlens, heads, k_offset, host, seed):
    from test_varlen_attention_fp8 import check_accuracy

    check_accuracy(seqlens, heads, k_offset=k_offset, seed=seed, host=host)
