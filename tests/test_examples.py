"""examples/h3_block.py: one MiniMax-H3 block, eager and compiled; without a GPU it exits 3, as
`python -m h3kernels bench` does."""
import re
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def test_h3_block_example_runs():
    args = [sys.executable, str(ROOT / "examples" / "h3_block.py"), "--segments", "2", "--tokens", "700",
            "--rows", "3", "--reps", "2"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=ROOT)
    if not torch.cuda.is_available():
        assert out.returncode == 3, out.stdout + out.stderr
        assert "needs a CUDA GPU" in out.stderr and "Traceback" not in out.stderr
        return
    assert out.returncode == 0, out.stdout + out.stderr
    assert "eager:" in out.stdout
    rel = float(re.search(r"output vs eager rel L2 (\S+)", out.stdout).group(1))
    assert rel < 1e-2  # inductor may fuse the bf16 torch parts differently; the FP8 ops are the same calls


def test_sequence_parallel_example_runs():
    """examples/sequence_parallel.py under torchrun on up to two GPUs (exit 3 without one): the
    Ulysses attention equals the one-GPU attention bitwise."""
    script = str(ROOT / "examples" / "sequence_parallel.py")
    small = ["--tokens", "4096", "--segments", "2", "--rows", "3", "--reps", "2", "--split", "uneven"]
    if not torch.cuda.is_available():
        out = subprocess.run([sys.executable, script, *small], capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert out.returncode == 3, out.stdout + out.stderr
        assert "needs CUDA GPUs" in out.stderr and "Traceback" not in out.stderr
        return
    n = min(2, torch.cuda.device_count())
    args = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", script, *small]
    out = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "attention vs one GPU on the same q, k, v: bitwise equal" in out.stdout, out.stdout
    assert "communication" in out.stdout
