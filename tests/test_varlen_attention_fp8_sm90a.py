"""The attention's wgmma family (fp8_mma_form 3, cuda_src/varlen_attention_fp8_sm90a.cu): its build
(no GPU), the fragment bookkeeping of P between its two wgmmas (a numpy model of both layouts),
the form selection and launch parameters, and (GPU, compute capability 9.0) its results.

Its tensor cores add with fewer bits than FP32 (S: 128 products per score, except in a segment
of one 64-key block, whose S comes from mma.sync; P V: chains of up to 1024 keys), so its output
is not the mma.sync forms' bits; it is held to the attention's settled bounds
(h3kernels.testing.checks.attention_misses: rel L2 from the reference, and against exact attention
at most 1.1x the reference's own error)."""
import types

import numpy as np
import pytest
import torch

import h3kernels
from h3kernels import reference as R
from h3kernels._launch import varlen_attention_fp8 as L
from h3kernels._launch import varlen_attention_fp8_sm90a as hopper
from h3kernels._launch.numba.varlen_attention_fp8_quant import v_key_at
from h3kernels._runtime import compiler, targets
from h3kernels.testing.checks import attention_misses, attention_reference_misses, rel_l2, same_bits
from h3kernels.testing.inputs import make_attention_inputs
from h3kernels.testing.poison import poisoned_like
from h3kernels.testing.ptx_checks import wgmma_register_hazards


def _on_sm90():
    try:
        return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    except Exception:
        return False


needs_sm90 = pytest.mark.skipif(not _on_sm90(), reason="needs a compute capability 9.0 GPU (sm_90a)")


SHIPPED = hopper.shipped_builds(hopper.ARCH)


@pytest.mark.parametrize("build", SHIPPED, ids=lambda b: f"lse{int(b.lse)}")
def test_varlen_sm90a_touches_no_wgmma_register_in_flight(build):
    ptx = compiler.compile_ptx(hopper.SOURCE, hopper.ARCH, build.defines())
    assert ptx.count("wgmma.mma_async") >= 6
    assert wgmma_register_hazards(ptx) == []


def test_varlen_sm90a_q_tile_takes_the_q_pass_bound_for_its_fast_quotient():
    """The kernel quantizes Q with the Q pass's two-FMA quotient where the row's scale is at least
    MIN_FAST_SCALE (fp8_bits, where the quotient was checked for every bf16 value) and divides
    below it: the C constant is that float32, so q8 keeps the Q pass's bits at the boundary."""
    from h3kernels._launch.numba.fp8_bits import MIN_FAST_SCALE

    build = hopper.AttentionBuild()
    same = f'static_assert(kMinFastScale == (float){MIN_FAST_SCALE!r}, "kMinFastScale is not MIN_FAST_SCALE");\n'
    compiler.compile_cubin(hopper.SOURCE, hopper.ARCH, build.defines(), use_cache=False, appended=same)
    with pytest.raises(compiler.CompileError, match="kMinFastScale is not"):
        compiler.compile_cubin(hopper.SOURCE, hopper.ARCH, build.defines(), use_cache=False,
                               appended=same.replace(repr(MIN_FAST_SCALE), repr(2 * MIN_FAST_SCALE)))


def test_varlen_sm90a_parameter_struct_is_mirrored_field_by_field():
    """The launch layer's PARAMS lays AttentionParams out as the compiler does (the static_asserts
    of every offset and of the size compile), the maps first and 64-byte aligned, then the
    mma.sync kernel's parameters in its order less q8, s_q, k8, v8t and v_pitch."""
    build = hopper.AttentionBuild()
    compiler.compile_cubin(hopper.SOURCE, hopper.ARCH, build.defines(), use_cache=False,
                           appended=hopper.PARAMS.c_layout_checks())
    wrong = hopper.PARAMS.c_layout_checks().replace("== 392", "== 396")
    with pytest.raises(compiler.CompileError, match="n_tiles"):
        compiler.compile_cubin(hopper.SOURCE, hopper.ARCH, build.defines(), use_cache=False, appended=wrong)
    offsets = hopper.PARAMS.offsets
    assert [offsets[m] for m in ("map_q", "map_k", "map_v", "tiles")] == [0, 128, 256, 384]
    assert len(hopper.PARAMS.fields) == 16 and hopper.PARAMS.size == 512
    formats = tuple(fmt for _, fmt in hopper.PARAMS.fields)
    assert formats[3:] == L.PARAMS[:2] + (L.PARAMS[5],) + L.PARAMS[7:10] + L.PARAMS[11:]
    assert all(b.kernel_params(k) is hopper.PARAMS for b in SHIPPED for k in b.kernels)


