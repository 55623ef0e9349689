"""h3kernels.reference against the contract's definitions and against unquantized math."""
import numpy as np
import pytest
import torch

from h3kernels import reference as R
from h3kernels.testing.checks import cos, rel_l2
from h3kernels.constants import FC1_OUT, FFN, HIDDEN, fc1_row_order_numpy


def row_inputs(m, rows, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, HIDDEN, generator=g) * 3).bfloat16()
    w = (1 + 0.2 * torch.randn(HIDDEN, generator=g)).bfloat16()
    wide = torch.randn(rows, 6 * HIDDEN, generator=g).bfloat16()
    return x, w, wide[:, HIDDEN:2 * HIDDEN], wide[:, 4 * HIDDEN:5 * HIDDEN], g


# --- quantization definitions ------------------------------------------------------------

def test_quantize_rows_follows_the_definition_and_zero_rows_get_zero_scale(seed):
    v = torch.randn(5, 300, generator=torch.Generator().manual_seed(seed)) * torch.tensor([1.0, 1e-30, 0.0, 1e30, 7.0])[:, None]
    v[2] = 0
    q, s = R.quantize_rows(v)
    amax = v.abs().amax(dim=1)
    for i in range(5):
        if amax[i] == 0:
            assert s[i] == 0 and (q[i].view(torch.uint8) == 0).all()
            continue
        assert s[i].item() == (amax[i] / 448.0).item()
        want = torch.clamp(v[i] / s[i], -448, 448).to(torch.float8_e4m3fn)
        assert torch.equal(q[i].view(torch.uint8), want.view(torch.uint8))
    assert not torch.isnan(q.float()).any()


def test_fc1_row_order_is_a_permutation_pairing_gate_and_up():
    order = fc1_row_order_numpy()
    assert sorted(order.tolist()) == list(range(FC1_OUT))
    gate, up = order.reshape(-1, 2, 8)[:, 0], order.reshape(-1, 2, 8)[:, 1]
    assert (gate < FFN).all() and (up == gate + FFN).all()
    assert torch.equal(R.minimax_h3_fc1_row_order(), torch.from_numpy(order))


def test_prepare_weights_quantize_per_row_in_prepacked_order(seed):
    g = torch.Generator().manual_seed(seed)
    w1 = (torch.randn(FC1_OUT, HIDDEN, generator=g) * 0.02).bfloat16()
    w1[5] = 0  # a zero row
    q, s = R.prepare_minimax_h3_fc1_weight_fp8(w1)
    order = R.minimax_h3_fc1_row_order()
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert tuple(q.shape) == (FC1_OUT, HIDDEN) and tuple(s.shape) == (FC1_OUT,)
    back = torch.empty_like(s)
    back[order] = s
    assert torch.equal(back, w1.float().abs().amax(dim=1) / 448.0)
    r = int((order == 5).nonzero())
    assert s[r] == 0 and (q[r].view(torch.uint8) == 0).all()
    for r in (0, 1, 9, 17, FC1_OUT - 1):
        want = R.e4m3(w1[order[r]].float() / s[r])
        assert torch.equal(q[r].view(torch.uint8), want.view(torch.uint8))

    w2 = torch.randn(HIDDEN, FFN, generator=g, dtype=torch.float32) * 0.02
    q2, s2 = R.prepare_minimax_h3_fc2_weight_fp8(w2)
    assert torch.equal(s2, w2.abs().amax(dim=1) / 448.0)
    assert torch.equal(q2[7].view(torch.uint8), R.e4m3(w2[7] / s2[7]).view(torch.uint8))
    with pytest.raises(ValueError, match="w2"):
        R.prepare_minimax_h3_fc2_weight_fp8(w2[:, :100])


# --- row stage ---------------------------------------------------------------------------

def test_sum_of_squares_is_an_fp32_sum(seed):
    x = torch.randn(64, HIDDEN, generator=torch.Generator().manual_seed(seed)).bfloat16()
    ss = R.sum_of_squares(x)
    exact = (x.double() ** 2).sum(dim=1)
    assert ss.dtype == torch.float32
    assert ((ss.double() - exact).abs() / exact).max() < 1e-6


