"""The comparisons the tests, the demo and the benchmarks report: relative L2 error, cosine
similarity (both in float64) and the distance in bf16 steps between two bf16 tensors."""


def rel_l2(a, ref):
    """||a - ref|| / ||ref|| in float64."""
    import torch

    a, ref = torch.as_tensor(a).double(), torch.as_tensor(ref).double()
    return float((a - ref).norm() / ref.norm())


def cos(a, b):
    """Cosine similarity of the flattened tensors, in float64."""
    import torch

    return float(torch.nn.functional.cosine_similarity(torch.as_tensor(a).double().flatten(),
                                                       torch.as_tensor(b).double().flatten(), dim=0))


def bf16_ulps(a, b):
    """Elementwise distance in bf16 steps between two bf16 tensors of finite values (sign-aware:
    -0 and +0 are 0 apart, the smallest values of opposite signs 2)."""
    import torch

    def ordered(t):
        i = t.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(i < 0, -(i & 0x7FFF), i)
    return (ordered(a) - ordered(b)).abs()


# Keys per block of the attention kernel's pipeline: a segment of at most this many keys has
# its final row max from the first block on, so P rounds on the reference's grid.
ONE_BLOCK_KEYS = 64


def reference_bound(seqlen):
    """The rel L2 from h3kernels.reference that the output rows of a segment of `seqlen` keys are
    held to. 0.005 where P rounds on the reference's grid (a segment of one key block, whose
    running max is its final max: only the FP32 order and ex2.approx differ). Otherwise 0.03:
    the contract's online softmax rounds P against each block's running max, on other grids
    before the row's maximum, about 0.025 on thousands of random keys (docs/spec.md)."""
    return 0.005 if seqlen <= ONE_BLOCK_KEYS else 0.03


def attention_reference_misses(got, want, cu_host):
    """Where attention output `got` is further from the reference's `want` than
    varlen_attention_fp8.reference_bound allows, as (what, rel L2, bound) entries: each segment
    that fits one key block on its own (its bound is the tight one), and the whole set against
    the largest bound of its segments. [] when it is within them all."""
    lens = [b - a for a, b in zip(cu_host, cu_host[1:])]
    misses = []
    for seg, (a, n) in enumerate(zip(cu_host, lens)):
        if 0 < n and reference_bound(n) < reference_bound(max(lens)):
            err = rel_l2(got[a:a + n], want[a:a + n])
            if not err <= reference_bound(n):
                misses.append((f"segment {seg} ({n} keys)", err, reference_bound(n)))
    err, bound = rel_l2(got, want), reference_bound(max(lens, default=0))
    if not err <= bound:
        misses.append(("all rows", err, bound))
    return misses


