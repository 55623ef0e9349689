"""The launch layer: the Numba kernels' flattened parameters against the PTX numba-cuda emits,
the argument lists the launches build against those layouts, the constants each .cu needs, and
(GPU, sm_120a) the mma forms' equal bits."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from h3kernels._launch import mlp_fp8 as launch_mlp
from h3kernels._launch import numba_ptx, sources
from h3kernels._launch import varlen_attention_fp8 as launch_attention
from h3kernels._runtime import compiler, launcher, targets

HERE = Path(__file__).resolve().parent


def test_numba_parameters_match_the_ptx_entries():
    """Count and width of every .param of every Numba kernel's .entry, as numba-cuda compiles it
    (outside the simulator; NVVM from the cuda-toolkit wheel, no GPU)."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, str(HERE / "numba_ptx_params.py")], capture_output=True, text=True,
                         env=env, timeout=900)
    if run.returncode != 0 and ("NVVM" in run.stderr or "libnvvm" in run.stderr):
        pytest.skip("numba-cuda cannot compile here (no NVVM): " + run.stderr.strip().splitlines()[-1])
    assert run.returncode == 0, run.stderr[-4000:]
    found = json.loads(run.stdout)
    assert set(found) == set(numba_ptx.SIGNATURES)
    for name, r in found.items():
        assert r["ptx"] == r["ours"], (name, r)


def test_pack_format_aligns_each_parameter():
    assert launcher.pack_format(("u64", "i32", "u64", "f32", "f32", "i64")) == "<QixxxxQffq"


@pytest.fixture
def fake_kernels(monkeypatch):
    """numba_ptx.kernel -> the kernel's name: the launches' argument lists without a GPU."""
    monkeypatch.setattr(numba_ptx, "kernel", lambda name, device_id: name)


