"""`python -m h3kernels`: the command grammar, exit statuses and the --json results, run as a user
runs them (a subprocess from the repository root), or in-process where a worker is stubbed to
show that bad usage stops before any work. Exit statuses: 0 success, 1 a check failed, 2 bad
usage, 3 this machine lacks what the command needs (a CUDA GPU, a matching nvdisasm)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import peer_reason_is_expected
import torch

REPO = Path(__file__).resolve().parents[1]
GPU = torch.cuda.is_available()
COMMANDS = ("info", "demo", "check", "bench", "compile_check")
cpu_only = pytest.mark.skipif(GPU, reason="the CPU fallback of a GPU command")


def cli(*args, module="h3kernels", timeout=900):
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout)


def run_json(tmp_path, *args, status=0):
    """Runs a command with --json, checks its exit status, returns the JSON document."""
    path = tmp_path / "result.json"
    out = cli(*args, "--json", path)
    assert out.returncode == status, out.stdout + out.stderr
    return json.loads(path.read_text())


def assert_usage_error(out):
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "error:" in out.stderr, out.stderr


def test_no_command_prints_the_commands_and_exits_2():
    out = cli()
    assert_usage_error(out)
    assert all(c in out.stderr for c in COMMANDS), out.stderr


def test_help_lists_the_commands_and_the_exit_statuses():
    out = cli("--help")
    assert out.returncode == 0
    assert all(c in out.stdout for c in COMMANDS)
    table = dict(re.findall(r"^  ([0-3])  (\w+)", out.stdout, re.M))
    assert sorted(table) == ["0", "1", "2", "3"], out.stdout


@pytest.mark.parametrize("args", [["frobnicate"], ["demo", "--no-such-option"], ["demo", "--rows", "0"],
                                  ["demo", "--segments", "4,a"], ["demo", "--segments", "0"],
                                  ["demo", "--segments", "-3,4"], ["demo", "--segments", "4x0"],
                                  ["bench", "--segments", "4096;4096"], ["bench", "--rows", "--segments"]],
                         ids=lambda a: " ".join(a))
def test_bad_usage_exits_2_in_one_line(args):
    assert_usage_error(cli(*args))


def test_compile_check_names_the_known_sources_for_an_unknown_one():
    out = cli("compile_check", "nonexistent", "mlp_fp8.cu")
    assert_usage_error(out)
    assert "nonexistent" in out.stderr and "mlp_fp8" in out.stderr and "mma_ceiling" in out.stderr


@pytest.mark.parametrize("name", ["mma_ceiling", "mma_ceiling.cu", "cuda_src/mma_ceiling.cu"])
def test_compile_check_takes_a_stem_or_a_file_name_and_reports_nvrtc(tmp_path, name):
    doc = run_json(tmp_path, "compile_check", name, "--arch", "sm_90")
    assert doc["ok"] and not doc["failures"]
    assert re.fullmatch(r"\d+\.\d+", doc["nvrtc"])
    assert {k["source"] for k in doc["kernels"]} == {"mma_ceiling"} and {k["arch"] for k in doc["kernels"]} == {"sm_90"}
    assert all(k["spill_st"] == k["spill_ld"] == 0 and k["regs"] > 0 for k in doc["kernels"])


def test_compile_check_module_entry_point_is_the_subcommand():
    out = cli("mma_ceiling", "--arch", "sm_90", module="h3kernels.cli.compile_check")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "NVRTC" in out.stdout.splitlines()[0]


def test_compile_check_sass_exits_0_or_3_never_with_a_traceback(tmp_path):
    """--sass reads the build's cubins with an nvdisasm of the same CUDA major, or refuses (3)."""
    path = tmp_path / "sass.json"
    out = cli("compile_check", "mma_ceiling", "--arch", "sm_90", "--sass", "--json", path)
    assert out.returncode in (0, 3), out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    if out.returncode == 3:
        assert "nvdisasm" in out.stderr
        doc = json.loads(path.read_text())
        assert doc["status"] == "missing" and doc["exit"] == 3 and "nvdisasm" in doc["reason"]
        return
    doc = json.loads(path.read_text())
    assert doc["nvdisasm"]["version"].split(".")[0] == doc["nvrtc"].split(".")[0]
    assert all("mma" in k for k in doc["kernels"])


def test_info(tmp_path):
    doc = run_json(tmp_path, "info")
    assert doc["cache_dir"] and doc["sources_dir"].endswith("cuda_src")
    assert (doc["gpu"] is not None) == GPU
    if GPU:
        assert doc["gpu"]["arch"] in ("sm_120a", "sm_90", "sm_89")