def test_varlen_sm90a_shipped_builds_are_values():
    """Two builds ship on sm_90a, hashable values that differ only in the exact-l constant; none
    elsewhere."""
    plain, exact = SHIPPED
    assert (plain.lse, exact.lse) == (False, True) and hopper.AttentionBuild() == plain
    assert len({plain, exact, hopper.AttentionBuild(lse=True)}) == 2
    assert {k: v for k, v in exact.defines().items() if plain.defines()[k] != v} == {"EXACT_L": 1}
    assert plain.kernels == (hopper.KERNEL,) and plain.dynamic_smem(hopper.KERNEL) == hopper.SMEM_BYTES
    assert hopper.shipped_builds("sm_90") == () and hopper.ARCHS == ("sm_90a",)


def test_ptx_check_finds_a_wgmma_a_register_written_before_its_wait():
    # the shape of the OVERLAP build's fault: the next P packed into the registers a P V still
    # reads, on the path where the wait comes later
    body = """
\twgmma.fence.sync.aligned;
\twgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%f1, %f2}, {%r1, %r2, %r3, %r4}, %rd1, p, 1, 1;
\twgmma.commit_group.sync.aligned;
\t@%p1 bra $L__BB0_2;
\twgmma.wait_group.sync.aligned 0;
$L__BB0_2:
\tmov.b32 %r1, {%rs1, %rs2};
\twgmma.wait_group.sync.aligned 0;
\tadd.f32 %f3, %f1, %f2;
\tret;
"""
    bad = wgmma_register_hazards(body)
    assert [(b[2], b[3].split()[0]) for b in bad] == [(("%r1",), "mov.b32")]
    assert wgmma_register_hazards(body.replace("\t@%p1 bra $L__BB0_2;\n", "")) == []


def test_varlen_sm90a_build_without_its_constants_stops():
    with pytest.raises(compiler.CompileError, match="-D constants"):
        compiler.compile_cubin(hopper.SOURCE, "sm_90a", {}, use_cache=False)


def test_varlen_sm90a_constants_fit_the_kernel_and_sm90():
    assert hopper.BKV == L.BKV  # the same key blocks as the mma.sync kernel: the same running max
    assert hopper.KSB == L.KSB == 128 and hopper.HD == 128 and hopper.BQ == 128 == L.BQ
    assert hopper.THREADS == 384 and hopper.SMEM_BYTES <= 227 * 1024


def test_varlen_sm90a_maps_cover_q_and_the_workspace(monkeypatch):
    monkeypatch.setattr(hopper, "tensor_map", lambda *a: a)
    assert hopper.maps(1, 10, 2, 12, 3, 4, 256) == ((1, 10, 4 * 256, 128, 256), (2, 12, 4 * 128, 128),
                                                    (3, 4 * 128, 256, 128))


def test_varlen_sm90a_launch_takes_a_persistent_grid_of_the_build(monkeypatch):
    """launch(): the build's kernel through the one loader, at most one CTA per SM, 384 threads,
    the struct's values as given; its LaunchRecord back."""
    loaded, launched = [], []

    class Kernel:
        def launch(self, stream, grid, threads, values):
            launched.append((stream, grid, threads, values))
            return "record"

    monkeypatch.setattr(compiler, "kernel", lambda *a: loaded.append(a) or Kernel())
    monkeypatch.setattr(hopper, "sm_count", lambda device_id: 132)
    call = types.SimpleNamespace(device_id=1, stream_ptr=7)
    exact = hopper.AttentionBuild(lse=True)
    assert hopper.launch(call, 500, exact, "values") == "record"
    hopper.launch(call, 5, hopper.AttentionBuild(), "values")
    assert loaded == [(hopper.SOURCE, hopper.KERNEL, "sm_90a", exact, 1),
                      (hopper.SOURCE, hopper.KERNEL, "sm_90a", hopper.AttentionBuild(), 1)]
    assert launched == [(7, (132, 1), 384, "values"), (7, (5, 1), 384, "values")]


# --- the P fragment between the two wgmmas ---------------------------------------------------------

def accumulator_at(thread, i):
    """(row, column) of register i of warpgroup thread `thread` in a wgmma f32 accumulator."""
    w, lane = thread // 32, thread % 32
    return 16 * w + lane // 4 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2