def test_rms_scale_is_correctly_rounded_fp32(seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(4096, HIDDEN, generator=g) * torch.rand(4096, 1, generator=g) * 10).bfloat16()
    ss = R.sum_of_squares(x).numpy()
    want = np.float32(1) / np.sqrt(ss / np.float32(HIDDEN) + np.float32(1e-5))  # IEEE ops in numpy
    assert np.array_equal(R.rms_scale(x, 1e-5).numpy(), want)


def test_row_stage_follows_the_contract_elementwise(seed):
    x, w, sc, sh, g = row_inputs(6, 4, seed)
    idx = torch.tensor([0, 3, 1, 2, 2, 0])
    a = R.mlp_row_stage(x, w, sc, sh, idx, eps=1e-5)
    ss = R.sum_of_squares(x).numpy()
    for row in range(6):
        r = np.float32(1) / np.sqrt(ss[row] / np.float32(HIDDEN) + np.float32(1e-5))  # IEEE FP32 ops
        n = ((x[row].float() * torch.tensor(r)) * w.float()).bfloat16().float()
        t = (1 + sc[idx[row]].float()).bfloat16().float()
        want = (n * t + sh[idx[row]].float()).bfloat16()
        assert torch.equal(a[row].view(torch.int16), want.view(torch.int16))


def test_index_guard_zero_rows_and_column_chunk_tables(seed):
    rows = 5
    x, w, sc, sh, g = row_inputs(8, rows, seed)
    x[2] = 0  # zero row with a valid index: a = bf16(0 * t + shift) = shift
    idx = torch.tensor([0, -1, 3, rows, 4, 2**40, -(2**40), 1])
    a = R.mlp_row_stage(x, w, sc, sh, idx)
    for row in (1, 3, 5, 6):
        assert (a[row].view(torch.int16) == 0).all()
    assert torch.equal(a[2], sh[3])
    a_copy = R.mlp_row_stage(x, w, sc.contiguous(), sh.contiguous(), idx)
    assert torch.equal(a.view(torch.int16), a_copy.view(torch.int16))
    q, s = R.quantize_rows(a)
    assert (s[[1, 3, 5, 6]] == 0).all() and not torch.isnan(q.float()).any()
    # a zero row whose shift is zero too quantizes to zeros, not NaN
    sh0 = sh.clone()
    sh0[3] = 0
    q0, s0 = R.quantize_rows(R.mlp_row_stage(x, w, sc, sh0, idx))
    assert s0[2] == 0 and (q0[2].view(torch.uint8) == 0).all()


def small_mlp(seed, m=9, rows=4):
    """Full reference MLP on random weights (H3 sizes are fixed by the contract)."""
    x, w, sc, sh, g = row_inputs(m, rows, seed)
    w1 = (torch.randn(FC1_OUT, HIDDEN, generator=g) * HIDDEN ** -0.5).bfloat16()
    w2 = (torch.randn(HIDDEN, FFN, generator=g) * FFN ** -0.5).bfloat16()
    gate = torch.randn(rows, HIDDEN, generator=g).bfloat16()
    residual = torch.randn(m, HIDDEN, generator=g).bfloat16()
    idx = torch.randint(0, rows, (m,), generator=g)
    idx[1], idx[4] = -1, rows
    return x, w, sc, sh, idx, gate, residual, w1, w2


@pytest.fixture(scope="module")
def mlp_case(seed_of):
    case = small_mlp(seed_of("mlp_case"))
    x, w, sc, sh, idx, gate, residual, w1, w2 = case
    prepared = R.prepare_minimax_h3_fc1_weight_fp8(w1) + R.prepare_minimax_h3_fc2_weight_fp8(w2)
    return case, prepared


