"""The README's first command: `python -m h3kernels demo`."""
import subprocess
import sys
from pathlib import Path

from conftest import HAS_GPU

REPO = Path(__file__).resolve().parents[1]


def cli(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "h3kernels", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout)


def test_demo_runs_and_says_what_it_did():
    out = cli("demo", *(["--rows", "1000", "--segments", "300", "0", "1000"] if HAS_GPU else []))
    assert out.returncode == 0, out.stdout + out.stderr
    if HAS_GPU:
        assert "0 of 5376000 a_q bytes and 0 of 1000 scales differ" in out.stdout
        assert "attention (minimax_h3_varlen_attention_fp8), segments [300, 0, 1000], 56 heads" in out.stdout
    else:
        assert "No CUDA GPU found" in out.stdout
        assert "attention reference" in out.stdout and "MLP reference" in out.stdout


def test_info_names_the_cache_and_the_device():
    out = cli("info")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "compile cache:" in out.stdout
    assert ("chosen: MLP form" in out.stdout) if HAS_GPU else ("GPU: none found" in out.stdout)


def test_check_passes_on_this_device():
    out = cli("check")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "FAIL" not in out.stdout and out.stdout.count("PASS") == (8 if HAS_GPU else 2)


def test_bench_writes_a_table_and_json(tmp_path):
    import json

    path = tmp_path / "bench.json"
    out = cli("bench", "--rows", "256", "--segments", "300,0,129", "1024,1024", "--json", str(path))
    if not HAS_GPU:
        assert out.returncode == 1 and "No CUDA GPU found" in out.stdout
        return
    assert out.returncode == 0, out.stdout + out.stderr
    rows = json.loads(path.read_text())["rows"]
    assert [r["case"] for r in rows] == ["M=256", "300+0+129, 56 heads", "2x1024, 56 heads"]
    assert all(r["ours_ms"] > 0 and r["peer_ms"] > 0 for r in rows)
    assert "% ceil" in out.stdout and "3/4" in out.stderr
