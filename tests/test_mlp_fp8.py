"""minimax_h3_mlp_fp8 and its GEMM kernels against h3kernels.reference (GPU), and their build
constraints (CPU). Every stage is read back through the workspaces and checked element by element."""
import json
import math
import os

import pytest
import torch

import h3kernels
from h3kernels import reference as R
from h3kernels._launch import mlp_fp8 as L
from h3kernels.testing.checks import bf16_ulps, cos, rel_l2
from h3kernels.testing.inputs import make_row_inputs
from h3kernels.testing.poison import poisoned_mlp_workspaces
from h3kernels.constants import FC1_OUT, FFN, HIDDEN, fc1_row_order_numpy


def test_gemm_constants_fit_the_flags_and_sm120():
    assert (L.CHUNK_COLS, L.BM) == (h3kernels.constants.FC2_FLAG_COLS, h3kernels.constants.FC2_FLAG_ROWS)
    assert L.SMEM_BYTES <= 99 * 1024 and FC1_OUT % L.BN == 0 and HIDDEN % L.BN == 0 and FFN % L.CHUNK_COLS == 0


def test_flag_count():
    assert h3kernels.minimax_h3_mlp_fc2_flags(1) == 1 + 14
    assert h3kernels.minimax_h3_mlp_fc2_flags(129) == 1 + 2 * 14
    assert h3kernels.minimax_h3_mlp_fc2_flags_sm120(149796) == 1 + 1171 * 14