def test_mlp_workspaces_guard_and_accuracy(mlp_case):
    (x, w, sc, sh, idx, gate, residual, w1, w2), (q1, s1, q2, s2) = mlp_case
    m = x.shape[0]
    ws = dict(workspace_a_q=torch.full((m, HIDDEN), 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn),
              workspace_a_scale=torch.full((m,), float("nan")),
              workspace_y=torch.full((m, FFN), float("nan"), dtype=torch.bfloat16),
              workspace_y_q=torch.full((m, FFN), 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn),
              workspace_y_scale=torch.full((m,), float("nan")))
    out = R.minimax_h3_mlp_fp8(x, w, sc, sh, idx, gate, residual, q1, s1, q2, s2, **ws)
    a_q, a_s = R.quantize_rows(R.mlp_row_stage(x, w, sc, sh, idx))
    assert torch.equal(ws["workspace_a_q"].view(torch.uint8), a_q.view(torch.uint8))
    assert torch.equal(ws["workspace_a_scale"], a_s)
    y_q, y_s = R.quantize_rows(ws["workspace_y"])
    assert torch.equal(ws["workspace_y_q"].view(torch.uint8), y_q.view(torch.uint8))
    assert torch.equal(ws["workspace_y_scale"], y_s)
    assert not torch.isnan(ws["workspace_y"].float()).any()
    for row in (1, 4):  # index-guarded rows: out is residual, bitwise
        assert torch.equal(out[row].view(torch.int16), residual[row].view(torch.int16))
    ok = torch.ones(m, dtype=torch.bool)
    ok[[1, 4]] = False
    exact = R.mlp_exact_bf16(x, w, sc, sh, idx, gate, w1, w2)
    delta = out.float() - residual.float()
    assert rel_l2(delta[ok], exact[ok]) < 0.1
    assert cos(delta[ok], exact[ok]) > 0.99


def test_mlp_tables_must_share_one_row_count(mlp_case):
    (x, w, sc, sh, idx, gate, residual, w1, w2), (q1, s1, q2, s2) = mlp_case
    with pytest.raises(ValueError, match="gate: got 3 rows"):
        R.minimax_h3_mlp_fp8(x, w, sc, sh, idx, gate[:3], residual, q1, s1, q2, s2)


def test_division_is_correctly_rounded_for_scalar_divisors(seed):
    v = torch.rand(1_000_000, generator=torch.Generator().manual_seed(seed)) * 1000
    assert np.array_equal(R.div(v, 448.0).numpy(), v.numpy() / np.float32(448))
    assert np.array_equal(R.div(v, 5376).numpy(), v.numpy() / np.float32(5376))


def test_mlp_out_may_alias_residual(mlp_case):
    (x, w, sc, sh, idx, gate, residual, w1, w2), (q1, s1, q2, s2) = mlp_case
    want = R.minimax_h3_mlp_fp8(x, w, sc, sh, idx, gate, residual, q1, s1, q2, s2)
    res = residual.clone()
    got = R.minimax_h3_mlp_fp8(x, w, sc, sh, idx, gate, res, q1, s1, q2, s2, out=res)
    assert got is res and torch.equal(res.view(torch.int16), want.view(torch.int16))


def test_mlp_y_is_swiglu_of_h_in_logical_order(mlp_case):
    (x, w, sc, sh, idx, gate, residual, w1, w2), (q1, s1, q2, s2) = mlp_case
    m = x.shape[0]
    y = torch.empty(m, FFN, dtype=torch.bfloat16)
    a_q = torch.empty(m, HIDDEN, dtype=torch.float8_e4m3fn)
    a_s = torch.empty(m)
    R.minimax_h3_mlp_fp8(x, w, sc, sh, idx, gate, residual, q1, s1, q2, s2, workspace_y=y,
                         workspace_a_q=a_q, workspace_a_scale=a_s)
    order = R.minimax_h3_fc1_row_order()
    col = 1234
    rg, ru = int((order == col).nonzero()), int((order == col + FFN).nonzero())
    h = lambda r: ((a_q.double() @ q1[r].double()).float() * a_s * s1[r]).bfloat16().float()
    hg, hu = h(rg), h(ru)
    want = ((hg / (1 + torch.exp(-hg))).bfloat16().float() * hu).bfloat16()
    assert torch.equal(y[:, col].view(torch.int16), want.view(torch.int16))


