"""`python -m h3kernels bench`'s FP8 attention peers and accuracy figures on the CPU: the peers'
shared preparation (h3kernels.peers.fp8_attention.prepared), the attention case and bench.run with
the peers unable to run here (their modules refused, as on a machine without them) or stood in for
by a CPU peer, and h3kernels.testing.fp8_accuracy at a small size. The timers, the device and our
operator are stubbed (the reference stands in for ours); the GPU runs what these leave out."""
import json
from types import SimpleNamespace

import pytest
from conftest import peer_reason_is_expected
import torch

import h3kernels
from h3kernels import reference as R
from h3kernels.cli import bench
from h3kernels.peers import fp8_attention
from h3kernels.testing import fp8_accuracy
from h3kernels.testing import inputs, timing

ABSENT = {"fa3": "fa3-fwd", "fa3_fp8": "fa3-fwd", "cudnn_fp8": "nvidia-cudnn-frontend"}


@pytest.fixture
def on_cpu(monkeypatch):
    """attention_case's GPU work on the CPU: inputs drawn there, every timer one call returning
    1.5 ms, the reference as our operator, our kernel alone a no-op."""
    draw = inputs.make_attention_inputs
    monkeypatch.setattr(inputs, "make_attention_inputs", lambda *a, **kw: draw(*a, **{**kw, "device": "cpu"}))
    monkeypatch.setattr(timing, "median_ms_batched", lambda fn, **kw: (fn(), 1.5)[1])
    monkeypatch.setattr(timing, "attention_kernel_alone", lambda *a, **kw: (lambda: None))
    monkeypatch.setattr(h3kernels, "minimax_h3_varlen_attention_fp8", R.minimax_h3_varlen_attention_fp8)


def scaled_peer(q, k, v, cu_host, softmax_scale):
    """A CPU stand-in of an FP8 peer with an e4m3 output: exact attention written as e4m3 codes of
    out * 64, as cuDNN's writes out * its out_scale."""
    def run():
        return (R.attention_exact(q, k, v, cu_host, softmax_scale) * 64).float().to(torch.float8_e4m3fn)

    run.out_scale = 64.0
    return run


def with_stand_in(monkeypatch):
    monkeypatch.setattr(fp8_attention, "PEERS", fp8_attention.PEERS + (("cpu_fp8", "CPU FP8 kernel", scaled_peer,
                                                                          True),))


def test_prepared_yields_every_peer_with_its_reason(no_peer_modules):
    q, k, v, _, cu = inputs.make_attention_inputs([64, 64], 2, device="cpu", seed=1)
    got = list(fp8_attention.prepared(q, k, v, cu))
    assert [(key, fp8) for key, _, fp8, _, _ in got] == [("fa3", False), ("fa3_fp8", True), ("cudnn_fp8", True)]
    assert all(run is None and isinstance(err, fp8_attention.PeerUnavailable) for *_, run, err in got)
    assert [key for key, *_ in fp8_attention.prepared(q, k, v, cu, fp8_only=True)] == ["fa3_fp8", "cudnn_fp8"]
    for key, _, _, _, err in got:
        assert ABSENT[key] in fp8_attention.reason(err)
    assert fp8_attention.reason(ValueError("a\nb " + "x" * 400)).startswith("ValueError: a b x")
    assert len(fp8_attention.reason(ValueError("x" * 400))) == 304


def test_values_divide_by_the_scale_of_an_e4m3_output():
    out = torch.tensor([448.0, -3.0, 0.5]).to(torch.float8_e4m3fn)

    def run():
        return out

    assert fp8_attention.values(run, out).tolist() == [448.0, -3.0, 0.5]
    run.out_scale = 4.0
    assert fp8_attention.values(run, out).tolist() == [112.0, -0.75, 0.125]