@pytest.mark.slow  # without a GPU: both Numba kernels in the simulator, ~40 s
def test_check_passes_on_this_device(tmp_path):
    doc = run_json(tmp_path, "check")
    assert doc["mode"] == ("gpu" if GPU else "simulator")
    assert doc["ok"] and len(doc["results"]) == (8 if GPU else 2) and all(r["ok"] for r in doc["results"])


@cpu_only
@pytest.mark.slow  # prepares MiniMax-H3-sized weights on the CPU, ~35 s
def test_demo_on_the_cpu_runs_the_reference_at_the_sizes_given(tmp_path):
    doc = run_json(tmp_path, "demo", "--rows", "3", "--segments", "16,0,9", "40x2")
    assert doc["device"] == "cpu" and doc["runs"] == "reference" and doc["ok"]
    assert [r["rows"] for r in doc["mlp"]] == [3]
    assert [r["segments"] for r in doc["attention"]] == [[16, 0, 9], [40, 40]]
    assert len(doc["stages"]) == 1 + 1 + 2 and all(s["seconds"] >= 0 for s in doc["stages"])
    assert all(r["cos"] > 0.99 for r in doc["mlp"]) and all(r["rel_l2"] < 0.1 for r in doc["attention"])


@cpu_only
@pytest.mark.parametrize("args", [["--rows", "100000"], ["--segments", "16384"], ["--segments", "4096x4"]],
                         ids=lambda a: " ".join(a))
def test_demo_on_the_cpu_refuses_sizes_too_large_for_it(tmp_path, args):
    path = tmp_path / "demo.json"
    out = cli("demo", *args, "--json", path)
    assert_usage_error(out)
    assert "too large for the CPU" in out.stderr and not path.exists()


@cpu_only
@pytest.mark.parametrize("args", [["bench"], ["demo", "--gpu"], ["check", "--gpu"]], ids=lambda a: " ".join(a))
def test_commands_that_need_a_gpu_exit_3_without_one_and_write_why(tmp_path, args):
    path = tmp_path / "missing.json"
    out = cli(*args, "--json", path)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "No CUDA GPU" in out.stderr
    doc = json.loads(path.read_text())
    assert doc == dict(command=args[0], ok=False, status="missing", exit=3, reason=doc["reason"])
    assert doc["reason"] in out.stderr and "No CUDA GPU" in doc["reason"]


@pytest.mark.gpu
def test_demo_on_the_gpu_runs_the_sizes_given(tmp_path):
    doc = run_json(tmp_path, "demo", "--gpu", "--rows", "1000", "--segments", "300,0,1000", "128x2")
    assert doc["runs"] == "kernels" and doc["ok"]
    assert [r["rows"] for r in doc["mlp"]] == [1000] and doc["mlp"][0]["row_stage_bitwise"]
    assert [r["segments"] for r in doc["attention"]] == [[300, 0, 1000], [128, 128]]
    assert all(r["ms"] > 0 for r in doc["mlp"] + doc["attention"])


@pytest.mark.gpu
def test_bench_writes_a_table_and_json(tmp_path):
    from h3kernels._runtime.targets import offered_forms

    path, table = tmp_path / "bench.json", tmp_path / "bench.csv"
    out = cli("bench", "--rows", "256", "--segments", "300,0,129", "1024x2", "--json", path, "--csv", table)
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(path.read_text())
    mlp, attention = offered_forms("mlp", 0), offered_forms("attention", 0)
    assert [(r["case"], r["form"]) for r in doc["rows"]] == (
        [("M=256", f) for f in mlp] + [(c, f) for c in ("300+0+129, 56 heads", "2x1024, 56 heads") for f in attention])
    assert all(r["ours_ms"] > 0 and r["peer_ms"] > 0 for r in doc["rows"])
    ceilings = {c["form"]: c["tflops"] for c in doc["ceilings"]}
    assert sorted(ceilings) == sorted(set(mlp) | set(attention)) and all(ceilings.values())
    assert all(r["ceiling_tflops"] == ceilings[r["form"]] for r in doc["rows"])  # each row: its own family's
    assert table.read_text().splitlines()[0].split(",")[:3] == ["op", "case", "form"]
    # the FP8 attention peers: each timed (ms) or its reason once; ours' kernel alone timed
    att_rows = [r for r in doc["rows"] if r["op"] == "attention"]
    assert all(r["ours_kernel_ms"] > 0 for r in att_rows)
    for key in ("fa3", "fa3_fp8", "cudnn_fp8"):
        why = doc["peers_unavailable"].get(key, "")
        for part in filter(None, why.split("; ")):  # absent, or a set it does not take: nothing else
            assert peer_reason_is_expected(part), (key, part)
        if not why:
            assert all(r[f"{key}_ms"] > 0 for r in att_rows), key
    # the ragged set: cuDNN's FP8 SDPA takes segments of one length only
    assert "300+0+129" in doc["peers_unavailable"]["cudnn_fp8"]
    measured = [(r["key"], r.get("form")) for r in doc["accuracy"]["rows"]]
    assert measured[:len(attention) + 1] == [("ours", f) for f in attention] + [("reference", None)]


