"""The kernel loader: per-arch compile without a GPU, cache keys, disk cache placement."""
import shutil

import pytest

from h3kernels.cli import compile_check
from h3kernels._runtime import compiler, targets


def test_every_source_compiles_for_sm120a_and_sm90_without_spills(capsys):
    assert compile_check.main([]) == 0
    out = capsys.readouterr().out
    assert "sm_120a" in out and "sm_90" in out and "compile_check: ok" in out


def test_arch_mapping():
    assert targets.arch_for((12, 0)) == "sm_120a"
    assert targets.arch_for((9, 0)) == "sm_90"
    assert targets.arch_for((8, 9)) == "sm_89"
    with pytest.raises(ValueError, match="compute capability 8.0 is not supported"):
        targets.arch_for((8, 0))


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    src = tmp_path / "cuda_src"
    shutil.copytree(compiler.source_dir(), src)
    monkeypatch.setattr(compiler, "source_dir", lambda: src)
    monkeypatch.setenv("H3KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    return src


def test_cache_key_covers_included_files_and_options(sandbox):
    opts = compiler.options_for("sm_90", {"H3_MMA_FORM": 0})
    key = compiler.cache_key("mma_ceiling", opts)
    assert compiler.cache_key("mma_ceiling", opts) == key
    assert compiler.cache_key("mma_ceiling", compiler.options_for("sm_120a", {"H3_MMA_FORM": 0})) != key
    header = sandbox / "fp8_common.cuh"
    header.write_text(header.read_text() + "\n// a comment changes the key\n")
    assert compiler.cache_key("mma_ceiling", opts) != key


def test_disk_cache_is_used_and_lives_outside_the_package(sandbox, tmp_path):
    before = sorted(p.name for p in sandbox.iterdir())
    cubin, log, key = compiler.compile_cubin("mma_ceiling", "sm_90", {"H3_MMA_FORM": 0})
    assert cubin[:4] == b"\x7fELF"
    cached = list((tmp_path / "cache").glob(f"*{key}.cubin"))
    assert len(cached) == 1
    again, log2, _ = compiler.compile_cubin("mma_ceiling", "sm_90", {"H3_MMA_FORM": 0})
    assert again == cubin and log2 == ""  # served from disk, not recompiled
    assert sorted(p.name for p in sandbox.iterdir()) == before


def test_missing_include_is_a_clear_error(sandbox):
    (sandbox / "broken.cu").write_text('#include "nowhere.cuh"\n')
    with pytest.raises(compiler.CompileError, match="nowhere.cuh"):
        compiler.compile_cubin("broken", "sm_90")


def test_compile_error_carries_the_log(sandbox):
    (sandbox / "bad.cu").write_text('extern "C" __global__ void k() { undefined_thing(); }\n')
    with pytest.raises(compiler.CompileError, match="undefined_thing"):
        compiler.compile_cubin("bad", "sm_90", use_cache=False)


def test_ptxas_log_parsing():
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_120a'\n"
           "ptxas info    : Function properties for k\n"
           "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Used 96 registers, used 1 barriers, 73728 bytes smem\n")
    assert compile_check.parse_ptxas(log) == {"k": dict(regs=96, smem=73728, stack=8, spill_st=4, spill_ld=4)}


def test_compiling_under_the_module_lock_does_not_deadlock(sandbox):
    # get_function compiles while it holds compiler._lock, and compile_cubin takes the lock again
    # (through nvrtc()). A plain Lock hung every GPU test here; run it in a thread to fail, not hang.
    import threading

    done = []

    def compile_locked():
        with compiler._lock:
            done.append(compiler.compile_cubin("mma_ceiling", "sm_90", {"H3_MMA_FORM": 0}, use_cache=False)[0][:4])

    t = threading.Thread(target=compile_locked, daemon=True)
    t.start()
    t.join(timeout=120)
    assert done == [b"\x7fELF"], "compile_cubin blocked on compiler._lock held by its caller"


def test_compile_check_counts_dynamic_shared_memory(monkeypatch, capsys):
    # static smem alone fits; what a launch adds dynamically must count against the 101376 bytes too
    monkeypatch.setattr(compiler.PlainBuild, "dynamic_smem", lambda build, kernel: 101377 if kernel == "h3_f32_to_e4m3"
                        else 0)
    report = compile_check.check(("sm_90",), ["fp8_convert"])
    assert not report["ok"] and any("101377 B static + dynamic smem" in f for f in report["failures"])
    assert "101377 B static + dynamic smem" in capsys.readouterr().out


def test_compile_check_fails_on_a_warning_a_stack_frame_or_a_serialized_wgmma(monkeypatch):
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
           "ptxas warning : (C7513) wgmma.mma_async instructions are serialized due to ...\n"
           "ptxas info    : Function properties for k\n"
           "    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Used 96 registers, used 1 barriers, 0 bytes smem\n")
    monkeypatch.setattr(compiler, "compile_cubin", lambda *a, **kw: (b"", log, None))
    failures = compile_check.check(("sm_90",), ["fp8_convert"])["failures"]
    assert any("serializes wgmma" in f for f in failures)
    assert any("compiler warning: ptxas warning : (C7513)" in f for f in failures)
    assert any("k: a 8-byte stack frame" in f for f in failures)


def test_sass_with_an_nvdisasm_that_rejects_the_cubins_exits_3(monkeypatch, tmp_path, capsys):
    """A same-release nvdisasm may still call the build's cubins invalid ELF (the H200's 13.0.85
    with NVRTC 13.0): --sass then says so and exits 3, as for a missing nvdisasm."""
    from h3kernels.cli import main

    tool = tmp_path / "nvdisasm"
    tool.write_text('#!/bin/sh\necho "nvdisasm fatal   : File $2 is an invalid ELF file" >&2\nexit 1\n')
    tool.chmod(0o755)
    monkeypatch.setattr(compile_check, "nvdisasm_for", lambda major: (str(tool), (major, 0)))
    assert main(["compile_check", "fp8_convert", "--arch", "sm_90", "--sass"]) == 3
    assert "invalid ELF file" in capsys.readouterr().err
