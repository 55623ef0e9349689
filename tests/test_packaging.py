"""Packaging: setup.cfg names every subpackage and every kernel source, a non-editable install
built from the repository's files (as a clean clone has them) finds its CUDA sources, and CI's
check on pip's output finds the releases pip downloaded and dropped."""
import configparser
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from fnmatch import fnmatch
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES_PACKAGE = "h3kernels.cuda_src"
FIGURES_PACKAGE = "h3kernels.figures"  # docs/perf_h200.json, installed beside the modules


def _options():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return cfg


def _listed(value):
    return [line.strip() for line in value.splitlines() if line.strip()]


def _source_patterns():
    return [p.strip() for p in _options()["options.package_data"][SOURCES_PACKAGE].split(",")]


def _python_packages():
    """Every directory of h3kernels/ that holds Python modules, as a dotted name."""
    found = set()
    for module in (REPO / "h3kernels").rglob("*.py"):
        rel = module.parent.relative_to(REPO)
        if "__pycache__" not in rel.parts:
            found.add(".".join(rel.parts))
    return found


def test_packages_lists_every_subpackage():
    listed = set(_listed(_options()["options"]["packages"]))
    on_disk = _python_packages()
    assert on_disk - listed == set(), "subpackages missing from setup.cfg's packages ="
    assert listed - on_disk - {SOURCES_PACKAGE, FIGURES_PACKAGE} == set(), "setup.cfg lists packages that do not exist"
    for name in on_disk:
        assert (REPO / name.replace(".", "/") / "__init__.py").is_file(), f"{name} has no __init__.py"


def test_package_data_covers_every_kernel_source():
    package_dir = dict((part.strip() for part in line.split("="))
                       for line in _listed(_options()["options"]["package_dir"]))
    source_dir = REPO / package_dir[SOURCES_PACKAGE]
    patterns = _source_patterns()
    files = [p.name for p in source_dir.iterdir() if p.is_file()]
    assert any(name.endswith(".cu") for name in files)
    unshipped = [name for name in files if not any(fnmatch(name, pat) for pat in patterns)]
    assert unshipped == [], f"cuda_src files that package_data leaves out of the wheel: {unshipped}"
    # Data files elsewhere in the package would need their own package_data entry.
    stray = [str(p.relative_to(REPO)) for p in (REPO / "h3kernels").rglob("*")
             if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert stray == [], f"non-Python files in h3kernels/ that no package_data entry ships: {stray}"


def _repository_files():
    """The files a clean clone has: tracked plus untracked-but-not-ignored (None without git)."""
    if shutil.which("git") is None:
        return None
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], capture_output=True, text=True)
    if out.returncode:
        return None
    return [name for name in out.stdout.split("\0") if name and (REPO / name).is_file()]


def _can_build_without_network():
    """setuptools builds the wheel from this interpreter: no download of build requirements."""
    if importlib.util.find_spec("setuptools") is None:
        return False
    import setuptools
    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    # setuptools 70.1 carries bdist_wheel; older ones need the wheel package.
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory):
    """h3kernels built as a wheel from a copy of the repository's files and installed with
    --target into an empty directory: what pip install . gives, without touching the checkout."""
    files = _repository_files()
    if files is None:
        pytest.skip("needs git to list the repository's files")
    if not _can_build_without_network():
        pytest.skip("needs setuptools >= 70.1, which the test extra installs (or setuptools with wheel), "
                    "to build offline")
    base = tmp_path_factory.mktemp("packaging")
    clone = base / "clone"
    for name in files:
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, clone / name)
    pip = [sys.executable, "-m", "pip"]
    quiet = dict(capture_output=True, text=True, env={**os.environ, "PIP_NO_INDEX": "1"})
    out = subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(base / "dist"),
                                str(clone)], **quiet)
    assert out.returncode == 0, out.stdout + out.stderr
    wheel, = (base / "dist").glob("h3kernels-*.whl")
    site = base / "site"
    out = subprocess.run(pip + ["install", "--no-deps", "--target", str(site), str(wheel)], **quiet)
    assert out.returncode == 0, out.stdout + out.stderr
    return wheel, site