@pytest.mark.gpu
def test_bench_on_compute_capability_9_times_both_families_against_their_ceilings(tmp_path):
    if torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("form 3 (wgmma) needs compute capability 9.0")
    doc = run_json(tmp_path, "bench", "--rows", "1000", "--segments")
    assert [r["form"] for r in doc["rows"]] == [3, 0]  # the MLP: its default (the wgmma family), then mma.sync
    ceilings = {c["family"]: c["tflops"] for c in doc["ceilings"]}
    # the wgmma ceiling issues several times the (emulated) e4m3 mma.sync rate on Hopper
    assert ceilings["wgmma"] > 2 * ceilings["mma.sync"] and doc["ceiling_tflops"] == ceilings["wgmma"]
    assert [r["ceiling_tflops"] for r in doc["rows"]] == [ceilings["wgmma"], ceilings["mma.sync"]]


def test_bench_rows_carry_their_form_and_the_ceiling_of_its_family(stub_bench_device, tmp_path, monkeypatch, capsys):
    """bench.run's bookkeeping with the timings, the ceilings and the device stubbed (runs on CPU)."""
    from types import SimpleNamespace

    bench = stub_bench_device

    def case(op):
        second = dict(peer2="flash SDPA bf16", peer2_ms=8.0) if op == "attention" else {}
        return lambda size, forms, **_: [dict(op=op, case=str(size), form=f, flops=1e12, ours_ms=10.0 / (1 + f),
                                              peer="torch", peer_ms=5.0, **second) for f in forms]

    monkeypatch.setattr(bench, "mlp_case", case("mlp"))
    monkeypatch.setattr(bench, "attention_case", case("attention"))
    monkeypatch.setattr(bench, "accuracy_figures", lambda forms: (dict(tokens=64, heads=2, head_dim=128, seed=0,
                                                                       k_offset=4.0, against="exact", rows=[]), {}))
    path, table = tmp_path / "b.json", tmp_path / "b.csv"
    assert bench.run(SimpleNamespace(rows=[64], segments=[[128]], json=str(path), csv=str(table))) == 0
    doc = json.loads(path.read_text())
    # each operator's default form on sm_90 first (the wgmma family), then its other family
    assert [(r["op"], r["form"]) for r in doc["rows"]] == [("mlp", 3), ("mlp", 0), ("attention", 3),
                                                           ("attention", 0)]
    assert [r["ceiling_tflops"] for r in doc["rows"]] == [1600.0, 400.0, 1600.0, 400.0]
    assert [round(r["pct_ceiling"], 6) for r in doc["rows"]] == [25.0, 25.0, 25.0, 25.0]
    assert doc["ceiling_tflops"] == 1600.0
    assert doc["ceilings"] == [dict(form=0, family="mma.sync", tflops=400.0), dict(form=3, family="wgmma",
                                                                                 tflops=1600.0)]
    assert table.read_text().splitlines()[0].startswith("op,case,form,")
    assert "peer2" in table.read_text().splitlines()[0]  # the attention rows' second peer, blank for the MLP
    assert [r.get("peer2_tflops") for r in doc["rows"]] == [None, None, 125.0, 125.0]
    out = capsys.readouterr().out
    assert "mma.sync (form 0) 400 TFLOP/s" in out and "wgmma (form 3) 1600 TFLOP/s" in out
    assert out.count("flash SDPA bf16") == 2


@pytest.mark.parametrize("arch,board,mlp,attention", [("sm_90", 0, (3, 0), (3, 0)), ("sm_120a", 2, (2,), (2,)),
                                                      ("sm_120a", 0, (0,), (0,)), ("sm_89", 0, (0,), (0,))])