def test_row_values_fill_the_row_kernels_parameters(fake_kernels):
    import torch

    m, rows, stride = 5, 3, 6 * 5376
    tab = torch.zeros(rows, stride, dtype=torch.bfloat16)
    x = torch.zeros(m, 5376, dtype=torch.bfloat16)
    idx = torch.zeros(m, dtype=torch.int64)
    values = launch_mlp.row_values(x, x[0], tab[:, :5376], tab[:, 5376:2 * 5376], idx, 1e-5, 1 << 20, 2 << 20)
    assert len(values) == len(numba_ptx.params("row_kernel"))
    assert values[:9] == (0, 0, m * 1344, 8, x.data_ptr(), m, 1344, 1344 * 8, 8)
    assert values[9 + 7 * 3: 9 + 7 * 3 + 2] == (stride // 4, rows)  # tab_stride (quads), rows
    assert values[-14 - 9:-14] == (0, 0, m * 1344, 4, 1 << 20, m, 1344, 1344 * 4, 4)  # a_q as uint32 quads
    assert values[-7:] == (0, 0, 0, 4, 0, 0, 4)  # zero: no words to clear
    words = launch_mlp.row_values(x, x[0], tab[:, :5376], tab[:, 5376:2 * 5376], idx, 1e-5, 1 << 20, 2 << 20,
                                  3 << 20, 29)
    assert words[:-7] == values[:-7] and words[-7:] == (0, 0, 29, 4, 3 << 20, 29, 4)
    span = ((rows - 1) * stride + 5376) // 4
    assert values[9 + 7 + 2] == span and values[9 + 7 + 5] == span  # the tables' quads from their bases
    struct_fmt = launcher.pack_format(numba_ptx.params("row_kernel"))
    import struct

    struct.pack(struct_fmt, *values)  # every value fits its parameter


@pytest.mark.parametrize("tokens,heads,segments,n", [(700, 3, 4, 8), (1, 1, 1, 1), (5, 2, 3, 1)])
def test_quant_launches_fill_every_kernels_parameters(fake_kernels, tokens, heads, segments, n):
    import struct

    launches = launch_attention.quant_launches(0, tokens, heads, segments, n, 1 << 20, 2 << 20, 3 << 20, 4 << 20, 1,
                                               6 << 20, 7 << 20, 8 << 20)
    assert [r[0] for r in launches] == ["q_kernel", "kv_block_kernel", "kv_segment_kernel", "k_quant_kernel",
                                        "v_quant_kernel"]
    one_read = launch_attention.quant_launches(0, tokens, heads, segments, n, 1 << 20, 2 << 20, 3 << 20, 4 << 20, 1,
                                               6 << 20, 7 << 20, 8 << 20, one_read=True)
    assert [r[0] for r in one_read] == ["q_kernel", "k_segment_kernel", "v_segment_kernel"]
    for name, kernel, grid, threads, values in launches + one_read:
        assert kernel == name and len(grid) == 2 and threads > 0
        assert len(values) == len(numba_ptx.params(name)), name
        struct.pack(launcher.pack_format(numba_ptx.params(name)), *values)


@pytest.mark.parametrize("tokens_q,tokens_k,heads,segments,n", [(300, 700, 3, 4, 8), (1, 0, 1, 1, 0), (5, 2, 2, 3, 1)])
def test_partial_launches_fill_every_kernels_parameters(fake_kernels, tokens_q, tokens_k, heads, segments, n):
    """The ring step's passes: Q over the queries, K and V over the key block, nothing else."""
    import struct

    for s_k, k_pass in ((None, "k_quant_kernel"), (8 << 20, "k_quant_given_kernel")):  # K's scales: its own, given
        launches = launch_attention.partial_launches(0, tokens_q, tokens_k, heads, segments, n, 1 << 20, 2 << 20,
                                                     3 << 20, 4 << 20, 5 << 20, s_k, 6 << 20, 7 << 20)
        assert [r[0] for r in launches] == ["q_kernel"] + ([k_pass, "v_quant_kernel"] if n else [])
        for name, kernel, grid, threads, values in launches:
            assert kernel == name and len(grid) == 2 and threads > 0
            assert len(values) == len(numba_ptx.params(name)), name
            struct.pack(launcher.pack_format(numba_ptx.params(name)), *values)
        if s_k and n:
            assert launches[1][4][-4] == s_k  # the given scales' address (its Numba array's data field)


@pytest.mark.parametrize("n", [0, 3])
def test_ring_statistics_launches_fill_every_kernels_parameters(monkeypatch, n):
    """The ring's statistics passes (run_segment_sums, run_key_block_scales): as many values as
    each kernel has parameters, each fitting its type; the scales pass writes no codes."""
    import contextlib
    import struct
    from types import SimpleNamespace

    import torch

    from h3kernels._runtime import workspace

    launched = []
    monkeypatch.setattr(launch_attention, "_held_plan",
                        lambda call, key, make: contextlib.nullcontext((1 << 20, 2 << 20, n)))
    monkeypatch.setattr(launch_attention, "_launch_passes", lambda call, passes: launched.extend(passes))
    monkeypatch.setattr(workspace, "scratch", lambda call, nbytes: torch.zeros(nbytes // 4 + 1))
    call = SimpleNamespace(zero=lambda address, count: launched.append(("memset", count)))
    k = v = torch.zeros(300, 2, 128, dtype=torch.bfloat16)
    stats = [torch.zeros(3, 2, 128) for _ in range(2)]
    launch_attention.run_segment_sums(call, k, v, (0, 100, 100, 300), 2, *stats)
    launch_attention.run_key_block_scales(call, k, (0, 100, 100, 300), (5, 0, 0), 2, stats[0], torch.zeros(n, 2))
    if not n:  # no keys: zero sums and amaxes, and no pass
        assert launched == [("memset", 3 * 2 * 128 * 4)] * 2
        return
    assert [p[0] for p in launched] == ["kv_block_kernel", "kv_segment_sums_kernel", "k_quant_kernel"]
    for name, grid, threads, values in launched:
        assert len(grid) == 2 and threads > 0
        assert len(values) == len(numba_ptx.params(name)), name
        struct.pack(launcher.pack_format(numba_ptx.params(name)), *values)
    k8 = launched[2][3][23:30]  # k_quant_kernel's k8 (after k, mu and blocks): empty, no codes
    assert k8 == numba_ptx.vector(0, 0, 4)


def test_scratch_layout_holds_only_what_the_caller_left_out():
    names = ("a_q", "a_scale", "y", "y_q", "y_scale", "flags")
    assert launch_mlp.scratch_layout(300, (), 0) == (0, {})  # every workspace given, no split
    assert launch_mlp.scratch_layout(300, (), 4096) == (4096, {"split": 0})  # the split workspace alone
    size, at = launch_mlp.scratch_layout(300, ("y", "flags"), 4096)
    assert at == {"y": 0, "flags": 2 * 300 * 14336, "split": 2 * 300 * 14336 + 256}  # 43 flags: 256 bytes
    assert size == at["split"] + 4096
    size, at = launch_mlp.scratch_layout(300, names, 0)
    assert set(at) == set(names) and all(o % 256 == 0 for o in at.values())
    spans = sorted((at[n], at[n] + b) for n, b in (("a_q", 300 * 5376), ("a_scale", 1200), ("y", 2 * 300 * 14336),
                                                   ("y_q", 300 * 14336), ("y_scale", 1200), ("flags", 4 * 43)))
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])) and size >= spans[-1][1]


