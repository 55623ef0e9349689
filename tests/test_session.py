"""What a test session leaves behind and what it runs: its kernel cache and the other tools' state
live in a temporary directory removed at the end, unless the user named them (conftest.STATE_DIRS),
and the tests marked slow skip on a machine without a GPU unless pytest is given --runslow.
Each case runs pytest on a small test file, with this directory's conftest.py, in a subprocess."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from conftest import STATE_DIRS

HERE = Path(__file__).resolve().parent
INNER_TESTS = '''
import os

import pytest

from conftest import STATE_DIRS
from h3kernels._runtime import compiler


def test_compiles_into_the_cache():
    d = compiler.cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    (d / "probe.cubin").write_bytes(b"")
    print(f"cache_dir={d}")
    for name in STATE_DIRS:
        print(f"state {name}={os.environ[name]}")


@pytest.mark.slow
def test_slow():
    pass
'''


def run_session(tmp_path, *args, **env):
    """Runs pytest on INNER_TESTS in tmp_path/session with HOME at tmp_path/home and the variables
    `env` (None: unset); returns (its output, the cache directory the inner test saw)."""
    session = tmp_path / "session"
    session.mkdir(exist_ok=True)
    shutil.copy(HERE / "conftest.py", session / "conftest.py")
    (session / "test_inner.py").write_text(INNER_TESTS)
    (session / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    environ.update(HOME=str(tmp_path / "home"), PYTHONPATH=os.pathsep.join(
        filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")])))
    for name, value in env.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *args],
                         cwd=session, env=environ, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout, Path(re.search(r"cache_dir=(\S+)", out.stdout).group(1))


def test_unset_state_dirs_are_a_temporary_directory_removed_at_the_end(tmp_path):
    out, cache = run_session(tmp_path, **dict.fromkeys(STATE_DIRS))
    root = cache.parent
    assert root.parent == Path(tempfile.gettempdir()) and root.name.startswith("h3kernels-tests-"), cache
    assert cache == root / STATE_DIRS["H3KERNELS_CACHE_DIR"]
    assert dict(re.findall(r"^state (\w+)=(\S+)$", out, re.M)) == {
        name: str(root / sub) for name, sub in STATE_DIRS.items()}
    assert not root.exists(), "the session's temporary directory outlived it"
    assert not (tmp_path / "home").exists(), "the session wrote into the home directory"
    slow = "1 passed, 1 skipped" if not torch.cuda.is_available() else "2 passed"
    assert slow in out, out


def test_a_cache_dir_the_user_set_is_kept_and_runslow_runs_the_slow_tests(tmp_path):
    mine = tmp_path / "mine"
    out, cache = run_session(tmp_path, "--runslow", H3KERNELS_CACHE_DIR=str(mine))
    assert cache == mine and (mine / "probe.cubin").is_file()
    assert "2 passed" in out, out