def test_offered_forms_put_the_default_first_and_both_families_on_sm90_only(monkeypatch, arch, board, mlp, attention):
    from h3kernels._runtime import targets

    monkeypatch.setattr(targets, "device_arch", lambda dev: arch)
    monkeypatch.setattr(targets, "board_form", lambda dev: board)
    assert targets.offered_forms("mlp", 0) == mlp and targets.offered_forms("attention", 0) == attention


# --- bad usage stops before any work; every run that is not bad usage writes its JSON ---

def stub_commands(monkeypatch):
    """Replaces every command's work with a recorder: what main() calls after the checks."""
    import h3kernels.cli as cli_module

    called = []
    for name in ("cmd_info", "cmd_demo", "cmd_check", "cmd_bench", "cmd_compile_check"):
        monkeypatch.setattr(cli_module, name, lambda args, name=name: called.append(name) or 0)
    return called


def test_info_json_in_a_missing_directory_exits_2_at_once_in_one_line(tmp_path):
    path = tmp_path / "no such directory" / "x.json"
    out = cli("info", "--json", path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout == ""  # nothing reported: no work was done
    assert out.stderr.splitlines() == [f"python -m h3kernels info: error: --json {str(path)!r} cannot be written: "
                                       f"its directory {str(path.parent)!r} does not exist"]
    assert not path.parent.exists()


@pytest.mark.parametrize("where", ["missing directory", "a directory", "under a file", "trailing slash", "empty"])
@pytest.mark.parametrize("args", [["info"], ["demo"], ["check", "--gpu"], ["bench"], ["bench", "--csv"],
                                  ["compile_check", "mma_ceiling"]], ids=lambda a: " ".join(a))
def test_an_output_path_that_cannot_be_written_is_bad_usage_before_any_work(tmp_path, monkeypatch, capsys, args,
                                                                             where):
    from h3kernels.cli import main

    called = stub_commands(monkeypatch)
    (tmp_path / "file").write_text("kept")
    path = {"missing directory": tmp_path / "no" / "x.json", "a directory": tmp_path,
            "under a file": tmp_path / "file" / "x.json", "trailing slash": f"{tmp_path / 'new'}/",
            "empty": ""}[where]
    option = args[-1] if args[-1].startswith("--") and args[-1] != "--gpu" else "--json"
    argv = [a for a in args if a != option] + [option, str(path)]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert called == [] and len(err) == 1 and f"error: {option} " in err[0] and str(path) in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] and (tmp_path / "file").read_text() == "kept"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="file modes bind only a non-root POSIX user")
@pytest.mark.parametrize("existing", [False, True], ids=["new file", "read-only file"])
def test_an_output_path_without_write_permission_is_bad_usage(tmp_path, monkeypatch, capsys, existing):
    from h3kernels.cli import main

    called = stub_commands(monkeypatch)
    path = tmp_path / "x.json"
    if existing:
        path.write_text("kept")
        path.chmod(0o444)
    else:
        tmp_path.chmod(0o555)
    try:
        assert main(["info", "--json", str(path)]) == 2
    finally:
        tmp_path.chmod(0o755)
    assert called == [] and "no permission" in capsys.readouterr().err
    assert path.read_text() == "kept" if existing else not path.exists()


def test_a_writable_output_path_runs_the_command(tmp_path, monkeypatch):
    from h3kernels.cli import main

    called = stub_commands(monkeypatch)
    path = tmp_path / "x.json"
    path.write_text("an earlier run's")
    assert main(["info", "--json", str(path)]) == 0 and called == ["cmd_info"]


def test_a_failed_check_writes_its_json_with_the_status(tmp_path, monkeypatch):
    from h3kernels._runtime import compiler
    from h3kernels.cli import main

    monkeypatch.setattr(compiler.PlainBuild, "dynamic_smem", lambda build, kernel: 1 << 20)
    path = tmp_path / "failed.json"
    assert main(["compile_check", "fp8_convert", "--arch", "sm_90", "--json", str(path)]) == 1
    doc = json.loads(path.read_text())
    assert (doc["command"], doc["ok"], doc["status"], doc["exit"]) == ("compile_check", False, "failed", 1)
    assert doc["failures"] and doc["kernels"]


@pytest.mark.parametrize("args", [["info", "--bogus"], ["demo", "--rows", "8", "--bogus", "1"],
                                  ["compile_check", "mma_ceiling", "--bogus"]], ids=lambda a: " ".join(a))