def same_bits(a, b):
    """Whether two tensors of one shape and dtype hold the same bit patterns (NaNs included, -0
    apart from +0), on any device."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))


def assert_same_bits(got, want, what):
    """Raises AssertionError naming how many elements of integer tensors (raw bits) `got` and
    `want` differ, in which rows, and the first few (row, col, got, want)."""
    got, want = got.cpu().reshape(got.shape[0], -1), want.cpu().reshape(want.shape[0], -1)
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}")
    bad = (got != want).nonzero()
    if len(bad):
        rows = sorted(set(bad[:, 0].tolist()))
        first = [(r, c, int(got[r, c]), int(want[r, c])) for r, c in bad[:5].tolist()]
        raise AssertionError(f"{what}: {len(bad)} of {got.numel()} differ, in rows {rows[:20]}; "
                             f"first (row, col, got, want): {first}")


# --- reported figures -------------------------------------------------------------------------

def report(record):
    """A measured figure (docs/numerics.md), not a pass/fail criterion: printed as JSON, and
    appended to the file $H3KERNELS_TEST_LOG names, if set."""
    import json
    import os

    line = json.dumps(record)
    print(line)
    path = os.environ.get("H3KERNELS_TEST_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


ULP_BUCKETS = ((0, 0), (1, 1), (2, 2), (3, 4), (5, 16), (17, 256), (257, None))


def ulp_histogram(ulps, into=None):
    """Counts of bf16_ulps distances in ULP_BUCKETS, as {"0": n, ..., "3-4": n, ">256": n}, added
    to `into` if given."""
    hist = {} if into is None else into
    for lo, hi in ULP_BUCKETS:
        name = str(lo) if hi == lo else (f">{lo - 1}" if hi is None else f"{lo}-{hi}")
        sel = ulps >= lo if hi is None else (ulps >= lo) & (ulps <= hi)
        hist[name] = hist.get(name, 0) + int(sel.sum())
    return hist


# --- MLP: y and out against the reference, element by element ----------------------------------

def accumulation_bound(k):
    """Relative bound (of sum|products|) on how far an FP32 tensor-core sum of k exact e4m3
    products, in the kernel's order, can be from the exact sum: k/16 accumulation steps of k16,
    each off by at most about 2^-23 of the running magnitude, doubled for the products'
    alignment inside the unit."""
    return 2 * (k // 16) * 2.0 ** -23


ACC_BOUND = accumulation_bound(5376)  # FC1: 672 * 2^-23
ROW_CHUNK = 8192  # rows per float64 reference GEMM


WITHIN_1_ULP = 0.999  # the contract: at least this share of y and out elements within 1 bf16 ulp


def check_mlp_y(a_q, a_scale, w1_q, w1_scale, y, tag, within_1_ulp=WITHIN_1_ULP):
    """y against the reference computed from the kernel's own a_q (AssertionError naming `tag`).

    Every element within its propagated bound: the accumulation bound b in ulps of h; h itself then
    differs by at most b + 1 ulps after rounding, SiLU scales a relative change of h_gate by its
    slope, and three bf16 roundings follow, so y may be slope * (b_gate + 1) + b_up + 3 ulps off
    (at least 3: chunks within 2 ulps skip the bound). And at least `within_1_ulp` of the elements
    within 1 ulp. The ulp histogram is reported, not asserted. Returns the reported stats."""
    import torch

    from h3kernels import reference as R
    from h3kernels.constants import FFN, fc1_row_order_numpy

    order = torch.from_numpy(fc1_row_order_numpy()).to(y.device)
    w_abs = w1_q.to(torch.float64).abs()
    n = worse1 = worse2 = unexplained = 0
    max_ulps = max_well = 0
    hist = {}
    for r0 in range(0, y.shape[0], ROW_CHUNK):
        aq, sa = a_q[r0:r0 + ROW_CHUNK], a_scale[r0:r0 + ROW_CHUNK]
        want = R.fc1_swiglu(aq, sa, w1_q, w1_scale)
        ulps = bf16_ulps(y[r0:r0 + ROW_CHUNK], want)
        ulp_histogram(ulps, hist)
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
        bad = (ulps > 2) & ~(ulps <= allowed)  # NaN allowed (an all-zero sum) only where y is exact
        worse2 += int((ulps > 2).sum())
        unexplained += int(bad.sum())
        if bad.any():
            i = bad.nonzero()[0].tolist()
            raise AssertionError(f"{tag}: y[{r0 + i[0]}, {i[1]}] is {int(ulps[i[0], i[1]])} ulps off with "
                                 f"h_gate {float(g[i[0], i[1]])}, bounds {float(bg[i[0], i[1]])}, "
                                 f"{float(bu[i[0], i[1]])}: not an accumulation-order effect "
                                 f"({unexplained} such elements in rows {r0}..{r0 + len(ulps) - 1})")
    stats = dict(check="y", tag=tag, elements=n, over_1_ulp=worse1, over_2_ulps=worse2, max_ulps=max_ulps,
                 max_ulps_well_conditioned=max_well, ulp_histogram=hist)
    report(stats)
    assert n - worse1 >= within_1_ulp * n, \
        f"{tag}: y: {worse1} of {n} elements over 1 ulp (at most {1 - within_1_ulp:.3%} allowed)"
    return stats


def fc2_out_bound(acc, mag, y_scale, w2_scale, o, gate_rows, res_plus_t):
    """The largest |out - reference out| (float64, per element) that an FP32 sum of the FC2
    products in any tensor-core order allows, carried through the epilogue's roundings. acc: the
    exact sums (float64 [rows, 5376]); mag: sum|products|; o: the reference's o; gate_rows: the
    gate row of each output row; res_plus_t: residual + the reference's bf16(gate * o).

    |RN(a) - RN(b)| <= |a - b| + 2^-p (|a| + |b|) + (subnormal half-steps), for FP32 (p = 24) and
    bf16 (p = 8) alike; each step below is that, from the acc difference to out."""
    import torch

    from h3kernels.constants import FFN

    f64 = torch.float64
    u32, u8 = 2.0 ** -23, 2.0 ** -7  # twice the unit roundoff: for |a| + |b| <= 2|b| + |a - b|
    a = acc.abs()
    c = (y_scale.to(f64)[:, None] * w2_scale.to(f64)[None, :]).abs()
    e_acc = accumulation_bound(FFN) * mag + 2.0 ** -24 * a  # the kernel's order; the reference's FP32 rounding
    d_pre = (e_acc + u32 * 2 * (a + e_acc)) * c + 2.0 ** -147  # (acc * s_y) * s_w: two FP32 roundings each
    d_o = d_pre + 1.01 * u8 * (a * c + d_pre) + 2.0 ** -133  # bf16(o)
    g = gate_rows.to(f64).abs()
    d_t = g * d_o + 1.01 * u8 * g * (o.to(f64).abs() + d_o) + 2.0 ** -132  # bf16(gate * o), product exact
    v = res_plus_t.abs()
    d_sum = d_t + u32 * (v + d_t) + 2.0 ** -149  # residual + t in FP32
    return d_sum + 1.01 * u8 * (v + d_sum) + 2.0 ** -133  # bf16(out)


# The MLP's wgmma family (fp8_mma_form 3): its sums are within ACC_BOUND (measured 2.0e-5 at
# most, docs/spec.md) but not near FP32 rounding, so y is held to a bound in absolute terms (an
# ulp distance across zero spans the exponent range), and the share of out within 1 ulp to this
# floor instead of the contract's 0.999 (measured 0.9926 at M = 16384, also docs/spec.md; small samples vary).
WGMMA_OUT_WITHIN_1_ULP = 0.98
HALF_ULP = 2.0 ** -8  # bf16 rounding, relative
SILU_LIPSCHITZ = 1.1  # max |silu'| is 1.0998
Y_CHUNK = 2048  # rows per float64 pass of check_mlp_y_wgmma (several [rows, 28672] float64 arrays)


def y_error_bounds(acc_bounds, a_q, a_scale, w1_q, w1_scale, w1_abs=None):
    """(s u, [bound per acc_bound], sums): per element of y's logical columns, s u from exact sums
    (s = silu(h_gate), u = h_up) and, for each acc_bound, a bound on |y - s u| when the sums are
    off by at most acc_bound * sum |a_k w_k| and each of y's four bf16 roundings by half an ulp,
    in absolute terms; sums: the exact FC1 sums themselves (float64, prepacked columns). w1_q may
    come as float64 already, and w1_abs as its magnitudes (a caller's chunks then share both)."""
    import torch

    from h3kernels import reference as R
    from h3kernels.constants import FFN

    order = R.minimax_h3_fc1_row_order(a_q.device)
    f64 = torch.float64
    scale = a_scale.to(f64)[:, None] * w1_scale.to(f64)[None, :]
    h = torch.empty(a_q.shape[0], w1_q.shape[0], dtype=f64, device=a_q.device)
    mag = torch.empty_like(h)
    w = w1_q.to(f64)
    a = a_q.to(f64)
    sums = a @ w.T
    h[:, order] = sums * scale
    mag[:, order] = (a.abs() @ (w.abs() if w1_abs is None else w1_abs).T) * scale
    g, u = h[:, :FFN], h[:, FFN:]
    s = g * torch.sigmoid(g)
    bounds = []
    for acc_bound in acc_bounds:
        e = acc_bound * mag
        eg = e[:, :FFN] + HALF_ULP * (g.abs() + e[:, :FFN])
        eu = e[:, FFN:] + HALF_ULP * (u.abs() + e[:, FFN:])
        es = SILU_LIPSCHITZ * eg
        es = es + HALF_ULP * (s.abs() + es)
        bounds.append(es * (u.abs() + eu) + s.abs() * eu + HALF_ULP * (s.abs() + es) * (u.abs() + eu))
    return s * u, bounds, sums


def scaled_mm_y(a_q, a_scale, w1_q, w1_scale):
    """y computed from torch._scaled_mm's FP32 sums on the same e4m3 operands (tensor-wise unit
    scales, fast accumulation off: cuBLASLt's FP8 GEMM, which adds on Hopper's tensor cores as
    the wgmma family does) through the contract's epilogue (reference.swiglu_from_sums): the
    peer a family whose tensor cores do not accumulate in full FP32 is held to (docs/spec.md).
    a_q [M, 5376] and w1_q [28672, 5376] e4m3 (w1 in the prepacked row order), CUDA tensors."""
    import torch

    from h3kernels import reference as R

    one = torch.ones((), dtype=torch.float32, device=a_q.device)
    acc = torch._scaled_mm(a_q, w1_q.t(), scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=False)
    return R.swiglu_from_sums(acc, a_scale, w1_scale)


def y_figures(y, want):
    """(share of elements more than 1 bf16 ulp from want, share more than 2 ulps, rel L2): what
    the contract compares between a wgmma family's y and its peer's (scaled_mm_y)."""
    ulps = bf16_ulps(y, want)
    return float((ulps > 1).float().mean()), float((ulps > 2).float().mean()), rel_l2(y, want)


PEER_SLACK = 1.01  # the contract: a wgmma family's y figures at most this times torch._scaled_mm's


def check_mlp_y_wgmma(a_q, a_scale, w1_q, w1_scale, y, tag):
    """y of the wgmma family: every element within y_error_bounds' bound for ACC_BOUND of the
    exact s u (and the reference within its bound for 0, which checks the bound itself). Returns
    the share of elements more than 1 ulp from the reference (reported, not bounded: about 3%)."""
    import torch

    from h3kernels import reference as R

    over = n = 0
    w64 = w1_q.to(torch.float64)  # once for every chunk, as are its magnitudes
    w64_abs = w64.abs()
    for r0 in range(0, y.shape[0], Y_CHUNK):
        sl = slice(r0, r0 + Y_CHUNK)
        exact, (bound, bound_ref), sums = y_error_bounds((ACC_BOUND, 0.0), a_q[sl], a_scale[sl], w64, w1_scale,
                                                         w64_abs)
        err = (y[sl].to(torch.float64) - exact).abs()
        bad = ~(err <= bound)
        assert not bad.any(), f"{tag}: y outside the wgmma accumulation bound (row, column, error, bound): " + str(
            [(r0 + i, j, float(err[i, j]), float(bound[i, j])) for i, j in bad.nonzero()[:5].tolist()])
        want = R.swiglu_from_sums(sums.to(torch.float32), a_scale[sl], w1_scale)  # R.fc1_swiglu, the sums reused
        assert not ((want.to(torch.float64) - exact).abs() > bound_ref).any(), f"{tag}: the reference's y outside its bound"
        over += int((bf16_ulps(y[sl], want) > 1).sum())
        n += want.numel()
    stats = dict(check="y of the wgmma family against its accumulation bound", tag=tag, elements=n, over_1_ulp=over)
    report(stats)  # over_1_ulp a count beside elements, as check_mlp_y reports it
    return over / max(n, 1)


def check_mlp_out(y_q, y_scale, w2_q, w2_scale, gate, adaln_index, residual, out, tag, within_1_ulp=WITHIN_1_ULP):
    """out against the reference computed from the kernel's own y_q (AssertionError naming `tag`):
    index-guarded rows equal residual bitwise; every other element within fc2_out_bound (at least
    1 ulp: chunks within 1 ulp skip it); at least `within_1_ulp` of them within 1 ulp. The ulp
    histogram is reported, not asserted. Returns the reported stats."""
    import torch

    from h3kernels import reference as R

    f64 = torch.float64
    valid_idx, valid = R.index_guard(adaln_index, gate.shape[0])
    n = worse1 = 0
    max_ulps = 0
    hist = {}
    w_abs = w2_q.to(f64).abs()
    for r0 in range(0, out.shape[0], ROW_CHUNK):
        sl = slice(r0, r0 + ROW_CHUNK)
        acc = y_q[sl].to(f64) @ w2_q.to(f64).T  # exact; R.exact_dot rounds it to FP32
        o = R.bf16((acc.float() * y_scale[sl, None]) * w2_scale[None, :])
        gate_rows = gate[valid_idx[sl]]
        t = R.bf16(gate_rows.float() * o.float())
        want = R.bf16(residual[sl].float() + t.float())
        want = torch.where(valid[sl, None], want, residual[sl])
        got = out[sl]
        guarded = ~valid[sl]
        if guarded.any():
            assert_same_bits(got[guarded].view(torch.int16), residual[sl][guarded].view(torch.int16),
                             f"{tag}: out on index-guarded rows (must be residual)")
        ulps = bf16_ulps(got, want)
        ulp_histogram(ulps, hist)
        n += ulps.numel()
        worse1 += int((ulps > 1).sum())
        max_ulps = max(max_ulps, int(ulps.max()))
        if int(ulps.max()) <= 1:
            continue
        bound = fc2_out_bound(acc, y_q[sl].to(f64).abs() @ w_abs.T, y_scale[sl], w2_scale, o, gate_rows,
                              residual[sl].to(f64) + t.to(f64))
        diff = (got.to(f64) - want.to(f64)).abs()
        bad = valid[sl, None] & ~(diff <= bound)
        if bad.any():
            i = bad.nonzero()[0].tolist()
            raise AssertionError(f"{tag}: out[{r0 + i[0]}, {i[1]}] = {float(got[i[0], i[1]])}, reference "
                                 f"{float(want[i[0], i[1]])}: {float(diff[i[0], i[1]])} off, more than the "
                                 f"bound {float(bound[i[0], i[1]])} of an FP32 sum in any order "
                                 f"({int(bad.sum())} such elements in rows {r0}..{r0 + len(ulps) - 1})")
    stats = dict(check="out", tag=tag, elements=n, over_1_ulp=worse1, max_ulps=max_ulps, ulp_histogram=hist)
    report(stats)
    assert n - worse1 >= within_1_ulp * n, \
        f"{tag}: out: {worse1} of {n} elements over 1 ulp (at most {1 - within_1_ulp:.3%} allowed)"
    return stats


def check_mlp_stages(inputs, weights, out, workspaces, tag, report_exact=True, form=-1):
    """Every stage of one minimax_h3_mlp_fp8 call read back through its workspaces (poisoned before
    the call): a_q and a_scale bitwise, y by check_mlp_y, y_q and y_scale bitwise from the kernel's
    own y, out by check_mlp_out. inputs: make_mlp_inputs' dict as it was before the call (out may
    alias x or residual); weights: make_fc_weights' dict. report_exact: also report, and bound
    loosely (cos > 0.99, rel L2 < 0.1), out - residual against the unquantized bf16 weights.
    form: the call's fp8_mma_form; where it ran the wgmma family (3), y by check_mlp_y_wgmma and
    out with WGMMA_OUT_WITHIN_1_ULP."""
    import torch

    from h3kernels import reference as R
    from h3kernels._runtime import targets

    ws = workspaces
    a = R.mlp_row_stage(inputs["x"], inputs["x_norm_weight"], inputs["adaln_scale"], inputs["adaln_shift"],
                        inputs["adaln_index"])
    a_q, a_s = R.quantize_rows(a)
    assert_same_bits(ws["workspace_a_q"].view(torch.uint8), a_q.view(torch.uint8), f"{tag}: a_q")
    assert_same_bits(ws["workspace_a_scale"].view(torch.int32)[:, None], a_s.view(torch.int32)[:, None],
                     f"{tag}: a_scale")
    y = ws["workspace_y"]
    assert not torch.isnan(y.float()).any(), f"{tag}: y has NaN elements (unwritten?)"
    wgmma = targets.form_family(targets.operator_form(y.device.index, form)) == targets.WGMMA  # the family that ran
    (check_mlp_y_wgmma if wgmma else check_mlp_y)(ws["workspace_a_q"], ws["workspace_a_scale"], weights["q1"],
                                                 weights["s1"], y, tag)
    for r0 in range(0, y.shape[0], ROW_CHUNK):
        yq, ys = R.quantize_rows(y[r0:r0 + ROW_CHUNK])
        assert_same_bits(ws["workspace_y_q"][r0:r0 + ROW_CHUNK].view(torch.uint8), yq.view(torch.uint8),
                         f"{tag}: y_q rows from {r0}")
        assert_same_bits(ws["workspace_y_scale"][r0:r0 + ROW_CHUNK].view(torch.int32)[:, None],
                         ys.view(torch.int32)[:, None], f"{tag}: y_scale rows from {r0}")
    check_mlp_out(ws["workspace_y_q"], ws["workspace_y_scale"], weights["q2"], weights["s2"], inputs["gate"],
                  inputs["adaln_index"], inputs["residual"], out, tag,
                  WGMMA_OUT_WITHIN_1_ULP if wgmma else WITHIN_1_ULP)
    if report_exact:
        n = min(out.shape[0], 2048)
        sub = {k: (v[:n] if k in ("x", "adaln_index") else v) for k, v in inputs.items()}
        want = R.mlp_exact_bf16(sub["x"], sub["x_norm_weight"], sub["adaln_scale"], sub["adaln_shift"],
                                sub["adaln_index"], sub["gate"], weights["w1"], weights["w2"])
        got = out[:n].float() - inputs["residual"][:n].float()
        c, rel = cos(got, want), rel_l2(got, want)
        report(dict(check="out-residual vs unquantized bf16 weights (FP32 math)", tag=tag, rows=n, cos=c,
                    rel_l2=rel))
        assert c > 0.99 and rel < 0.1, f"{tag}: out - residual vs unquantized weights: cos {c}, rel L2 {rel}"


# --- attention ------------------------------------------------------------------------------------

def exact_attention(q, k, v, cu_host, chunk=2048, rows=None):
    """h3kernels.reference.attention_exact (float64, unquantized) with the queries in chunks: a
    16384-key segment of 8 heads would otherwise need 17 GB of float64 scores at once. rows (a
    sorted index tensor of query rows): those rows alone, [len(rows), heads, 128], so that a long
    segment's check never forms every row's scores."""
    import math

    import torch

    from h3kernels.constants import HEAD_DIM

    idx = torch.arange(q.shape[0], device=q.device) if rows is None else rows.to(q.device)
    out = torch.zeros((idx.numel(), *q.shape[1:]), dtype=torch.float64, device=q.device)
    for a, b in zip(cu_host, cu_host[1:]):
        pos = torch.nonzero((idx >= a) & (idx < b)).flatten()  # result rows of this segment
        if pos.numel() == 0:
            continue
        ks, vs = (x[a:b].double().transpose(0, 1) for x in (k, v))
        for c in range(0, pos.numel(), chunk):
            p_rows = pos[c:c + chunk]
            qs = q[idx[p_rows]].double().transpose(0, 1)
            p = torch.softmax((qs @ ks.transpose(1, 2)) / math.sqrt(HEAD_DIM), dim=-1)
            out[p_rows] = (p @ vs).transpose(0, 1)
    return out


def attention_misses(got, q, k, v, cu_host):
    """How attention output `got` (of q, k, v, the default softmax_scale) misses the settled bounds,
    as (what, value, bound) entries ([] when it meets them all): every element finite (written),
    attention_reference_misses against h3kernels.reference, and rel L2 against exact attention at
    most 1.1x the reference's own."""
    import torch

    from h3kernels import reference as R

    bad = int((~torch.isfinite(got.float())).sum())
    misses = [("non-finite (unwritten?) elements", bad, 0)] if bad else []
    want = R.attention_fp8(q, k, v, cu_host)
    misses += attention_reference_misses(got, want, cu_host)
    exact = exact_attention(q, k, v, cu_host)
    err, ref = rel_l2(got, exact), rel_l2(want, exact)
    if not err <= 1.1 * ref:
        misses.append(("rel L2 vs exact attention", err, 1.1 * ref))
    return misses


def reference_rows(q, k, v, cu_host, idx, softmax_scale=None, chunk=256):
    """h3kernels.reference.minimax_h3_varlen_attention_fp8 for the query rows idx only (bf16
    [len(idx), heads, 128]), on the tensors' device. The quantization is the reference's own
    (quantize_attention_inputs over every token: K means and V scales need whole segments); the
    per-row formula below is the reference's, line for line, restricted to those rows, so that a
    long segment's whole-set reference (minutes of float32 scores at 1 x 65536) is never formed.
    chunk: query rows per step ([heads, chunk, keys] float32 scores)."""
    import math

    import torch

    from h3kernels import reference as R
    from h3kernels.constants import HEAD_DIM

    scale = 1.0 / math.sqrt(HEAD_DIM) if softmax_scale is None else float(softmax_scale)
    q8, s_q, k8, s_k, v8, s_v = R.quantize_attention_inputs(q, k, v, cu_host)
    idx = idx.to(q.device)
    res = torch.empty((idx.numel(), q.shape[1], HEAD_DIM), dtype=torch.bfloat16, device=q.device)
    for a, b in zip(cu_host[:-1], cu_host[1:]):
        pos = torch.nonzero((idx >= a) & (idx < b)).flatten()  # result rows of this segment
        if b == a or pos.numel() == 0:
            continue
        kf = k8[a:b].to(torch.float32).transpose(0, 1)  # [heads, L, 128]
        vf = v8[a:b].to(torch.float32).transpose(0, 1)
        sk = s_k[a:b].T  # [heads, L]
        sv = s_v[a].to(torch.float32)  # [heads, 128]
        for c in range(0, pos.numel(), chunk):
            p_rows = pos[c:c + chunk]
            rows = idx[p_rows]
            # gathered as raw bytes: index kernels need not know float8 on every torch build
            qf = q8.view(torch.uint8)[rows].view(q8.dtype).to(torch.float32).transpose(0, 1)  # [heads, n, 128]
            s = ((qf @ kf.transpose(1, 2)) * s_q[rows].T[:, :, None]) * sk[:, None, :] * scale
            p = torch.exp(s - s.amax(dim=-1, keepdim=True))
            del s
            l = p.sum(dim=-1)
            o = R.e4m3(256.0 * p).to(torch.float32) @ vf
            del p
            res[p_rows] = R.bf16(o * sv[:, None, :] / (256.0 * l[:, :, None])).transpose(0, 1)
    return res
