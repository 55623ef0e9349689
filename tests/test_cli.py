"""The README's first command: `python -m h3kernels demo`."""
import subprocess
import sys
from pathlib import Path

from conftest import HAS_GPU

REPO = Path(__file__).resolve().parents[1]


def test_demo_runs_and_says_what_it_did():
    args = [sys.executable, "-m", "h3kernels", "demo"] + (["--rows", "1000", "--segments", "300", "0", "1000"]
                                                          if HAS_GPU else [])
    out = subprocess.run(args, capture_output=True, text=True, cwd=REPO, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    if HAS_GPU:
        assert "0 of 5376000 a_q bytes and 0 of 1000 scales differ" in out.stdout
        assert "attention (minimax_h3_varlen_attention_fp8), segments [300, 0, 1000], 56 heads" in out.stdout
    else:
        assert "No CUDA GPU found" in out.stdout
        assert "attention reference" in out.stdout and "MLP reference" in out.stdout
