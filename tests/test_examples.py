"""examples/h3_block.py: one MiniMax-H3 block, eager and compiled; without a GPU it exits 3, as
`python -m h3kernels bench` does. examples/sequence_parallel.py: the H3 block over GPUs under
torchrun, or without a GPU its CPU reference path over gloo; its exit statuses."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
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


SP_SCRIPT = str(ROOT / "examples" / "sequence_parallel.py")


def torchrun(n, *args, timeout):
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", SP_SCRIPT, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_sequence_parallel_example_runs():
    """examples/sequence_parallel.py under torchrun on up to two GPUs: the Ulysses attention
    equals the one-GPU attention bitwise."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the CPU reference path is tested below)")
    small = ["--tokens", "4096", "--segments", "2", "--rows", "3", "--reps", "2", "--split", "uneven"]
    out = torchrun(min(2, torch.cuda.device_count()), *small, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "attention vs one GPU on the same q, k, v: bitwise equal" in out.stdout, out.stdout
    assert "communication" in out.stdout


def test_sequence_parallel_example_cpu_reference_path_under_torchrun():
    """Two processes over gloo with the reference attention (--device cpu, which a machine without
    CUDA picks by itself): Ulysses bitwise, ring within 0.03 of one process, no warning, exit 0."""
    out = torchrun(2, "--device", "cpu", "--tokens", "100", timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "CPU reference path: gloo, 2 processes" in out.stdout, out.stdout
    assert "ulysses vs one process: out and lse bitwise equal" in out.stdout, out.stdout
    rel = float(re.search(r"ring vs one process: rel L2 (\S+)", out.stdout).group(1))
    assert 0 < rel <= 0.03  # a segment crosses the ranks' boundary: the ring has work to merge
    assert "Warning" not in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_sequence_parallel_example_statuses():
    """Without torchrun it is a group of one; --device cuda without a GPU exits 3 with a message;
    bad arguments exit 2; under torchrun any rank's failure becomes torchrun's own status 1, with
    each rank's exitcode in its report (as docs/parallel.md says)."""
    if torch.cuda.is_available():
        pytest.skip("the no-GPU statuses")
    one = subprocess.run([sys.executable, SP_SCRIPT, "--tokens", "50", "--mode", "ulysses"], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert one.returncode == 0 and "gloo, 1 process," in one.stdout, one.stdout + one.stderr
    for args, status, says in ((["--device", "cuda"], 3, "needs one CUDA GPU per rank"),
                               (["--tokens", "0"], 2, "argument --tokens: got 0; need an int >= 1")):
        out = subprocess.run([sys.executable, SP_SCRIPT, *args], capture_output=True, text=True, timeout=300,
                             cwd=ROOT)
        assert out.returncode == status, out.stdout + out.stderr
        assert says in out.stderr and "Traceback" not in out.stderr, out.stderr
    out = torchrun(2, "--device", "cuda", timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    # each rank that failed reports 3; one that torchrun stopped first, once another had failed, -15
    codes = re.findall(r"exitcode\s*:\s*(-?\d+)", out.stderr)
    assert "3" in codes and set(codes) <= {"3", "-15"}, out.stderr
