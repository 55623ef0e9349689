"""Property-based fuzzing (hypothesis) of shapes, AdaLN rows, indices and segment lists against
h3kernels.reference. Hypothesis reports each failing example, its seed included.

On the GPU both operators run end to end, H3KERNELS_FUZZ_EXAMPLES cases each (default 200), and
every case goes through the same element-by-element checks as the hand-picked tests
(checks.check_mlp_stages, checks.attention_misses). Without a GPU the same strategies drive the
Numba kernels in the CUDA simulator (row kernel; attention quantization passes) bitwise against
the reference, with fewer and smaller cases: the simulator runs about a thousand threads a second.
"""
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import h3kernels
from h3kernels import reference as R
from h3kernels.testing import simulator as numba_check
from h3kernels.testing.checks import assert_same_bits, attention_misses, check_mlp_stages, same_bits
from h3kernels.testing.inputs import fuzz_row_inputs, make_attention_inputs, make_mlp_inputs, mlp_arguments
from h3kernels.testing.poison import poisoned_like, poisoned_mlp_workspaces
from numba.cuda import config

SIM = bool(config.ENABLE_CUDASIM)
GPU_EXAMPLES = int(os.environ.get("H3KERNELS_FUZZ_EXAMPLES", "200"))
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


# --- CPU: the simulator ----------------------------------------------------------------------------

# Each simulator test draws 2 cases by default and, with --runslow, 6 more in a run of their own
# (an attention case takes ~8 s on two cores).
SIM_EXAMPLES = [2, pytest.param(6, marks=pytest.mark.slow)]


@pytest.mark.skipif(not SIM, reason="the simulator runs when there is no GPU")
# rows of magnitude up to 1e20 overflow the sum of squares in FP32 (r = 0), as on the GPU: the
# simulator's numpy says so; whether an example has one is hypothesis' draw
@pytest.mark.filterwarnings("ignore:overflow encountered in scalar multiply:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:overflow encountered in scalar add:RuntimeWarning")
@pytest.mark.parametrize("examples", SIM_EXAMPLES)
def test_simulator_row_kernel_fuzz(examples):
    @settings(max_examples=examples, deadline=None, suppress_health_check=SLOW)
    @given(case=mlp_rows(max_m=3, max_rows=8), seed=st.integers(0, 2**31 - 1))
    def row_kernel(case, seed):
        m, rows, index = case
        x, w, sc, sh, idx = fuzz_row_inputs(index, rows, seed)
        a_q, a_s = numba_check.row_stage(x, w, sc, sh, idx)
        q, s = R.quantize_rows(R.mlp_row_stage(x, w, sc, sh, idx))
        assert_same_bits(torch.from_numpy(a_q), q.view(torch.uint8), "a_q")
        assert_same_bits(torch.from_numpy(a_s.view(np.int32)), s.view(torch.int32), "a_scale")

    row_kernel()


@pytest.mark.skipif(not SIM, reason="the simulator runs when there is no GPU")
@pytest.mark.parametrize("examples", SIM_EXAMPLES)
def test_simulator_attention_quantization_fuzz(examples):
    @settings(max_examples=examples, deadline=None, suppress_health_check=SLOW)
    @given(seqlens=segment_lists(max_len=140, max_segments=4), heads=st.integers(1, 2),
           k_offset=st.sampled_from([0.0, 40.0]), seed=st.integers(0, 2**31 - 1))
    def attention_quantization(seqlens, heads, k_offset, seed):
        q, k, v, _, cu = make_attention_inputs(seqlens, heads, device="cpu", seed=seed, k_offset=k_offset)
        mismatches = numba_check.attention_pass_mismatches(q, k, v, cu)
        assert not mismatches, f"differ from the reference: {mismatches}"

    attention_quantization()


# --- GPU: both operators end to end ----------------------------------------------------------------

@pytest.mark.gpu
@settings(max_examples=GPU_EXAMPLES, deadline=None, suppress_health_check=SLOW + [HealthCheck.function_scoped_fixture])
@given(case=mlp_rows(max_m=300, max_rows=64), out_mode=st.sampled_from([None, "residual", "x"]),
       caller_ws=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_gpu_mlp_fuzz(weights, case, out_mode, caller_ws, seed, mlp_form):
    m, rows, index = case
    inp = make_mlp_inputs(m, rows, device="cuda", seed=seed, row_inputs=fuzz_row_inputs(index, rows, seed, "cuda"))
    keep = {k: v.clone() for k, v in inp.items()}  # out may overwrite x or residual
    ws = poisoned_mlp_workspaces(m)
    call = lambda args, ws: h3kernels.minimax_h3_mlp_fp8(*mlp_arguments(args, weights),  # noqa: E731
                                                          out=None if out_mode is None else args[out_mode],
                                                          fp8_mma_form=mlp_form, **ws)
    out = call(inp, ws if caller_ws else {})
    torch.cuda.synchronize()
    if not caller_ws:  # the stages are checked through workspaces: run again into ours
        out2 = call({k: v.clone() for k, v in keep.items()}, ws)
        torch.cuda.synchronize()
        assert same_bits(out, out2)
    check_mlp_stages(keep, weights, out, ws, f"fuzz m={m} rows={rows} seed={seed} form={mlp_form}", report_exact=False,
                     form=mlp_form)


@pytest.mark.gpu
@settings(max_examples=GPU_EXAMPLES, deadline=None, suppress_health_check=SLOW)
@given(seqlens=segment_lists(max_len=700, max_segments=6), heads=st.sampled_from([1, 2, 3, 8]),
       k_offset=st.sampled_from([0.0, 30.0]), host=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_gpu_attention_fuzz(seqlens, heads, k_offset, host, seed):
    q, k, v, cu_dev, cu = make_attention_inputs(seqlens, heads, device="cuda", seed=seed, k_offset=k_offset)
    out = poisoned_like(q)
    h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, out, cu_seqlens_host=cu if host else None)
    torch.cuda.synchronize()
    misses = attention_misses(out, q, k, v, cu)
    assert not misses, misses
