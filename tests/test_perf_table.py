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
