"""Every Numba kernel compiles for real (sm_90 and sm_120 PTX), not only in the CUDA simulator."""
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_numba_kernels_compile_to_ptx_outside_the_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, str(HERE / "numba_ptx_check.py")], capture_output=True, text=True,
                         env=env, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]
    assert out.stdout.count(": ok") == 6, out.stdout