def test_flattened_arrays_are_numbas_fields():
    assert numba_ptx.array_values(100, (2, 3, 4), 4) == (0, 0, 24, 4, 100, 2, 3, 4, 48, 16, 4)
    assert numba_ptx.array_values(100, (7,), 8) == numba_ptx.vector(100, 7, 8)
    assert launch_attention._blocks_array(100, 7) == numba_ptx.array_values(100, (7, 3), 8)  # the plan's key blocks


@pytest.mark.parametrize("source", ["mlp_fp8", "varlen_attention_fp8"])
def test_a_source_built_without_its_constants_stops(source):
    with pytest.raises(compiler.CompileError, match="-D constants"):
        compiler.compile_cubin(source, "sm_90", {"H3_MMA_FORM": 0}, use_cache=False)


def test_every_source_builds_what_ships_for_every_arch():
    """compile_check builds what sources.builds_for gives: the launch modules' shipped builds, as
    values whose constants are ints, for the archs each source is built for."""
    built = {}
    for name in compiler.sources():
        for arch in sources.archs_for(name, ("sm_120a", "sm_90", "sm_89")):
            for build in sources.builds_for(name, arch, uses_mma=True):
                hash(build)  # a value: the loader keys kernels by it
                assert all(isinstance(v, int) and not isinstance(v, bool) for v in build.defines().values())
                for kernel in getattr(build, "kernels", ()):
                    assert isinstance(build.dynamic_smem(kernel), int)
                built.setdefault(name, set()).add(arch)
    assert built["mlp_fp8_sm90a"] == built["varlen_attention_fp8_sm90a"] == {"sm_90a"}
    assert built["mlp_fp8"] == built["varlen_attention_fp8"] == {"sm_120a", "sm_90", "sm_89"}
    assert sources.archs_for("mlp_fp8_sm90a", ("sm_89",)) == ()
    assert targets.MMA_FORMS["sm_120a"] == (0, 2)  # form 1 builds form 0's SASS: not offered


def test_one_key_block_numbering():
    from h3kernels._launch import varlen_attention_fp8_plan as P

    cu = [0, 1, 129, 129, 400, 1000]
    blocks, block_offset = P.key_blocks(cu), P.plan_host(cu, 2)[1]
    assert len(blocks) == block_offset[-1]
    for seg in range(len(cu) - 1):
        mine = blocks[block_offset[seg]:block_offset[seg + 1]]
        assert (mine[:, 0] == seg).all() and mine[:, 2].sum() == cu[seg + 1] - cu[seg]
        assert np.array_equal(mine[:, 1], cu[seg] + 128 * np.arange(len(mine)))


def _sm120a():
    try:
        import torch

        from h3kernels._runtime.targets import device_arch

        return torch.cuda.is_available() and device_arch(torch.cuda.current_device()) == "sm_120a"
    except Exception:
        return False


@pytest.mark.gpu
def test_mma_forms_give_the_same_bits():
    if not _sm120a():
        pytest.skip("forms 0 and 2 both exist on sm_120a only")
    import torch

    import h3kernels
    from h3kernels import reference as R
    from h3kernels.testing.inputs import make_row_inputs

    m = 300
    x, w, sc, sh, idx = make_row_inputs(m, 3, device="cuda")
    gate = torch.randn(3, 5376, device="cuda").bfloat16() * 0.1
    res = torch.randn(m, 5376, device="cuda").bfloat16()
    w1 = torch.randn(28672, 5376, device="cuda").bfloat16() * 0.02
    w2 = torch.randn(5376, 14336, device="cuda").bfloat16() * 0.02
    (q1, s1), (q2, s2) = R.prepare_minimax_h3_fc1_weight_fp8(w1), R.prepare_minimax_h3_fc2_weight_fp8(w2)
    mlp = [h3kernels.minimax_h3_mlp_fp8(x, w, sc, sh, idx, gate, res, q1, s1, q2, s2, fp8_mma_form=f) for f in (0, 2)]
    assert torch.equal(mlp[0].view(torch.int16), mlp[1].view(torch.int16))
    cu = [0, 5, 700, 700, 2000]
    q, k, v = (torch.randn(2000, 4, 128, device="cuda").bfloat16() for _ in range(3))
    cu_dev = torch.tensor(cu, dtype=torch.int32, device="cuda")
    att = [h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, cu_seqlens_host=cu, fp8_mma_form=f)
           for f in (0, 2)]
    assert torch.equal(att[0].view(torch.int16), att[1].view(torch.int16))
