"""Extreme values, 32-bit index limits and concurrent callers, on the GPU.

A non-finite input poisons only what the contract ties to it: for the MLP its own row; for the
attention its own query row (a bad q) or its own segment and head (a bad k or v: the key mean and
the V scales are per segment and head). Everything else must come out bitwise as in a clean run.
"""
import threading

import pytest
import torch

import h3kernels
from h3kernels._runtime import compiler
from h3kernels import reference as R
from h3kernels.testing.checks import check_mlp_stages, reference_bound, rel_l2, same_bits
from h3kernels.testing.inputs import make_attention_inputs, make_mlp_inputs, mlp_arguments
from h3kernels.testing.poison import poisoned_like, poisoned_mlp_workspaces
from h3kernels.testing.threads import run_threads
from h3kernels.constants import HIDDEN


def mlp(inp, weights, ws=None, form=-1):
    return h3kernels.minimax_h3_mlp_fp8(*mlp_arguments(inp, weights), fp8_mma_form=form, **(ws or {}))


# --- MLP ----------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_mlp_extreme_rows(weights, seed, mlp_form):
    """Zero, near-bf16-max, tiny and subnormal rows are finite and exact; a NaN or an Inf in x, or
    a NaN in a gate row, makes exactly the rows that use it non-finite."""
    m, rows = 64, 8
    inp = make_mlp_inputs(m, rows, seed=seed)
    g = torch.Generator(device="cuda").manual_seed(seed + 2)  # not make_mlp_inputs' streams
    x = inp["x"]
    x[2] = 0
    x[3] = (torch.rand(HIDDEN, generator=g, device="cuda") * 3.3e38).bfloat16()  # squares overflow FP32: r = 0
    x[4] = (torch.randn(HIDDEN, generator=g, device="cuda") * 1e-38).bfloat16()  # subnormal bf16 values
    x[5] = (torch.randn(HIDDEN, generator=g, device="cuda") * 1e-30).bfloat16()
    inp["adaln_index"][2:6] = 0
    clean_ws = poisoned_mlp_workspaces(m)
    clean = mlp(inp, weights, clean_ws, mlp_form)
    torch.cuda.synchronize()
    check_mlp_stages(inp, weights, clean, clean_ws, f"extreme rows, form {mlp_form}", report_exact=False, form=mlp_form)
    assert torch.isfinite(clean.float()).all()

    bad = {k: v.clone() for k, v in inp.items()}
    bad["x"][10, 17] = float("nan")
    bad["x"][11, 4000] = float("inf")
    bad["adaln_index"][12] = rows - 1
    bad["gate"][rows - 1, 5] = float("nan")  # every row using table row rows-1 (row 12 among them)
    gated = set((bad["adaln_index"] == rows - 1).nonzero().flatten().tolist())
    poisoned = {10, 11} | gated
    bad_ws = poisoned_mlp_workspaces(m)
    got = mlp(bad, weights, bad_ws, mlp_form)
    torch.cuda.synchronize()
    keep = [r for r in range(m) if r not in poisoned]
    assert same_bits(got[keep], clean[keep])
    for name in ("workspace_a_q", "workspace_y", "workspace_y_q"):
        ok = bad_ws[name].view(torch.uint8)[keep].equal(clean_ws[name].view(torch.uint8)[keep])
        assert ok, name
    for r in poisoned:
        assert not torch.isfinite(got[r].float()).all(), r


# --- attention -----------------------------------------------------------------------------------------

def attention(q, k, v, cu):
    """The operator into a NaN-poisoned out, so that an element it skips shows."""
    out = poisoned_like(q)
    res = h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, torch.tensor(cu, dtype=torch.int32, device=q.device), out,
                                                   cu_seqlens_host=cu)
    torch.cuda.synchronize()
    assert res is out
    return res