def log(record):
    """Diagnostics for docs/numerics.md: printed, and appended to $H3KERNELS_TEST_LOG if set."""
    print(json.dumps(record))
    path = os.environ.get("H3KERNELS_TEST_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


# The kernel sums 5376 exact e4m3 products in FP32 through the tensor cores, in its own order;
# the reference sums them exactly. Their difference is bounded by ACC_BOUND * sum|products|
# (about 336 accumulation steps of k16, each off by at most ~2^-23 of the running magnitude,
# doubled for the products' alignment inside the unit). In ulps of h that bound is b; h itself
# then differs by at most b + 1 ulps after rounding, SiLU scales a relative change of h_gate by
# its slope, and three bf16 roundings follow. So every y element must lie within
# slope * (b_gate + 1) + b_up + 3 ulps: an element beyond that is a bug, not an order effect.
# The "never more than 2 ulps" cannot hold for every element of an FP32-accumulating
# kernel (a near-cancelling sum, or one flipped rounding of h_gate where SiLU is steep, exceeds
# it); the 99.9%-within-1-ulp criterion is kept as written, and the >2-ulp counts are logged
# (docs/numerics.md).
ACC_BOUND = 672 * 2.0 ** -23
ROW_CHUNK = 8192


def check_y(a_q, a_scale, w1_q, w1_scale, y, tag):
    """y against the reference computed from the kernel's own a_q; returns the stats it logs."""
    order = torch.from_numpy(fc1_row_order_numpy()).to(y.device)
    w_abs = w1_q.to(torch.float64).abs()
    n = worse1 = worse2 = unexplained = 0
    max_ulps = max_well = 0
    for r0 in range(0, y.shape[0], ROW_CHUNK):
        aq, sa = a_q[r0:r0 + ROW_CHUNK], a_scale[r0:r0 + ROW_CHUNK]
        want = R.fc1_swiglu(aq, sa, w1_q, w1_scale)
        ulps = bf16_ulps(y[r0:r0 + ROW_CHUNK], want)
        n += ulps.numel()
        worse1 += int((ulps > 1).sum())
        max_ulps = max(max_ulps, int(ulps.max()))
        if int(ulps.max()) <= 2:
            continue
        acc = R.exact_dot(aq, w1_q).to(torch.float64)
        cond = (aq.to(torch.float64).abs() @ w_abs.T) * ACC_BOUND * 256 / acc.abs()  # bound in h ulps
        logical = torch.empty_like(cond)
        logical[:, order] = cond
        bg, bu = logical[:, :FFN], logical[:, FFN:]
        h = torch.empty_like(acc)
        h[:, order] = R.bf16((R.exact_dot(aq, w1_q) * sa[:, None]) * w1_scale[None, :]).to(torch.float64)
        g = h[:, :FFN]
        slope = (1 + g * (1 - torch.sigmoid(g))).abs()  # d log silu / d log g
        well = (bg < 1) & (bu < 1) & (slope < 2)
        max_well = max(max_well, int(ulps[well].max()) if well.any() else 0)
        allowed = 2 + slope * (1 + bg) + (1 + bu)
        bad = (ulps > 2) & ~(ulps <= allowed)
        worse2 += int((ulps > 2).sum())
        unexplained += int(bad.sum())
        if bad.any():
            i = bad.nonzero()[0].tolist()
            raise AssertionError(f"{tag}: y[{r0 + i[0]}, {i[1]}] is {int(ulps[i[0], i[1]])} ulps off with "
                                 f"h_gate {float(g[i[0], i[1]])}, bounds {float(bg[i[0], i[1]])}, "
                                 f"{float(bu[i[0], i[1]])}: not an accumulation-order effect")
    stats = dict(check="y", tag=tag, elements=n, over_1_ulp=worse1, over_2_ulps=worse2, max_ulps=max_ulps,
                 max_ulps_well_conditioned=max_well, unexplained=unexplained)
    log(stats)
    assert worse1 <= 1e-3 * n, stats  # within 1 ulp for at least 99.9% of elements
    assert unexplained == 0, stats
    return stats


def check_out(y_q, y_scale, w2_q, w2_scale, gate, idx, residual, out, tag):
    """out against the reference computed from the kernel's own y_q (bitwise-checked against y)."""
    valid_idx, valid = R.index_guard(idx, gate.shape[0])
    n = worse1 = 0
    max_ulps = 0
    for r0 in range(0, out.shape[0], ROW_CHUNK):
        sl = slice(r0, r0 + ROW_CHUNK)
        o = R.bf16((R.exact_dot(y_q[sl], w2_q) * y_scale[sl, None]) * w2_scale[None, :])
        want = R.bf16(residual[sl].float() + R.bf16(gate[valid_idx[sl]].float() * o.float()).float())
        want = torch.where(valid[sl, None], want, residual[sl])
        got = out[sl]
        g = ~valid[sl]
        if g.any():  # index-guarded rows: residual, bitwise
            assert torch.equal(got[g].view(torch.int16), residual[sl][g].view(torch.int16)), tag
        ulps = bf16_ulps(got, want)
        n += ulps.numel()
        worse1 += int((ulps > 1).sum())
        max_ulps = max(max_ulps, int(ulps.max()))
    stats = dict(check="out", tag=tag, elements=n, over_1_ulp=worse1, max_ulps=max_ulps)
    log(stats)
    assert worse1 <= 1e-3 * n, stats


@pytest.fixture(scope="module")
def weights():
    torch.manual_seed(torch.seed())
    w1 = (torch.randn(FC1_OUT, HIDDEN, device="cuda") * HIDDEN ** -0.5).bfloat16()
    w2 = (torch.randn(HIDDEN, FFN, device="cuda") * FFN ** -0.5).bfloat16()
    q1, s1 = h3kernels.prepare_minimax_h3_fc1_weight_fp8(w1)
    q2, s2 = h3kernels.prepare_minimax_h3_fc2_weight_fp8(w2)
    return dict(w1=w1, w2=w2, q1=q1, s1=s1, q2=q2, s2=s2)


def make_inputs(m, rows):
    x, w, sc, sh, idx = make_row_inputs(m, rows, device="cuda", seed=torch.seed() % 2**31)
    if m >= 3:
        idx[1] = -5  # one more out-of-range kind: negative
    gate = torch.randn(rows, 2 * HIDDEN, device="cuda").bfloat16()[:, HIDDEN:]  # a column chunk
    residual = torch.randn(m, HIDDEN, device="cuda").bfloat16()
    return dict(x=x, x_norm_weight=w, adaln_scale=sc, adaln_shift=sh, adaln_index=idx, gate=gate, residual=residual)


workspaces = poisoned_mlp_workspaces  # every stage NaN-filled before a run


def run_op(inp, wt, out_mode, ws, form=-1):
    """Calls the operator; out_mode None, 'residual' or 'x' (out aliases that input)."""
    args = dict(inp)
    out = None if out_mode is None else args[out_mode]
    return h3kernels.minimax_h3_mlp_fp8(
        args["x"], args["x_norm_weight"], args["adaln_scale"], args["adaln_shift"], args["adaln_index"],
        args["gate"], args["residual"], wt["q1"], wt["s1"], wt["q2"], wt["s2"], out=out, fp8_mma_form=form, **ws)


def check_all(inp, wt, out, ws, tag, report_exact=True):
    """Every stage: a_q/a_scale bitwise, y within ulps, y_q/y_scale bitwise from y, out within 1 ulp."""
    a = R.mlp_row_stage(inp["x"], inp["x_norm_weight"], inp["adaln_scale"], inp["adaln_shift"], inp["adaln_index"])
    a_q, a_s = R.quantize_rows(a)
    assert torch.equal(ws["workspace_a_q"].view(torch.uint8), a_q.view(torch.uint8)), tag
    assert torch.equal(ws["workspace_a_scale"], a_s), tag
    y = ws["workspace_y"]
    assert not torch.isnan(y.float()).any(), tag
    check_y(ws["workspace_a_q"], ws["workspace_a_scale"], wt["q1"], wt["s1"], y, tag)
    for r0 in range(0, y.shape[0], ROW_CHUNK):
        yq, ys = R.quantize_rows(y[r0:r0 + ROW_CHUNK])
        assert torch.equal(ws["workspace_y_q"][r0:r0 + ROW_CHUNK].view(torch.uint8), yq.view(torch.uint8)), tag
        assert torch.equal(ws["workspace_y_scale"][r0:r0 + ROW_CHUNK], ys), tag
    check_out(ws["workspace_y_q"], ws["workspace_y_scale"], wt["q2"], wt["s2"], inp["gate"], inp["adaln_index"],
              inp["residual"], out, tag)
    if report_exact:
        n = min(out.shape[0], 2048)
        sub = {k: (v[:n] if k in ("x", "adaln_index") else v) for k, v in inp.items()}
        want = R.mlp_exact_bf16(sub["x"], sub["x_norm_weight"], sub["adaln_scale"], sub["adaln_shift"],
                                sub["adaln_index"], sub["gate"], wt["w1"], wt["w2"])
        got = (out[:n].float() - inp["residual"][:n].float())
        c, rel = cos(got, want), rel_l2(got, want)
        log(dict(check="out-residual vs unquantized bf16 weights (FP32 math)", tag=tag, rows=n, cos=c, rel_l2=rel))
        assert c > 0.99 and rel < 0.1, (c, rel)


CASES = [(1, 1, None, True), (2, 8, "residual", False), (127, 50, "x", True), (128, 1, None, False),
         (129, 8, "residual", True), (1000, 50, "x", False), (4096, 8, None, True), (16384, 50, "residual", True)]


@pytest.mark.gpu
@pytest.mark.parametrize("m,rows,out_mode,caller_ws", CASES)
def test_mlp_matches_reference(m, rows, out_mode, caller_ws, weights):
    inp = make_inputs(m, rows)
    ref_inp = {k: v.clone() for k, v in inp.items()}  # out may overwrite x or residual
    ws = workspaces(m)
    if out_mode is None:
        out = run_op(inp, weights, None, ws if caller_ws else {})
    else:
        out = run_op(inp, weights, out_mode, ws if caller_ws else {})
        assert out.data_ptr() == inp[out_mode].data_ptr()
    torch.cuda.synchronize()
    assert out.shape == (m, HIDDEN) and out.dtype == torch.bfloat16
    if not caller_ws:  # internal workspaces: rerun with caller ones to read the stages
        out2 = run_op(ref_inp, weights, None, ws)
        assert torch.equal(out.view(torch.int16), out2.view(torch.int16))
    check_all(ref_inp, weights, out, ws, f"M={m} rows={rows} out={out_mode} caller_ws={caller_ws}",
              report_exact=m in (129, 4096))
    assert int(ws["workspace_flags"][0]) >= -(-m // 16)  # every row group was claimed


@pytest.mark.gpu
def test_every_form_gives_the_same_bits(weights):
    from h3kernels.peers import mma_ceiling

    inp = make_inputs(300, 8)
    outs = [run_op(inp, weights, None, {}, form) for form in (-1,) + tuple(f for f in mma_ceiling.supported_forms()
                                                                           if f in (0, 2))]
    for o in outs[1:]:
        assert torch.equal(o.view(torch.int16), outs[0].view(torch.int16))


@pytest.mark.gpu
def test_largest_m_once(weights):
    m = h3kernels.MAX_M
    inp = make_inputs(m, 50)
    ws = workspaces(m)
    out = run_op(inp, weights, None, ws)
    torch.cuda.synchronize()
    check_all(inp, weights, out, ws, f"M={m}", report_exact=False)


@pytest.mark.gpu
def test_repeated_runs_are_bitwise_identical(weights):
    inp = make_inputs(4096, 50)
    ws = workspaces(4096)
    first = run_op(inp, weights, None, ws).clone()
    y = ws["workspace_y"].clone()
    for _ in range(3):
        again = run_op(inp, weights, None, ws)
        assert torch.equal(again.view(torch.int16), first.view(torch.int16))
        assert torch.equal(ws["workspace_y"].view(torch.int16), y.view(torch.int16))


@pytest.mark.gpu
def test_nondefault_torch_stream_and_cupy_inputs(weights):
    cupy = pytest.importorskip("cupy")
    inp = make_inputs(300, 8)
    want = run_op(inp, weights, None, {})
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = run_op(inp, weights, None, {})
    s.synchronize()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))

    def cp(t):
        if t.dtype in (torch.bfloat16,):
            return cupy.from_dlpack(t.view(torch.int16)).view(cupy.uint16)
        if t.dtype == torch.float8_e4m3fn:
            return cupy.from_dlpack(t.view(torch.uint8))
        return cupy.from_dlpack(t)

    torch.cuda.synchronize()
    c = {k: cp(v) for k, v in inp.items()}
    wc = {k: cp(v) for k, v in weights.items() if k in ("q1", "s1", "q2", "s2")}
    with cupy.cuda.Stream(non_blocking=True) as cs:
        res = h3kernels.minimax_h3_mlp_fp8(c["x"], c["x_norm_weight"], c["adaln_scale"], c["adaln_shift"],
                                           c["adaln_index"], c["gate"], c["residual"], wc["q1"], wc["s1"],
                                           wc["q2"], wc["s2"])
        cs.synchronize()
    assert isinstance(res, cupy.ndarray) and res.shape == (300, HIDDEN)
    assert (cupy.asnumpy(res.view(cupy.int16)) == want.view(torch.int16).cpu().numpy()).all()


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 129, 1000])
def test_fc1_kernel_alone(m, weights):
    from h3kernels._runtime import arrays, targets

    a = torch.randn(m, HIDDEN, device="cuda").bfloat16()
    a_q, a_s = R.quantize_rows(a)
    y = torch.full((m, FFN), float("nan"), dtype=torch.bfloat16, device="cuda")
    call = arrays.Call(dict(a_q=a_q, y=y))
    previous = call.make_current()
    ptr = arrays.data_ptr
    L.launch_fc1(call, targets.mma_form(call.device_id), m, ptr(a_q), ptr(a_s), ptr(weights["q1"]), ptr(weights["s1"]),
                 ptr(y))
    arrays.restore(previous)
    torch.cuda.synchronize()
    assert not torch.isnan(y.float()).any()
    check_y(a_q, a_s, weights["q1"], weights["s1"], y, f"fc1 alone M={m}")


def test_acc_bound_is_what_the_comment_says():
    assert math.isclose(ACC_BOUND * 2 ** 23, 2 * HIDDEN / 16)