def a_register_at(thread, r, b):
    """(row, k column) of byte b of A register r of thread `thread` (wgmma m64nNk32, 8-bit A from
    registers: per warp the m16n8k32 mma.sync A fragment)."""
    w, lane = thread // 32, thread % 32
    return 16 * w + lane // 4 + 8 * (r % 2), 4 * (lane % 4) + b + 16 * (r // 2)


def test_varlen_sm90a_p_registers_times_permuted_v_is_p_times_v():
    """The kernel packs each thread's S accumulator of a 64-key block (wgmma m64n64) into the A
    registers of two k32 steps without moving data between threads (indices 16kk + {0,1,4,5},
    {2,3,6,7}, {8,9,12,13}, {10,11,14,15}), and reads B at byte 64 hb + 32 kk of the V^T rows of a
    128-key stage. With v8t's permuted keys (v_key_at) that is P . V for both 64-key blocks."""
    rng = np.random.default_rng(1)
    p = rng.integers(-8, 9, (2, 64, 64)).astype(np.float64)  # two 64-key blocks of 64 rows
    v = rng.integers(-8, 9, (128, 128)).astype(np.float64)  # [keys of the stage, channels]
    stored = v[v_key_at(np.arange(128, dtype=np.uint64)).astype(np.int64)]  # v8t's column order (keys)
    packing = [(0, 1, 4, 5), (2, 3, 6, 7), (8, 9, 12, 13), (10, 11, 14, 15)]
    for hb in range(2):
        got = np.zeros((64, 128))
        for kk in range(2):
            a = np.full((64, 32), np.nan)
            for thread in range(128):
                s = [p[hb][accumulator_at(thread, i)] for i in range(32)]
                for r in range(4):
                    for b in range(4):
                        a[a_register_at(thread, r, b)] = s[16 * kk + packing[r][b]]
            assert not np.isnan(a).any()
            b_op = stored[64 * hb + 32 * kk: 64 * hb + 32 * kk + 32]  # [k, channels]
            got += a @ b_op
        want = p[hb] @ v[64 * hb: 64 * hb + 64]
        assert np.array_equal(got, want), hb


# --- form selection ------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,requested,want", [("sm_90", -1, 3), ("sm_90", 3, 3), ("sm_90", 0, 0),
                                                 ("sm_120a", 0, 0), ("sm_89", -1, 0)])
def test_varlen_form_selection(monkeypatch, arch, requested, want):
    monkeypatch.setattr(targets, "device_arch", lambda device_id: arch)
    monkeypatch.setattr(targets, "board_form", lambda device_id: 0)
    assert targets.operator_form(0, requested) == want


@pytest.mark.parametrize("arch", ["sm_120a", "sm_89"])
def test_varlen_form_3_elsewhere_is_a_value_error(monkeypatch, arch):
    monkeypatch.setattr(targets, "device_arch", lambda device_id: arch)
    with pytest.raises(ValueError, match="fp8_mma_form.*form 3 needs sm_90a"):
        targets.operator_form(0, 3)


def test_varlen_calls_take_the_exact_l_build_when_they_want_the_lse(monkeypatch):
    monkeypatch.setattr(targets, "device_arch", lambda device_id: "sm_90")
    assert L.attention_build(0, 3, False) == hopper.AttentionBuild(lse=False)
    assert L.attention_build(0, 3, True) == hopper.AttentionBuild(lse=True)
    assert L.attention_build(0, 0, True) == L.AttentionBuild("sm_90", 0)


# --- results (compute capability 9.0) ------------------------------------------------------------

def run3(q, k, v, cu_dev, cu, **kw):
    """Form 3 into a NaN-poisoned out."""
    out = poisoned_like(q)
    res = h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, out, cu_seqlens_host=cu, fp8_mma_form=3, **kw)
    assert (res[0] if isinstance(res, tuple) else res) is out
    return res


SETS = [
    ([0, 1, 127, 128, 129, 1000], 1),
    ([0, 1, 127, 128, 129, 1000, 4096], 8),
    ([0, 1, 127, 128, 129, 4096], 56),
    ([0, 300, 0, 77, 1, 0], 8),  # empty segments at the start, in the middle and at the end
    ([200], 1),
    ([16384], 8),
]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("seqlens,heads", SETS, ids=[f"varlen-{len(s)}seg-{h}h" for s, h in SETS])
def test_varlen_sm90a_matches_reference_and_exact(seqlens, heads, seed):
    check3(seqlens, heads, seed)


