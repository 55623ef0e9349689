"""bench/perf_table.py: docs/perf.md's tables written from a `python -m h3kernels bench --json` file
(runs on the CPU)."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def perf_table():
    spec = importlib.util.spec_from_file_location("perf_table", ROOT / "bench" / "perf_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RUN = dict(device="Some GPU", date="2030-01-02", command="python -m h3kernels bench --json x.json",
           ceilings=[dict(form=3, family="wgmma", tflops=1800.4), dict(form=0, family="mma.sync", tflops=450.0)],
           rows=[dict(op="mlp", case="M=64", form=3, ours_ms=2.0, ours_tflops=900.0, pct_ceiling=50.0,
                      peer="torch eager bf16", peer_ms=3.0),
                 dict(op="attention", case="128, 56 heads", form=0, ours_ms=4.0, ours_tflops=200.0,
                      pct_ceiling=44.44, peer="cuDNN SDPA bf16", peer_ms=2.0, peer2="flash SDPA bf16",
                      peer2_ms=6.0)])


def test_tables_hold_the_run_and_every_row():
    text = perf_table().tables(RUN)
    assert text.startswith("2030-01-02, one Some GPU: `python -m h3kernels bench --json x.json`.")
    assert "wgmma (form 3) 1800, mma.sync (form 0) 450 TFLOP/s" in text
    assert "| M=64 | 3 (wgmma) | 2.000 | 900 | 50.0% | torch eager bf16 | 3.000 | 1.50x |" in text
    assert ("| 128, 56 heads | 0 (mma.sync) | 4.000 | 200 | 44.4% | cuDNN SDPA bf16 | 2.000 | 0.50x | "
            "flash SDPA bf16 | 6.000 | 1.50x |") in text
    assert text.index("**MLP") < text.index("**Attention")


def test_command_from_the_source_text():
    pt = perf_table()
    # the bench writes its own name as "command": the table shows a command a user can run instead
    assert pt.run_command(dict(command="bench")) == "python -m h3kernels bench --json PATH"
    data = dict(source="figures of `python3 -m h3kernels bench --rows 8 --json a.json` and `other`")
    assert pt.run_command(data) == "python3 -m h3kernels bench --rows 8 --json a.json"
    assert pt.run_command(data, "given") == "given"


def test_rewrite_changes_only_between_the_markers(tmp_path):
    pt = perf_table()
    doc = tmp_path / "perf.md"
    json_path = tmp_path / "run.json"
    json_path.write_text(json.dumps(RUN))
    doc.write_text(f"# Title\n\nbefore\n\n{pt.BEGIN}\nold table\n{pt.END}\n\nafter\n")
    assert pt.main([str(json_path), "--doc", str(doc), "--check"]) == 1
    assert pt.main([str(json_path), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# Title\n\nbefore\n\n" + pt.BEGIN + "\n2030-01-02")
    assert text.endswith(pt.END + "\n\nafter\n") and "old table" not in text
    assert pt.main([str(json_path), "--doc", str(doc), "--check"]) == 0
    doc.write_text("no markers\n")
    with pytest.raises(ValueError, match="marker"):
        pt.main([str(json_path), "--doc", str(doc)])


def test_readme_and_perf_md_hold_the_recorded_run():
    """README.md's and docs/perf.md's tables are those of docs/perf_h200.json, the figures notebook 03 reads."""
    assert perf_table().main(["--check"]) == 0


# a run with the FP8 attention peers: FA3 everywhere, cuDNN's FP8 SDPA on the equal-length set only
FP8_RUN = dict(RUN, rows=[
    dict(op="attention", case="4x4096, 56 heads", form=3, ours_ms=3.0, ours_tflops=640.0, pct_ceiling=35.5,
         peer="cuDNN SDPA bf16", peer_ms=3.3, ours_kernel_ms=2.5, fa3_ms=4.0, fa3_fp8_ms=2.0, cudnn_fp8_ms=2.4),
    dict(op="attention", case="300+129, 56 heads", form=0, ours_ms=1.0, ours_tflops=100.0, pct_ceiling=22.2,
         peer="cuDNN SDPA bf16", peer_ms=1.3, ours_kernel_ms=0.8, fa3_ms=1.5, fa3_fp8_ms=0.9)],
    peers_unavailable={"cudnn_fp8": "300+129: cuDNN FP8 SDPA: segments of one length only"},
    accuracy=dict(tokens=4096, heads=16, head_dim=128, seed=4096, k_offset=4.0, against="exact attention (float64)",
                  rows=[dict(key="ours", form=3, label="ours, form 3 (wgmma)", rel_l2=0.02104, rel_l2_k_offset=0.02151),
                        dict(key="reference", label="h3kernels.reference (FP8)", rel_l2=0.0209, rel_l2_k_offset=0.0214),
                        dict(key="fa3_fp8", label="FA3 FP8", rel_l2=0.0301, rel_l2_k_offset=0.2)]))


def test_the_fp8_peers_table_has_each_peer_present_and_the_ratios_against_the_faster_fp8_kernel():
    text = perf_table().tables(FP8_RUN)
    assert ("| case | form | ours ms | ours kernel ms | cuDNN SDPA bf16 ms | FA3 bf16 ms | FA3 FP8 kernel ms | "
            "cuDNN FP8 kernel ms | ours kernel / best FP8 | ours call / best FP8 |") in text
    # the faster FP8 kernel: FA3's (2.0 ms) over ours' kernel 2.5 ms and call 3.0 ms
    assert "| 4x4096, 56 heads | 3 (wgmma) | 3.000 | 2.500 | 3.300 | 4.000 | 2.000 | 2.400 | 0.80x | 0.67x |" in text
    # cuDNN's FP8 SDPA absent from the ragged set: a blank cell, the ratios against FA3's FP8 kernel
    assert "| 300+129, 56 heads | 0 (mma.sync) | 1.000 | 0.800 | 1.300 | 1.500 | 0.900 |  | 1.12x | 0.90x |" in text
    assert "Missing from some measurements: cuDNN FP8 kernel" in " ".join(text.split())
    assert "not run for these figures" not in text


def test_the_accuracy_table_holds_every_method_measured():
    text = perf_table().tables(FP8_RUN)
    assert "| method | rel L2 | rel L2, K offset |" in text
    assert "| ours, form 3 (wgmma) | 0.0210 | 0.0215 |" in text
    assert "| h3kernels.reference (FP8) | 0.0209 | 0.0214 |" in text and "| FA3 FP8 | 0.0301 | 0.2000 |" in text
    assert "one segment of 4096 tokens, 16 heads of 128" in " ".join(text.split())
    assert text.index("**Attention (") < text.index("**Attention beside the FP8") < text.index("**Attention accuracy")
    # a peer measured nowhere is named under the table
    only_ours = dict(FP8_RUN, peers_unavailable={"cudnn_fp8": "absent"},
                     accuracy=dict(FP8_RUN["accuracy"], rows=FP8_RUN["accuracy"]["rows"][:2]))
    assert "Not measured: cuDNN FP8 kernel" in " ".join(perf_table().tables(only_ours).split())


def test_only_the_peers_present_get_columns():
    pt = perf_table()
    rows = [dict(r) for r in FP8_RUN["rows"]]
    for r in rows:
        r.pop("cudnn_fp8_ms", None)
        r.pop("fa3_fp8_ms")
    text = pt.tables(dict(FP8_RUN, rows=rows, peers_unavailable={"fa3_fp8": "x", "cudnn_fp8": "y"}))
    assert "| case | form | ours ms | ours kernel ms | cuDNN SDPA bf16 ms | FA3 bf16 ms |\n" in text
    assert "| 4x4096, 56 heads | 3 (wgmma) | 3.000 | 2.500 | 3.300 | 4.000 |" in text
    assert "best FP8" not in text and "Not run: FA3 FP8 kernel, cuDNN FP8 kernel" in " ".join(text.split())


def test_without_the_fp8_peers_a_line_says_so():
    pt = perf_table()
    text = pt.tables(RUN)  # attention rows without the peers' fields or an accuracy
    assert "**Attention beside" not in text and "| method |" not in text
    assert " ".join(text.split()).endswith("cuDNN's FP8 SDPA) and the accuracy beside them: not run for these "
                                           "figures.")
    # the accuracy alone, or the peers alone
    assert "FP8 attention peers (" in pt.tables(dict(RUN, accuracy=FP8_RUN["accuracy"]))
    peers_only = pt.tables({k: v for k, v in FP8_RUN.items() if k != "accuracy"})
    assert "**Attention beside" in peers_only and "Accuracy against exact attention: not measured" in peers_only
    failed = pt.tables(dict(RUN, accuracy=dict(error="RuntimeError: out of memory")))
    assert "measurement failed" in failed and "out of memory" not in failed
    # no attention rows and no accuracy: nothing about them
    assert "FP8" not in pt.tables(dict(RUN, rows=RUN["rows"][:1]))


def test_the_peer_fields_are_those_the_bench_writes():
    from h3kernels.peers.fp8_attention import PEERS

    pt = perf_table()
    assert [f for f, _ in pt.FP8_PEERS] == [f"{key}_ms" for key, _, _, _ in PEERS]
    assert [label for _, label in pt.FP8_PEERS] == [label for _, label, _, _ in PEERS]
    assert list(pt.FP8_KERNELS) == [f"{key}_ms" for key, _, _, fp8 in PEERS if fp8]
