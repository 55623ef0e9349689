"""The MLP's wgmma family (fp8_mma_form 3, cuda_src/mlp_fp8_sm90a.cu): its build (no GPU), its
parameter structs, the persistent walk and its split, the form selection, and (GPU, compute
capability 9.0) its results.

Its tensor cores sum at most 128 products before an FP32 addition, so y and out are not the
mma.sync forms' bits; they are held to the stage bounds with that error term (docs/numerics.md):
a_q, a_scale, y_q (from the kernel's own y) and y_scale bitwise; y within a per-element bound
propagated from ACC_BOUND (h3kernels.testing.checks.check_mlp_y_wgmma); y's distance from exact
sums no larger than that of torch._scaled_mm without fast accumulation (the contract's rule for
tensor cores that do not accumulate in full FP32); the end-to-end error at most 1.02x form 0's."""
import dataclasses

import pytest

from h3kernels._launch import mlp_fp8
from h3kernels._launch import mlp_fp8_sm90a as hopper
from h3kernels._runtime import compiler, launcher, targets
from h3kernels.cli import compile_check
from h3kernels.constants import FC1_OUT, FFN, HIDDEN
from h3kernels.testing.checks import check_mlp_y_wgmma


def compile_shipped(extra=(), appended=""):
    (build,) = hopper.shipped_builds(hopper.ARCH)
    return compiler.compile_cubin(hopper.SOURCE, hopper.ARCH, build.defines(), extra, use_cache=False,
                                  appended=appended or compile_check._nonce())


def test_the_build_is_a_value():
    build = hopper.MlpBuild()
    assert build == hopper.SHIPPED and hash(build) == hash(hopper.MlpBuild())
    assert hopper.shipped_builds("sm_90a") == (build,) and hopper.shipped_builds("sm_90") == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        build.stages = 3
    d = build.defines()
    assert d["H3_STAGES"] == 4 and d["H3_BK"] == hopper.BK and d["H3_HIDDEN"] == HIDDEN
    for width in hopper.WIDTHS:
        fc1, fc2 = (hopper.gemm_kernel(stem, width) for stem in (hopper.FC1, hopper.FC2))
        assert fc1 in build.kernels and fc2 in build.kernels
        assert build.dynamic_smem(fc1) == build.dynamic_smem(fc2) == 4 * (128 + width) * 128 + 1024
        assert hopper.MlpBuild(stages=3).dynamic_smem(fc2) == 3 * (128 + width) * 128 + 1024
    assert build.dynamic_smem(hopper.QUANT) == 0 and hopper.WIDTHS == (256, 224)
    assert all(isinstance(build.kernel_params(k), launcher.ParamStruct) for k in build.kernels)


def test_build_without_its_constants_stops():
    with pytest.raises(compiler.CompileError, match="-D constants"):
        compiler.compile_cubin(hopper.SOURCE, hopper.ARCH, {}, use_cache=False)


def test_param_structs_mirror_the_kernel_parameters():
    """Every field's offset and every struct's size as the C compiler lays them out; the maps
    keep offsets 0 and 128 and the rest the offsets of the positional parameters they replaced."""
    checks = "".join(hopper.SHIPPED.kernel_params(k).c_layout_checks() for k in hopper.MlpBuild.kernels)
    compile_shipped(appended=checks)
    fc1, fc2 = (hopper.SHIPPED.kernel_params(k) for k in (hopper.FC1, hopper.FC2))
    assert list(fc1.offsets.values()) == [0, 128, 256, 264, 272, 280, 284, 288, 296, 304] and fc1.size == 320
    assert list(fc2.offsets.values()) == [0, 128, 256, 264, 272, 280, 288, 296, 304, 312, 320, 324, 328, 336,
                                          344] and fc2.size == 384


def test_a_wrong_mirror_fails_the_build():
    wrong = launcher.ParamStruct("Fc1Params", (("map_a", "map"), ("map_w1", "map"), ("a_scale", "u64"),
                                               ("y", "u64"), ("w1_scale", "u64")))
    with pytest.raises(compiler.CompileError, match="Fc1Params.y: offset"):
        compile_shipped(appended=wrong.c_layout_checks())


@pytest.mark.parametrize("tiles,slots,slices,want", [
    (21, 132, 112, (0, 6)), (42, 132, 112, (0, 3)), (672, 132, 112, (660, 11)), (3584, 132, 42, (3564, 6)),
    (2688, 132, 112, (2640, 2)), (14336, 132, 42, (14336, 1)), (224, 132, 42, (224, 1)), (264, 132, 42, (264, 1)),
    (1, 132, 42, (0, 10)), (1, 132, 8, (0, 2)), (1, 132, 7, (1, 1))])