def test_wheel_holds_every_module_and_kernel_source(installed_wheel):
    wheel, _ = installed_wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {str(p.relative_to(REPO)) for p in (REPO / "h3kernels").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert modules - names == set(), "modules missing from the wheel"
    patterns = _source_patterns()
    sources = {f"h3kernels/cuda_src/{p.name}" for p in (REPO / "cuda_src").iterdir()
               if any(fnmatch(p.name, pat) for pat in patterns)}
    assert sources - names == set(), "kernel sources missing from the wheel"


def test_installed_package_finds_its_sources(installed_wheel, tmp_path):
    _, site = installed_wheel
    probe = ("import json, h3kernels, h3kernels._runtime.compiler as c; "
             "print(json.dumps([h3kernels.__file__, str(c.source_dir()), c.sources()]))")
    env = {**os.environ, "PYTHONPATH": str(site)}
    # Run away from the checkout, so that only the installed copy can be imported.
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    init, src, names = json.loads(out.stdout)
    pkg = Path(init).parent
    assert pkg == site / "h3kernels"
    assert Path(src) == pkg / "cuda_src"
    stems = {p.stem for p in (REPO / "cuda_src").glob("*.cu")}
    assert set(names) == stems
    for header in (REPO / "cuda_src").glob("*.cuh"):
        assert (pkg / "cuda_src" / header.name).is_file()


def test_installed_package_finds_the_recorded_figures(installed_wheel, tmp_path):
    _, site = installed_wheel
    probe = "from h3kernels.cli.bench import recorded_figures; print(recorded_figures()['device'])"
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)},
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == json.loads((REPO / "docs" / "perf_h200.json").read_text())["device"]


def test_cli_info_runs():
    out = subprocess.run([sys.executable, "-m", "h3kernels", "info"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "compile cache:" in out.stdout


def _pip_refetches():
    spec = importlib.util.spec_from_file_location("pip_refetches", REPO / ".ci" / "pip_refetches.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.refetches


def test_ci_finds_releases_pip_downloaded_and_dropped():
    """.ci/run's check on pip's output, on the lines pip printed when the cuda12 extra did not yet
    cap cuda-bindings and nvjitlink."""
    log = """\
Collecting cuda-bindings<14.0.0,>=12.9.1 (from numba-cuda[cu12]>=0.30->h3kernels==0.1.0)
  Downloading cuda_bindings-13.5.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl (8.4 MB)
Collecting cuda-bindings<14.0.0,>=12.9.1 (from numba-cuda[cu12]>=0.30->h3kernels==0.1.0)
  Using cached cuda_bindings-12.9.4-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl (12.2 MB)
Processing /wheels/torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl (from h3kernels==0.1.0)
Collecting torch>=2.8 (from h3kernels==0.1.0)
  Downloading torch-2.10.0-3-cp311-cp311-manylinux_2_28_x86_64.whl (915.5 MB)
Collecting nvidia-nvjitlink-cu12==12.8.* (from h3kernels==0.1.0)
  Downloading nvidia_nvjitlink_cu12-12.8.93-py3-none-manylinux2010_x86_64.whl.metadata (1.7 kB)
  Downloading nvidia_nvjitlink_cu12-12.8.93-py3-none-manylinux2010_x86_64.whl (39.3 MB)
Collecting python-dateutil>=2.7 (from matplotlib->h3kernels==0.1.0)
  Downloading https://example.org/python-dateutil-2.9.0.tar.gz (342 kB)
  Downloading https://example.org/python_dateutil-2.9.0-py2.py3-none-any.whl (229 kB)
""".splitlines()
    # a wheel read from a local directory costs no download; a wheel's metadata and an sdist and a
    # wheel of one version are one release
    assert _pip_refetches()(log) == {"cuda-bindings": ["13.5.0", "12.9.4"]}