@pytest.mark.gpu
def test_attention_extreme_values(seed):
    """Constant K (k' = 0: uniform attention), zero V (out = 0), huge and tiny segments: finite and
    within the usual bounds of the reference; a NaN in q, and an Inf in k, poison only their row,
    and their segment and head."""
    seqlens, heads = [200, 300, 150, 257, 90], 2
    q, k, v, _, cu = make_attention_inputs(seqlens, heads, device="cuda", seed=seed)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    seg = lambda i: slice(cu[i], cu[i + 1])
    k[seg(0)] = (torch.randn(1, heads, 128, generator=g, device="cuda") * 3).bfloat16()  # constant K
    v[seg(1)] = 0  # zero V
    q[seg(2)] = (q[seg(2)].float() * 1e30).bfloat16()  # huge q (S stays finite in FP32): P one-hot per row
    q[seg(3)], k[seg(3)], v[seg(3)] = ((t[seg(3)].float() * 1e-30).bfloat16() for t in (q, k, v))  # tiny
    clean = attention(q, k, v, cu)
    assert torch.isfinite(clean.float()).all()
    assert (clean[seg(1)].float() == 0).all()
    want = R.attention_fp8(q, k, v, cu)
    assert same_bits(clean[seg(0)], clean[cu[0]].expand(seqlens[0], heads, 128))  # uniform: every row alike
    for i in (0, 2, 3, 4):
        err = rel_l2(clean[seg(i)], want[seg(i)])
        assert err <= reference_bound(seqlens[i]), (i, err)

    bad_q, bad_k = q.clone(), k.clone()
    tq = cu[4] + 7
    bad_q[tq, 1, 3] = float("nan")
    bad_k[cu[2] + 5, 0, 100] = float("inf")
    got = attention(bad_q, bad_k, v, cu)
    poisoned = torch.zeros(q.shape[:2], dtype=torch.bool, device="cuda")
    poisoned[tq, 1] = True
    poisoned[seg(2), 0] = True
    assert same_bits(got[~poisoned], clean[~poisoned])
    assert not torch.isfinite(got[tq, 1].float()).all() and not torch.isfinite(got[seg(2), 0].float()).all()


@pytest.mark.gpu
def test_attention_beyond_2_31_elements(seed):
    """tokens * heads * 128 > 2**31: the last segments, whose elements lie past 2**31, come out as
    the reference's (every index in the kernels and passes is 64-bit from the token on)."""
    heads, seg_len = 56, 128
    tokens = (2**31 // (heads * 128 * seg_len) + 5) * seg_len  # the last three segments start past 2**31
    free = torch.cuda.mem_get_info()[0]
    if free < 8 * tokens * heads * 128 * 2:
        pytest.skip("needs about 40 GB of free GPU memory")
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(tokens, heads, 128, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    cu = list(range(0, tokens + 1, seg_len))
    out = attention(q, k, v, cu)
    last = slice(tokens - 3 * seg_len, tokens)
    assert (tokens - 3 * seg_len) * heads * 128 > 2**31
    want = R.attention_fp8(q[last], k[last], v[last], [0, seg_len, 2 * seg_len, 3 * seg_len])
    assert torch.isfinite(out[last].float()).all()
    assert rel_l2(out[last], want) <= reference_bound(seg_len)
    first = slice(0, 2 * seg_len)
    want0 = R.attention_fp8(q[first], k[first], v[first], [0, seg_len, 2 * seg_len])
    assert rel_l2(out[first], want0) <= reference_bound(seg_len)


# --- concurrency ---------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_two_threads_on_two_streams_match_serial_calls(weights, seed, mlp_form):
    """Two threads, each on its own stream, call both operators at different sizes at once, with
    the kernel caches emptied first so that both threads also compile and load at once."""
    jobs = []
    for i, (m, seqlens, heads) in enumerate([(200, [300, 0, 129], 8), (1000, [1024, 77], 4)]):
        inp = make_mlp_inputs(m, 8, seed=seed + 2 * i)
        att = make_attention_inputs(seqlens, heads, device="cuda", seed=seed + 2 * i + 1)
        jobs.append((inp, att))
    serial = []
    for inp, (q, k, v, cu_dev, cu) in jobs:
        serial.append((mlp(inp, weights, form=mlp_form).clone(), attention(q, k, v, cu).clone()))
    torch.cuda.synchronize()

    compiler.clear_caches()
    results = [None, None]
    barrier = threading.Barrier(2)

    def work(i):
        inp, (q, k, v, cu_dev, cu) = jobs[i]
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        barrier.wait()
        with torch.cuda.stream(s):
            got = []
            for _ in range(3):
                got.append((mlp(inp, weights, form=mlp_form),
                            h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, cu_seqlens_host=cu)))
        s.synchronize()
        results[i] = got

    errors = run_threads(work, 2)
    assert not errors, errors
    for i, got in enumerate(results):
        for out, att in got:
            assert same_bits(out, serial[i][0]) and same_bits(att, serial[i][1]), i