def test_work_split_spreads_the_last_wave_over_every_slot(tiles, slots, slices, want):
    whole, parts = hopper.work_split(tiles, slots, slices, 1)
    assert (whole, parts) == want
    assert whole % slots == 0 or parts == 1
    assert (tiles - whole) * parts <= slots and slices // parts >= hopper.MIN_PART_SLICES


def test_every_part_gets_a_step_of_the_k_loop():
    """work_unit (cuda_src/mlp_fp8_sm90a_gemm.cuh) cuts a split tile's K at multiples of
    PART_SLICES: with the plan's parts, no part may come out empty (its consumers would wait
    forever)."""
    step = hopper.PART_SLICES
    assert step * hopper.BK == 256
    for k in (HIDDEN, FFN):
        slices = k // hopper.BK
        for r in range(1, 133):
            whole, parts = hopper.work_split(r, 132, slices)
            steps = slices // step
            ranges = [(step * (p * steps // parts), step * ((p + 1) * steps // parts)) for p in range(parts)]
            assert all(b > a for a, b in ranges) and ranges[-1][1] == slices, (k, r, parts)


@pytest.fixture
def sms(monkeypatch):
    """sms(n): the launch layer sees a device of n SMs."""
    def set_sms(n):
        monkeypatch.setattr(hopper, "sm_count", lambda device_id: n)
    return set_sms


class FakeCall:
    """What walk() and the launches ask of an arrays.Call: its device and stream, and the
    workspace it allocates and zeroes."""
    device_id = 0
    stream_ptr = 7

    def __init__(self):
        self.done = []

    class Array:
        def data_ptr(self):
            return 1 << 24

    def empty(self, shape, dtype):
        self.done.append(("empty", shape, dtype))
        return self.Array()

    def zero(self, address, count):
        self.done.append(("zero", count))


def test_plan_sizes_its_workspace_for_the_larger_gemm(sms):
    sms(132)
    p = hopper.plan(0, 4096)
    assert p.split == ((132, 3564, 6), (132, 660, 11)) and p.width == (256, 256)
    assert p.counter_bytes == 256 and p.workspace_bytes == 256 + 12 * 11 * hopper.partial_bytes(256)  # FC2's 12 x 11
    ctas, width, fields, held = hopper.walk(FakeCall(), 4096, 1, 1 << 20)
    assert (ctas, width, held) == (132, 256, None)
    assert fields == (660, 11, (1 << 20) + 256, 1 << 20)  # split_whole, split_parts, partials, counters
    full = hopper.plan(0, 132 * hopper.BM)  # both GEMMs' waves full: no split, no workspace
    assert full.workspace_bytes == 0 and full.split == ((132, 132 * 112, 1), (132, 132 * 21, 1))
    call = FakeCall()
    assert hopper.walk(call, 132 * hopper.BM, 1, None) == (132, 256, (132 * 21, 1, 0, 0), None)
    assert call.done == []
    p = hopper.plan(0, 2176)  # FC2 in 224-column tiles, split: partials of that width
    assert p.width == (256, 224) and p.split[1] == (132, 396, 11)
    assert p.counter_bytes == 512  # FC1's 56 split tiles x 2 warpgroups
    assert p.workspace_bytes == 512 + 12 * 11 * hopper.partial_bytes(224)  # over FC1's 56 x 2 x partial_bytes(256)


@pytest.mark.parametrize("m,widths", [(1, (224, 256)), (256, (224, 256)), (512, (256, 224)), (1024, (256, 256)),
                                      (2048, (256, 224)), (4096, (256, 256)), (16384, (256, 256))])
def test_tile_width_narrows_only_where_the_last_wave_would_idle(sms, m, widths):
    """At M = 256 on 132 SMs FC1 in 256-column tiles runs two waves, the second 92 tiles wide
    (84 slices for the busiest CTA); in 224-column tiles the second wave is 124 wide (73.5
    slice-equivalents). Where the widths tie within NARROWER_GAIN the widest stays."""
    sms(132)
    assert hopper.plan(0, m).width == widths
    assert hopper.makespan(256, FC1_OUT, HIDDEN // hopper.BK, 132, 256) == 84
    assert hopper.makespan(256, FC1_OUT, HIDDEN // hopper.BK, 132, 224) == 73.5


def test_a_build_may_force_both_gemms_tile_width(sms):
    """A measurement build's tile_width replaces the plan's choice for both GEMMs (the shipped
    build leaves it to tile_width); a width the GEMMs are not built for is refused."""
    sms(132)
    assert hopper.SHIPPED.tile_width == 0 and hopper.plan(0, 256, hopper.SHIPPED.tile_width).width == (224, 256)
    assert hopper.plan(0, 256, 256).width == (256, 256) and hopper.plan(0, 4096, 224).width == (224, 224)
    assert hopper.MlpBuild(tile_width=224).defines() == hopper.SHIPPED.defines()  # not a source constant
    with pytest.raises(ValueError, match="tile width: got 200"):
        hopper.plan(0, 256, 200)
    # a launch without a workspace makes the one of the plan it runs under (at M = 2176 the
    # shipped plan's FC2 is 224 columns wide and both GEMMs split; a plan of 256-column FC2 tiles
    # needs less)
    for width, gemm in ((0, 0), (0, 1), (224, 0), (224, 1)):
        p, call = hopper.plan(0, 2176, width), FakeCall()
        ctas, tile, fields, held = hopper.walk(call, 2176, gemm, None, width)
        assert tile == p.width[gemm] and fields[1] == p.split[gemm][2] > 1 and held is not None
        assert call.done[0][1] == (p.workspace_bytes,) and call.done[1] == ("zero", p.counter_bytes)
        assert fields[2] == FakeCall.Array().data_ptr() + p.counter_bytes
    assert hopper.plan(0, 2176, 256).workspace_bytes < hopper.plan(0, 2176).workspace_bytes


def test_a_grid_is_never_more_than_its_work_units(sms):
    sms(132)
    assert hopper.plan(0, 1).split[1] == (126, 0, 6)  # FC2's 21 tiles, 6 parts each
    assert hopper.plan(0, 16384).split[0] == (132, 14336, 1)  # 108.6 waves: the last too full to split


def test_a_launch_without_a_workspace_zeroes_one_of_its_own(sms):
    sms(132)
    call = FakeCall()
    ctas, width, fields, held = hopper.walk(call, 1, 1, None)
    p = hopper.plan(0, 1)
    whole, parts, partials, counters = fields
    assert (ctas, width, whole, parts) == (126, 256, 0, 6) and held is not None
    assert call.done == [("empty", (p.workspace_bytes,), "float8_e4m3fn"), ("zero", p.counter_bytes)]
    assert counters == held.data_ptr() and partials == counters + p.counter_bytes


class FakeGate:
    shape = (50, HIDDEN)

    def data_ptr(self):
        return 0x5000

    def stride(self):
        return (HIDDEN + 64, 1)


def test_launches_fill_each_struct_and_return_their_records(sms, monkeypatch):
    """The launches build each kernel's struct by field name and return the LaunchRecords of
    what they launched (no GPU: the kernels and tensor maps are stand-ins)."""
    sms(132)
    launched = []

    class Kernel:
        def __init__(self, name, build):
            self.name, self.build = name, build

        def launch(self, stream_ptr, grid, block, values):
            launched.append(self.name)
            assert isinstance(values, tuple) and type(values).__name__ == self.build.kernel_params(self.name).c_name
            return launcher.LaunchRecord(self, stream_ptr, grid, block, values)

    monkeypatch.setattr(hopper, "kernel", lambda device_id, name, build: Kernel(name, build))
    monkeypatch.setattr(hopper, "tensor_map",
                        lambda address, rows, pitch, box_rows, row_bytes: (address, rows, box_rows))
    for values in (hopper.fc1_values, hopper.quant_values, hopper.fc2_values):
        values.cache_clear()  # built with the stand-in maps below, and dropped after
    monkeypatch.setattr(hopper, "fc1_values", hopper.fc1_values.__wrapped__)
    monkeypatch.setattr(hopper, "fc2_values", hopper.fc2_values.__wrapped__)
    monkeypatch.setattr(hopper, "strides_elems", lambda t: t.stride())
    monkeypatch.setattr(hopper, "data_ptr", lambda t: t.data_ptr())
    call = FakeCall()
    fc1 = hopper.launch_fc1(call, 3000, 0x10, 0x20, 0x30, 0x40, 0x50, split=1 << 20)
    assert (fc1.stream_ptr, fc1.grid, fc1.block) == (7, (132, 1), hopper.GEMM_THREADS)
    v = fc1.values
    p = hopper.plan(0, 3000)
    assert (v.map_a, v.map_w1) == ((0x10, 3000, hopper.BM), (0x30, FC1_OUT, p.width[0]))
    assert (v.a_scale, v.w1_scale, v.y, v.M) == (0x20, 0x40, 0x50, 3000)
    assert (v.split_whole, v.split_parts) == p.split[0][1:] and v.split_parts == 2
    quant, fc2 = hopper.launch_fc2(call, 3000, 0x50, 0x60, 0x70, 0x80, 0x90, FakeGate(), 0xa0, 0xb0, 0xc0,
                                   split=1 << 20)
    assert (quant.grid, quant.block, quant.values) == ((3000, 1), 256, (0x50, 0x60, 0x70))
    v = fc2.values
    assert (v.gate, v.gate_stride, v.gate_rows, v.adaln_index, v.residual, v.out) == (0x5000, HIDDEN + 64, 50, 0xa0,
                                                                                      0xb0, 0xc0)
    assert launched == [hopper.gemm_kernel(hopper.FC1, p.width[0]), hopper.QUANT,
                        hopper.gemm_kernel(hopper.FC2, p.width[1])]
    assert mlp_fp8.launch_fc1(call, targets.WGMMA_FORM, 3000, 0x10, 0x20, 0x30, 0x40, 0x50, 1 << 20).values == fc1.values


def test_repeated_launch_values_are_one_struct_packed_once(monkeypatch):
    """The same numbers give the same parameter struct (fc1_values is cached), and the launcher
    packs a struct it packed last time no more."""
    monkeypatch.setattr(hopper, "tensor_map", lambda *args: bytes(128))
    hopper.fc1_values.cache_clear()
    a = hopper.fc1_values(3000, 256, 0x10, 0x20, 0x30, 0x40, 0x50, 1, 1, 0, 0)
    assert hopper.fc1_values(3000, 256, 0x10, 0x20, 0x30, 0x40, 0x50, 1, 1, 0, 0) is a

    class Fn:
        ptr = 1

    k = launcher.Kernel(Fn(), 0, hopper._PARAMS[hopper.FC1])
    k._launch = lambda *args: None
    packed = []
    k._struct = type("Counting", (), {"pack_into": lambda self, *args: packed.append(args[2])})()
    for _ in range(3):
        k.launch(7, (1, 1), 384, a)
    k.launch(7, (1, 1), 384, a._replace(M=1))
    assert len(packed) == 2
    hopper.fc1_values.cache_clear()  # its entry holds the stand-in maps


def test_the_mma_sync_builds_are_values_too():
    builds = mlp_fp8.shipped_builds("sm_120a")
    assert builds == (mlp_fp8.MmaMlpBuild("sm_120a", 0), mlp_fp8.MmaMlpBuild("sm_120a", 2))
    assert mlp_fp8.shipped_builds("sm_90") == (mlp_fp8.MmaMlpBuild("sm_90", 0),)
    d = mlp_fp8.MmaMlpBuild("sm_90").defines()
    assert (d["KS_STEP_FC1"], d["KS_STEP_FC2"], d["H3_MMA_FORM"]) == (2, 1, 0)
    assert mlp_fp8.MmaMlpBuild("sm_89").kernel_params(mlp_fp8.FC2) == ("u64",) * 6 + ("i64", "i64") + ("u64",) * 4 + (
        "i32",)
    assert mlp_fp8.MmaMlpBuild("sm_89").dynamic_smem(mlp_fp8.FC1) == mlp_fp8.SMEM_BYTES


@pytest.mark.parametrize("arch,requested,want", [("sm_90", -1, 3), ("sm_90", 3, 3), ("sm_90", 0, 0),
                                                 ("sm_120a", 0, 0), ("sm_89", -1, 0)])
def test_mlp_form_selection(monkeypatch, arch, requested, want):
    monkeypatch.setattr(targets, "device_arch", lambda device_id: arch)
    monkeypatch.setattr(targets, "board_form", lambda device_id: 0)
    assert targets.operator_form(0, requested) == want


@pytest.mark.parametrize("arch", ["sm_120a", "sm_89"])
def test_form_3_needs_sm90a(monkeypatch, arch):
    monkeypatch.setattr(targets, "device_arch", lambda device_id: arch)
    with pytest.raises(ValueError, match="fp8_mma_form.*form 3 needs sm_90a"):
        targets.operator_form(0, 3)
    with pytest.raises(ValueError, match="fp8_mma_form"):
        targets.operator_form(0, True)


@pytest.mark.gpu
# on 132 SMs: FC1 in 224-column tiles at 1 and 129, FC2 split 6 and 3 ways there; FC1 split 2 ways at 3000 and
# 2176, FC2 at 2176 in 224-column tiles split 11 ways
@pytest.mark.parametrize("m", [1, 129, 2176, 3000])
def test_form_3_against_the_reference_and_form_0(m, require_mlp_form):
    require_mlp_form(3)
    import torch

    import h3kernels
    from h3kernels import reference as R
    from h3kernels.testing.checks import rel_l2
    from h3kernels.testing.inputs import make_mlp_weights, make_row_inputs
    from h3kernels.testing.poison import poisoned_mlp_workspaces

    gate, residual, w1, w2, q1, s1, q2, s2 = make_mlp_weights(m, 50)
    x, wn, sc, sh, idx = make_row_inputs(m, 50, device="cuda", seed=m)
    outs, wss = {}, {}
    for form in (0, 3):
        ws = poisoned_mlp_workspaces(m)
        outs[form] = h3kernels.minimax_h3_mlp_fp8(x, wn, sc, sh, idx, gate, residual, q1, s1, q2, s2,
                                                  fp8_mma_form=form, **ws)
        wss[form] = ws
    torch.cuda.synchronize()
    ws = wss[3]
    assert torch.equal(ws["workspace_a_q"].view(torch.uint8), wss[0]["workspace_a_q"].view(torch.uint8))
    assert torch.equal(ws["workspace_a_scale"], wss[0]["workspace_a_scale"])
    y = ws["workspace_y"]
    assert torch.isfinite(y.float()).all()
    y_q, y_s = R.quantize_rows(y)
    assert torch.equal(ws["workspace_y_q"].view(torch.uint8), y_q.view(torch.uint8))
    assert torch.equal(ws["workspace_y_scale"], y_s)
    check_mlp_y_wgmma(ws["workspace_a_q"], ws["workspace_a_scale"], q1, s1, y, f"M={m}")
    valid = R.index_guard(idx, gate.shape[0])[1]
    out = outs[3]
    assert torch.equal(out[~valid].view(torch.int16), residual[~valid].view(torch.int16))
    delta = R.mlp_exact_bf16(x, wn, sc, sh, idx, gate, w1, w2)
    e0 = rel_l2(outs[0].float() - residual.float(), delta)
    e3 = rel_l2(out.float() - residual.float(), delta)
    assert e3 <= 1.02 * e0, (e3, e0)


@pytest.mark.gpu
def test_form_3_y_is_as_close_to_exact_sums_as_scaled_mm_without_fast_accumulation(require_mlp_form, seed):
    """The contract's rule for a family whose tensor cores do not accumulate in full FP32: its
    share of y over 1 bf16 ulp and over 2 ulps from y of exact sums, and its y rel L2, at most
    1.01 times those of torch._scaled_mm with fast accumulation off on the same quantized
    operands (a_q and a_scale of the row stage, the prepared FC1 weights), that peer's FP32 sums
    going through the contract's epilogue (reference.swiglu_from_sums)."""
    require_mlp_form(3)
    import torch

    import h3kernels
    from h3kernels import reference as R
    from h3kernels.testing.checks import PEER_SLACK, report, scaled_mm_y, y_figures
    from h3kernels.testing.inputs import make_mlp_weights, make_row_inputs
    from h3kernels.testing.poison import poisoned_mlp_workspaces

    m = 1024
    gate, residual, _, _, q1, s1, q2, s2 = make_mlp_weights(m, 50, seed=seed)
    x, wn, sc, sh, idx = make_row_inputs(m, 50, device="cuda", seed=seed + 1)
    ws = poisoned_mlp_workspaces(m)
    h3kernels.minimax_h3_mlp_fp8(x, wn, sc, sh, idx, gate, residual, q1, s1, q2, s2, fp8_mma_form=3, **ws)
    a_q, a_scale, y3 = ws["workspace_a_q"], ws["workspace_a_scale"], ws["workspace_y"]
    y_peer = scaled_mm_y(a_q, a_scale, q1, s1)
    y_exact = R.fc1_swiglu(a_q, a_scale, q1, s1)
    torch.cuda.synchronize()
    assert torch.isfinite(y3.float()).all() and torch.isfinite(y_peer.float()).all()
    names = ("over_1_ulp", "over_2_ulps", "rel_l2")
    form3, peer = dict(zip(names, y_figures(y3, y_exact))), dict(zip(names, y_figures(y_peer, y_exact)))
    report(dict(check="MLP y against y of exact sums, form 3 and torch._scaled_mm (fast accumulation off)", m=m,
                form3=form3, scaled_mm=peer))
    assert all(form3[k] <= PEER_SLACK * peer[k] for k in names), (form3, peer)