def check3(seqlens, heads, seed, k_offset=0.0):
    """Form 3 on random inputs of that seed within the attention's bounds (attention_misses)."""
    q, k, v, cu_dev, cu = make_attention_inputs(seqlens, heads, device="cuda", seed=seed, k_offset=k_offset)
    got = run3(q, k, v, cu_dev, cu)
    torch.cuda.synchronize()
    misses = attention_misses(got, q, k, v, cu)
    assert not misses, misses


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("lens,heads,seed", [([64], 1, 0), ([15], 1, 19), ([42], 1, 249), ([15], 1, 267),
                                             ([23, 4, 27], 1, 341), ([48, 37], 1, 373), ([31, 51], 1, 509)])
def test_varlen_sm90a_one_block_segment_keeps_the_reference_p_grid_bound(lens, heads, seed):
    # sets where S summed in the FP8 tensor cores (per 128, 64 or 32 channels) put a one-block
    # segment over the 0.005 bound: [64] x 1 head, seed 0 by the GPU fuzz test, the others by
    # a fuzz of 600 random short sets (bench/hopper_attention.py at e90ddee) (no host copy of cu_seqlens)
    q, k, v, cu_dev, cu = make_attention_inputs(lens, heads, device="cuda", seed=seed)
    out = run3(q, k, v, cu_dev, None)
    torch.cuda.synchronize()
    assert not attention_misses(out, q, k, v, cu)


@pytest.mark.gpu
@needs_sm90
def test_varlen_sm90a_64_random_segments(seed):
    check3(np.random.default_rng(seed).integers(0, 700, 64).tolist(), 8, seed)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("heads", [1, 56])
def test_varlen_sm90a_large_per_channel_key_offset(heads, seed):
    check3([0, 1, 127, 128, 129, 2000], heads, seed, k_offset=40.0)


@pytest.mark.gpu
@needs_sm90
def test_varlen_sm90a_is_near_form_0_and_repeatable(seed):
    """Every head of a mixed set against the mma.sync kernel (which the sets above tie to the
    reference), and two runs bitwise equal."""
    q, k, v, cu_dev, cu = make_attention_inputs([7000, 3000, 0, 6000, 384], 56, device="cuda", seed=seed)
    form0 = h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, cu_seqlens_host=cu, fp8_mma_form=0)
    a, b = run3(q, k, v, cu_dev, cu), run3(q, k, v, cu_dev, cu)
    torch.cuda.synchronize()
    assert torch.isfinite(a.float()).all() and same_bits(a, b)
    assert rel_l2(a, form0) <= 0.01, rel_l2(a, form0)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("seqlens,heads,k_offset", [([0, 1, 127, 128, 129, 4096], 8, 0.0),
                                                   ([300, 0, 77, 1, 2000], 56, 40.0)])
def test_varlen_sm90a_lse(seqlens, heads, k_offset, seed):
    """lse against form 0's (the same formula on a running max and sum that differ by the
    accumulation) and the float64 lse of the unquantized scores; out unchanged by return_lse."""
    q, k, v, cu_dev, cu = make_attention_inputs(seqlens, heads, device="cuda", seed=seed, k_offset=k_offset)
    plain = run3(q, k, v, cu_dev, cu)
    out, lse = run3(q, k, v, cu_dev, cu, return_lse=True)
    _, lse0 = h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, cu_seqlens_host=cu, return_lse=True,
                                                        fp8_mma_form=0)
    torch.cuda.synchronize()
    assert same_bits(out, plain)
    assert lse.shape == (heads, q.shape[0]) and lse.dtype == torch.float32
    assert torch.isfinite(lse).all()
    lse, lse0 = lse.cpu().double(), lse0.cpu().double()
    assert (lse - lse0).abs().max() <= 1e-3 * (1 + lse0.abs().max()), (lse - lse0).abs().max()
    exact = R.lse_exact(q.cpu(), k.cpu(), cu)
    assert (lse - exact).abs().max() <= 0.05 and (lse - exact).abs().mean() <= 0.01