# --- attention ---------------------------------------------------------------------------

def attn_inputs(seqlens, heads, seed, k_offset=0.0):
    g = torch.Generator().manual_seed(seed)
    t = sum(seqlens)
    q, k, v = (torch.randn(t, heads, 128, generator=g) for _ in range(3))
    k = k + k_offset * torch.randn(1, heads, 128, generator=g)
    cu = torch.tensor([0] + list(torch.tensor(seqlens).cumsum(0)), dtype=torch.int32)
    return q.bfloat16(), k.bfloat16(), v.bfloat16(), cu


def test_attention_error_is_set_by_e4m3_rounding(seed):
    q, k, v, cu = attn_inputs([300, 0, 129, 64], 3, seed)
    err = rel_l2(R.minimax_h3_varlen_attention_fp8(q, k, v, cu), R.attention_exact(q, k, v, cu))
    assert 0.03 < err < 0.07, err


def test_attention_k_offset_is_smoothed_away(seed):
    seqlens, heads = [256, 200], 2
    q, k, v, cu = attn_inputs(seqlens, heads, seed)
    plain = rel_l2(R.minimax_h3_varlen_attention_fp8(q, k, v, cu), R.attention_exact(q, k, v, cu))
    q, k, v, cu = attn_inputs(seqlens, heads, seed, k_offset=30.0)
    shifted = rel_l2(R.minimax_h3_varlen_attention_fp8(q, k, v, cu), R.attention_exact(q, k, v, cu))
    assert abs(shifted - plain) < 0.15 * plain, (plain, shifted)


def test_attention_quantization_blocks_and_scales(seed):
    q, k, v, cu = attn_inputs([300, 5], 2, seed)
    q8, s_q, k8, s_k, v8, s_v = R.quantize_attention_inputs(q, k, v, cu)
    mu = k[:300].float().mean(dim=0)
    kc = k[128:256].float() - mu
    s = kc.abs().amax(dim=(0, 2)) / 448.0
    assert torch.equal(s_k[128], s) and torch.equal(s_k[255], s)
    assert torch.equal(k8[128:256].view(torch.uint8), R.e4m3(kc / s[None, :, None]).view(torch.uint8))
    assert torch.equal(s_v[301], v[300:].float().abs().amax(dim=0) / 448.0)
    assert torch.equal(s_q, q.float().abs().amax(dim=2) / 448.0)


def test_attention_degenerate_inputs_give_no_nan(seed):
    q, k, v, cu = attn_inputs([130, 3], 2, seed)
    q[5] = 0  # zero Q row: uniform softmax
    k[0:128] = k[0]  # constant K in a block: s_k = 0
    v[:, :, 17] = 0  # zero V channel
    out = R.minimax_h3_varlen_attention_fp8(q, k, v, cu)
    assert not torch.isnan(out.float()).any()
    assert (out[:, :, 17].float() == 0).all()
    empty = R.minimax_h3_varlen_attention_fp8(q[:0], k[:0], v[:0], torch.zeros(1, dtype=torch.int32))
    assert empty.shape == (0, 2, 128)


def test_attention_empty_segments_anywhere_and_host_seqlens(seed):
    q, k, v, cu = attn_inputs([0, 50, 0, 70, 0], 2, seed)
    out = R.minimax_h3_varlen_attention_fp8(q, k, v, cu)
    out_h = R.minimax_h3_varlen_attention_fp8(q, k, v, cu, cu_seqlens_host=cu.tolist())
    assert torch.equal(out.view(torch.int16), out_h.view(torch.int16))
    assert rel_l2(out, R.attention_exact(q, k, v, cu)) < 0.07