def test_attention_case_leaves_out_the_peers_that_cannot_run_and_says_why(no_peer_modules, on_cpu):
    why = {}
    rows = bench.attention_case([64, 64], forms=(3, 0), heads=2, unavailable=why)
    assert [r["form"] for r in rows] == [3, 0]
    for r in rows:  # the fields the table, the notebook and the tests read, as before
        assert {"op", "case", "form", "flops", "ours_ms", "peer", "peer_ms"} <= set(r)
        assert r["case"] == "2x64, 2 heads" and r["ours_kernel_ms"] == 1.5
        assert not any(f"{key}_ms" in r for key in ABSENT)
    assert sorted(why) == sorted(ABSENT) and all(ABSENT[key] in text for key, text in why.items())


def test_attention_case_times_a_peer_that_runs(no_peer_modules, on_cpu, monkeypatch):
    with_stand_in(monkeypatch)
    why = {}
    rows = bench.attention_case([64], forms=(0,), heads=2, unavailable=why)
    assert rows[0]["cpu_fp8_ms"] == 1.5 and "cpu_fp8" not in why and sorted(why) == sorted(ABSENT)


def test_attention_case_without_our_kernel_alone_keeps_the_row(no_peer_modules, on_cpu, monkeypatch, capsys):
    def fails(*a, **kw):
        raise RuntimeError("no launch record")

    monkeypatch.setattr(timing, "attention_kernel_alone", fails)
    rows = bench.attention_case([64], forms=(0,), heads=2)
    assert "ours_kernel_ms" not in rows[0] and rows[0]["ours_ms"] == 1.5
    assert "our kernel alone not timed: RuntimeError: no launch record" in capsys.readouterr().err


def test_reasons_once_names_the_cases_only_where_they_differ():
    by_case = {"4x4096": {"fa3": "absent", "cudnn_fp8": "absent"},
               "300+129": {"fa3": "absent", "cudnn_fp8": "one length"}, "accuracy": {"cudnn_fp8": "absent"}}
    assert bench.reasons_once(by_case, ["4x4096", "300+129"]) == {
        "fa3": "absent", "cudnn_fp8": "4x4096, accuracy: absent; 300+129: one length"}
    assert bench.reasons_once({"a": {"x": "r"}, "b": {}}, ["a", "b"]) == {"x": "a: r"}


def test_accuracy_figures_on_the_cpu(no_peer_modules, monkeypatch):
    monkeypatch.setattr(h3kernels, "minimax_h3_varlen_attention_fp8", R.minimax_h3_varlen_attention_fp8)
    with_stand_in(monkeypatch)
    figures, why = fp8_accuracy.attention_accuracy(forms=(3, 0), seqlen=96, heads=2, device="cpu")
    assert {k: figures[k] for k in ("tokens", "heads", "head_dim", "k_offset")} == dict(
        tokens=96, heads=2, head_dim=128, k_offset=fp8_accuracy.K_OFFSET)
    rows = {(r["key"], r.get("form")): r for r in figures["rows"]}
    assert list(rows) == [("ours", 3), ("ours", 0), ("reference", None), ("cpu_fp8", None)]
    assert rows[("ours", 3)]["label"] == "ours, form 3 (wgmma)"
    for r in rows.values():
        assert 0 < r["rel_l2"] < 0.1 and 0 < r["rel_l2_k_offset"] < 0.1, r
    # the reference stands in for ours: the same figures
    assert rows[("ours", 0)]["rel_l2"] == rows[("reference", None)]["rel_l2"]
    # e4m3 codes of out * 64, read back through the scale: only e4m3's rounding remains
    assert rows[("cpu_fp8", None)]["rel_l2"] < 0.05
    assert sorted(why) == ["cudnn_fp8", "fa3_fp8"] and "fa3-fwd" in why["fa3_fp8"]
    json.dumps(figures)