def test_a_commands_stray_argument_shows_that_commands_usage(args):
    out = cli(*args)
    assert_usage_error(out)
    stray = " ".join(args[args.index("--bogus"):])
    assert out.stderr.splitlines()[0].startswith(f"usage: python -m h3kernels {args[0]} ")
    assert out.stderr.splitlines()[-1] == f"python -m h3kernels {args[0]}: error: unrecognized arguments: {stray}"


# --- compile_check --arch: each arch asked for holds for every source, or the command says which not ---

def fake_compile(calls):
    """compiler.compile_cubin's stand-in: one kernel, its ptxas report, no NVRTC run."""
    def compile_cubin(name, arch, defines, extra=(), use_cache=True, appended=""):
        calls.append((name, arch))
        return b"", f"ptxas info : Compiling entry function 'k' for '{arch}'\nptxas info : Used 32 registers", ""
    return compile_cubin


def test_compile_check_refuses_an_arch_a_named_source_is_not_built_for(tmp_path):
    path = tmp_path / "x.json"
    out = cli("compile_check", "mlp_fp8_sm90a", "--arch", "sm_89", "--json", path)
    assert_usage_error(out)
    assert "mlp_fp8_sm90a is not built for sm_89 (it is built for sm_90a)" in out.stderr and not path.exists()


def test_compile_check_names_every_named_source_not_built_for_the_arch(monkeypatch, capsys):
    from h3kernels._runtime import compiler
    from h3kernels.cli import main

    calls = []
    monkeypatch.setattr(compiler, "compile_cubin", fake_compile(calls))
    assert main(["compile_check", "mlp_fp8_sm90a", "mma_ceiling", "mlp_fp8", "--arch", "sm_90a"]) == 2
    err = capsys.readouterr().err
    assert "mma_ceiling is not built for sm_90a (it is built for sm_120a, sm_90, sm_89)" in err
    assert "mlp_fp8 is not built for sm_90a" in err and "mlp_fp8_sm90a is not" not in err and calls == []
    # two archs asked for: each holds for the source on its own
    assert main(["compile_check", "mlp_fp8", "--arch", "sm_89", "--arch", "sm_90a"]) == 2 and calls == []
    assert "mlp_fp8 is not built for sm_90a (it is built" in capsys.readouterr().err


def test_compile_check_takes_every_arch_its_table_shows(tmp_path, monkeypatch):
    from h3kernels._launch import sources
    from h3kernels._runtime import compiler
    from h3kernels.cli import compile_check, main, parser

    shown = {a for n in compiler.sources() for a in sources.archs_for(n, sources.every_arch())}
    assert shown == set(sources.every_arch()) == {"sm_120a", "sm_90", "sm_89", "sm_90a"}
    for arch in sources.every_arch():
        assert parser().parse_args(["compile_check", "--arch", arch]).arch == [arch]
    calls = []
    monkeypatch.setattr(compiler, "compile_cubin", fake_compile(calls))
    monkeypatch.setattr(compile_check, "nvrtc_version", lambda: (12, 9))
    path = tmp_path / "x.json"
    assert main(["compile_check", "mlp_fp8_sm90a", "--arch", "sm_90a", "--json", str(path)]) == 0
    assert {a for _, a in calls} == {"sm_90a"} and json.loads(path.read_text())["not_built"] == []


def test_compile_check_without_names_lists_the_sources_not_built_for_the_arch(tmp_path, monkeypatch, capsys):
    from h3kernels._runtime import compiler
    from h3kernels.cli import compile_check, main

    calls = []
    monkeypatch.setattr(compiler, "compile_cubin", fake_compile(calls))
    monkeypatch.setattr(compile_check, "nvrtc_version", lambda: (12, 9))
    path = tmp_path / "x.json"
    assert main(["compile_check", "--arch", "sm_90a", "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    built = {"mlp_fp8_sm90a", "varlen_attention_fp8_sm90a", "wgmma_ceiling"}
    assert {n for n, _ in calls} == built and {a for _, a in calls} == {"sm_90a"}
    assert {s["source"] for s in doc["not_built"]} == set(compiler.sources()) - built
    assert all(s["not_built_for"] == ["sm_90a"] and "sm_90a" not in s["built_for"] for s in doc["not_built"])
    out = capsys.readouterr().out
    assert all(f"not built for sm_90a: {s['source']} (it is built for" in out for s in doc["not_built"])
    # the default pair holds as a pair: nothing is listed
    calls.clear()
    assert main(["compile_check", "--json", str(path)]) == 0 and json.loads(path.read_text())["not_built"] == []
    assert {a for _, a in calls} == {"sm_120a", "sm_90", "sm_90a"}
