"""Every notebook runs top to bottom: with nbclient and an IPython kernel where they are installed
(CI installs them with the test extra), else as a script of its code cells (IPython magics
dropped), as on the GPU machine, whose image has no Jupyter. On the GPU at the notebooks' sizes,
without one on the CPU reference."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXPECT = {"01_quickstart": ["reference vs float64 softmax: rel L2"],
          "02_accuracy": ["y: every element within its bound: True", "out: every element within its bound: True"],
          "03_performance": ["attention ", "ridge point, mma.sync:", "MLP form 3", "attention form 3",
                             "FP8 attention peers", "accuracy against exact attention"]}
RUNS = [(p, p.parent) for p in NOTEBOOKS] + [(p, ROOT) for p in NOTEBOOKS if p.stem == "03_performance"]
# On the CPU these two build MiniMax-H3-sized weights and take the reference's exact sums: about
# a minute each on two cores.
SLOW_ON_CPU = {"01_quickstart", "02_accuracy"}


def has_jupyter():
    try:
        import ipykernel  # noqa: F401
        import nbclient  # noqa: F401
        import nbformat  # noqa: F401
    except ImportError:
        return False
    return True


def test_the_three_notebooks_exist():
    assert [p.stem for p in NOTEBOOKS] == ["01_quickstart", "02_accuracy", "03_performance"]


def absolute_pythonpath(monkeypatch):
    """The kernel or script runs in another directory: a relative PYTHONPATH entry would point
    elsewhere, and it must import the h3kernels under test (this checkout's), as pytest does."""
    entries = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), *entries]))


@pytest.mark.parametrize("path,cwd", [pytest.param(p, d, marks=[pytest.mark.slow] if p.stem in SLOW_ON_CPU else [],
                                                   id=f"{p.stem} in {d.relative_to(ROOT) or '.'}") for p, d in RUNS])
def test_notebook_runs(path, cwd, monkeypatch):
    absolute_pythonpath(monkeypatch)
    if has_jupyter():
        import nbformat
        from nbclient import NotebookClient

        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=900, kernel_name="python3",
                       resources={"metadata": {"path": str(cwd)}}).execute()
        out = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                      if o.output_type == "stream")
    else:
        import json

        cells = json.loads(path.read_text())["cells"]
        code = "\n\n".join("".join(line for line in (c["source"] if isinstance(c["source"], list)
                                                      else c["source"].splitlines(True))
                                   if not line.lstrip().startswith("%"))
                           for c in cells if c["cell_type"] == "code")
        res = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                             timeout=900, env={**os.environ, "MPLBACKEND": "Agg"})
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        out = res.stdout
    assert all(line in out for line in EXPECT[path.stem]), out[-2000:]