def test_bench_run_records_the_peers_and_the_accuracy(no_peer_modules, on_cpu, stub_bench_device, monkeypatch,
                                                      tmp_path, capsys):
    # small and on the CPU: the defaults take a GPU
    monkeypatch.setattr(bench, "accuracy_figures",
                        lambda forms: fp8_accuracy.attention_accuracy(forms, seqlen=64, heads=2, device="cpu"))
    path, table = tmp_path / "b.json", tmp_path / "b.csv"
    assert bench.run(SimpleNamespace(rows=[], segments=[[64, 64], [48, 16]], json=str(path), csv=str(table))) == 0
    doc = json.loads(path.read_text())
    assert [(r["case"], r["form"]) for r in doc["rows"]] == [("2x64, 56 heads", 3), ("2x64, 56 heads", 0),
                                                             ("48+16, 56 heads", 3), ("48+16, 56 heads", 0)]
    assert all(r["ours_kernel_ms"] == 1.5 and r["peer_ms"] == 1.5 for r in doc["rows"])
    # each reason once: bare where every set gave it, after the cases that gave it otherwise
    why = doc["peers_unavailable"]
    assert sorted(why) == sorted(ABSENT)
    assert why["fa3"] == why["fa3_fp8"] == ("FlashAttention-3 (fa3-fwd) not importable: ImportError: No module "
                                            "named 'fa3_fwd_interface'")
    assert why["cudnn_fp8"].startswith("2x64, accuracy: cuDNN frontend (nvidia-cudnn-frontend) not importable")
    assert why["cudnn_fp8"].endswith("; 48+16: cuDNN FP8 SDPA: segments of one length only (per-tensor scales, "
                                     "a batch)")
    acc = doc["accuracy"]
    assert [(r["key"], r.get("form")) for r in acc["rows"]] == [("ours", 3), ("ours", 0), ("reference", None)]
    assert "ours_kernel_ms" in table.read_text().splitlines()[0]
    out = capsys.readouterr().out
    assert "not run: FA3 bf16: FlashAttention-3 (fa3-fwd) not importable" in out
    assert "rel L2 against exact attention (float64)" in out and "h3kernels.reference (FP8)" in out


def test_bench_run_keeps_the_times_when_the_accuracy_fails(no_peer_modules, on_cpu, stub_bench_device, monkeypatch,
                                                          tmp_path):
    from h3kernels._runtime import targets

    monkeypatch.setattr(targets, "device_arch", lambda dev: "sm_89")  # one family: mma.sync
    monkeypatch.setattr(bench, "ceiling_tflops", lambda dev, form, on_error: 400.0)

    def fails(forms):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(bench, "accuracy_figures", fails)
    path = tmp_path / "b.json"
    assert bench.run(SimpleNamespace(rows=[], segments=[[64]], json=str(path), csv=None)) == 0
    doc = json.loads(path.read_text())
    assert doc["accuracy"] == {"error": "RuntimeError: out of memory"} and len(doc["rows"]) == 1
    assert sorted(doc["peers_unavailable"]) == sorted(ABSENT)


@pytest.mark.gpu
def test_accuracy_figures_on_the_gpu():
    """Ours within 1.1x the reference's error in every form, with and without the key offset (the
    settled bound, h3kernels.testing.checks.attention_misses); each FP8 peer measured or said why not."""
    from h3kernels._runtime.targets import offered_forms

    forms = offered_forms("attention", torch.cuda.current_device())
    figures, why = fp8_accuracy.attention_accuracy(forms)
    rows = {(r["key"], r.get("form")): r for r in figures["rows"]}
    ref = rows[("reference", None)]
    for form in forms:
        for field in ("rel_l2", "rel_l2_k_offset"):
            assert rows[("ours", form)][field] <= 1.1 * ref[field], (form, field, rows[("ours", form)], ref)
    for key in ("fa3_fp8", "cudnn_fp8"):
        assert (key in why and peer_reason_is_expected(why[key])) or 0 < rows[(key, None)]["rel_l2"] < 0.2, (key, why)