@pytest.mark.gpu
@needs_sm90
def test_varlen_sm90a_lse_with_out_aliasing_q(seed):
    q, k, v, cu_dev, cu = make_attention_inputs([700, 0, 129], 8, device="cuda", seed=seed, k_offset=10.0)
    want = h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, cu_seqlens_host=cu, return_lse=True,
                                                     fp8_mma_form=3)
    q2 = q.clone()
    got = h3kernels.minimax_h3_varlen_attention_fp8(q2, k, v, cu_dev, q2, cu_seqlens_host=cu, return_lse=True,
                                                    fp8_mma_form=3)
    torch.cuda.synchronize()
    assert got[0] is q2 and same_bits(q2, want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
@needs_sm90
def test_varlen_sm90a_huge_scores_stay_finite(seed):
    """Queries scaled by 1e30: S stays finite in FP32 and P is one-hot per row, so each such row
    is one key's dequantized v. The tensor core sums S to about 2^-14 of its largest term, so
    where a row's two best keys lie within 2^-10 of each other either may win, or both (equal P
    on each: their mean); a row with a clear best key must give the reference's row. The kernel
    folds the scaling into the subtraction of the max, whose margin saturates the maximum's P
    there instead of losing it."""
    q, k, v, cu_dev, cu = make_attention_inputs([200, 150], 2, device="cuda", seed=seed)
    q[200:] = (q[200:].float() * 1e30).bfloat16()
    got = run3(q, k, v, cu_dev, cu)
    want = R.attention_fp8(q, k, v, cu)
    torch.cuda.synchronize()
    assert torch.isfinite(got.float()).all()
    assert not attention_reference_misses(got[:200], want[:200], [0, 200])  # the unscaled segment
    q8, s_q, k8, s_k, v8, s_v = R.quantize_attention_inputs(q, k, v, cu)
    sc = (q8[200:].double().transpose(0, 1) @ k8[200:].double().permute(1, 2, 0))  # [heads, rows, keys]
    sc = sc * s_q[200:].double().T[:, :, None] * s_k[200:].double().T[:, None, :]
    top, idx = sc.topk(2, dim=-1)
    tie = (top[..., 0] - top[..., 1]) < 2.0 ** -10 * top[..., 0].abs()  # [heads, rows]
    vd = (v8[200:].double() * s_v[200:].double()).transpose(0, 1)  # [heads, keys, 128]
    g, w = got[200:].double().transpose(0, 1), want[200:].double().transpose(0, 1)
    clear = ~tie
    assert rel_l2(g[clear], w[clear]) <= 0.005  # one-hot P lies on the reference's grid
    for h, r in tie.nonzero().tolist():
        a, b = vd[h, idx[h, r, 0]], vd[h, idx[h, r, 1]]
        options = torch.stack([a, b, (a + b) / 2])
        err = (options - g[h, r]).norm(dim=-1) / options.norm(dim=-1)
        assert err.min() <= 0.01, (h, r, err.tolist())


@pytest.mark.gpu
@needs_sm90
def test_varlen_sm90a_softmax_scale_and_zero_scales(seed):
    q, k, v, cu_dev, cu = make_attention_inputs([200, 0, 130], 8, device="cuda", seed=seed)
    q[3] = 0  # s_q = 0 rows
    k[200:330, 1] = 2.5  # a constant segment: k' = 0, s_k = 0
    v[:, 2, 7] = 0  # a zero V channel: s_v = 0
    got = run3(q, k, v, cu_dev, cu, softmax_scale=0.3)
    want = R.attention_fp8(q, k, v, cu, softmax_scale=0.3)
    torch.cuda.synchronize()
    assert torch.isfinite(got.float()).all()
    assert rel_l2(got, want) <= 0.02, rel_l2(got, want)
    assert (got[:, 2, 7] == 0).all()


def test_varlen_sm90a_launch_gets_the_workspace_maps_and_the_kernels_parameters(monkeypatch, stand_in_plan):
    """Form 3 through the launch layer with stand-in scratch: the plan of form 0 and its passes
    less the Q pass, then one launch of the exact-l build when the call wants the lse (else the
    plain one), its struct's maps covering the caller's bf16 q (heads * 256 bytes per token), the
    workspace's k8 (heads * 128) and v8t (v_pitch bytes per channel row), every field named;
    run() returns the launch's record. A q off a 16-byte boundary is copied to the scratch's end
    first, and the map is that copy's."""
    from h3kernels._launch import varlen_attention_fp8_plan as P
    from h3kernels.constants import HEAD_DIM, K_BLOCK

    cu, heads = (0, 300, 300, 429), 2
    tiles, block_offset, blocks, q_bounds = P.plan_arrays(cu, heads)
    base = stand_in_plan.base
    stand_in_plan.set((len(tiles), len(block_offset), len(blocks), len(q_bounds)))


    launched, passes, copies = [], [], []
    monkeypatch.setattr(L, "quant_launches", lambda *a: passes.append(a) or [])
    stand_in_plan.call.copy = lambda dst, src, count: copies.append((dst, src, count))
    monkeypatch.setattr(hopper, "tensor_map", lambda *a: a)
    monkeypatch.setattr(hopper, "launch_values", hopper.launch_values.__wrapped__)  # no cached real maps
    monkeypatch.setattr(hopper, "launch", lambda call, n, build, values: launched.append((n, build, values)) or "rec")
    q = torch.zeros(cu[-1], heads, HEAD_DIM, dtype=torch.bfloat16)
    out, lse = torch.zeros_like(q), torch.zeros(heads, cu[-1])
    assert L.run(stand_in_plan.call, q, q, q, torch.tensor(cu, dtype=torch.int32), cu, heads, 0.125, out, 3, lse) == "rec"
    L.run(stand_in_plan.call, q, q, q, torch.tensor(cu, dtype=torch.int32), cu, heads, 0.125, out, 3)
    (n_tiles, build, v), (_, plain, without_lse) = launched
    assert build == hopper.AttentionBuild(lse=True) and plain == hopper.AttentionBuild(lse=False)
    parts, _ = L.layout(cu[-1], heads, len(cu) - 1, len(blocks), with_q=False)  # no q8, no s_q
    assert parts["q8"][1][0] == parts["s_q"][1][0] == 0
    assert n_tiles == len(tiles) == 10 and v._fields == hopper.PARAMS.names
    assert (v.map_q, v.map_k, v.map_v) == ((q.data_ptr(), cu[-1], heads * 256, 128, 256),
                                           (base + parts["k8"][0], cu[-1], heads * 128, 128),
                                           (base + parts["v8t"][0], heads * 128, len(blocks) * K_BLOCK, 128))
    assert (v.tiles, v.n_tiles, v.q_bounds) == (11, n_tiles, 14)
    assert (v.s_k, v.s_v, v.mu) == tuple(base + parts[n][0] for n in ("s_k", "s_v", "mu"))
    assert (v.out, v.q, v.lse, without_lse.lse) == (out.data_ptr(), q.data_ptr(), lse.data_ptr(), 0)
    assert (v.heads, v.scale_log2, v.tokens, v.softmax_scale) == (heads, 0.125 * L.LOG2E, cu[-1], 0.125)
    assert [a[-1] for a in passes] == [False, False] and not copies  # no Q pass; q read in place
    shifted = torch.zeros(cu[-1] * heads * HEAD_DIM + 4, dtype=torch.bfloat16)[4:].view(cu[-1], heads, HEAD_DIM)
    assert shifted.data_ptr() % 16 == 8
    L.run(stand_in_plan.call, shifted, q, q, torch.tensor(cu, dtype=torch.int32), cu, heads, 0.125, out, 3)
    _, size = L.layout(cu[-1], heads, len(cu) - 1, len(blocks), with_q=False)
    assert copies == [(base + size, shifted.data_ptr(), shifted.numel() * 2)]
    assert launched[-1][2].map_q[0] == base + size and launched[-1][2].q == shifted.data_ptr()


@pytest.mark.gpu
@needs_sm90
def test_varlen_sm90a_q_off_a_16_byte_boundary_gives_the_same_bits(seed):
    """The kernel's TMA reads q from a 16-byte boundary; a q only 8-byte aligned is copied to one
    first, and out is the same bits as from an aligned q."""
    q, k, v, cu_dev, cu = make_attention_inputs([300, 1, 129], 4, device="cuda", seed=seed)
    flat = torch.empty(q.numel() + 4, dtype=q.dtype, device="cuda")
    shifted = flat[4:].view_as(q)
    shifted.copy_(q)
    assert shifted.data_ptr() % 16 == 8
    want, got = run3(q, k, v, cu_dev, cu), run3(shifted, k, v, cu_dev, cu)
    torch.cuda.synchronize()
    assert torch.equal(got, want)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("host,give_out", [(False, True), (True, False), (False, False)])
def test_varlen_sm90a_without_host_seqlens_or_out(host, give_out, seed):
    q, k, v, cu_dev, cu = make_attention_inputs([5, 0, 333, 64], 8, device="cuda", seed=seed)
    out = poisoned_like(q) if give_out else None
    got = h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, out, cu_seqlens_host=cu if host else None,
                                                    fp8_mma_form=3)
    torch.cuda.synchronize()
    assert got is out or not give_out
    misses = attention_misses(got, q, k, v, cu)
    assert not misses, misses
