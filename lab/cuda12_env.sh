#!/usr/bin/env bash
# Runs the GPU suite with the cuda12 extra's packages on a machine whose Python environment is
# built for CUDA 13 (cupy-cuda13x, cuda-bindings 13, NVRTC 13, torch +cu130), without touching
# that environment: the wheels from lab/cuda12_wheels.sh go into a separate --target
# directory that PYTHONPATH puts first.
#
# Usage: bash lab/cuda12_env.sh PARTS_DIR [TARGET]   (TARGET defaults to /tmp/h3kernels-cuda12)
#   PARTS_DIR holds part-NN and SHA256SUMS from lab/cuda12_wheels.sh, copied over as
#   the machine allows. Joins them, checks the wheels' checksums, installs them with --no-deps --no-index,
#   writes TARGET/env.sh and prints the versions the kernels get. Then:
#   . TARGET/env.sh && python -m pytest -q tests
#
# The CUDA 13 libraries stay installed, and cuda-pathfinder (which CuPy, cuda-bindings and
# numba-cuda all load NVRTC, NVVM, nvJitLink and the runtime through) searches only
# site-packages, CUDA 13's directory first. So TARGET/sitecustomize.py loads the CUDA 12
# libraries at start-up, before torch loads its CUDA 13 NVRTC, and has cuda-pathfinder resolve
# each of them once: its cache then hands the CUDA 12 ones to every later caller. They are
# loaded RTLD_LOCAL so that torch's own symbols still bind to its CUDA 13 libraries.
set -euo pipefail
parts=${1:?usage: lab/cuda12_env.sh PARTS_DIR [TARGET]}
parts=$(cd "$parts" && pwd)  # absolute: the checksums are checked from inside the wheels' directory
target=${2:-/tmp/h3kernels-cuda12}
python=${PYTHON:-python3}

wheels="$target.wheels"
rm -rf "$target" "$wheels"
mkdir -p "$target" "$wheels"
cat "$parts"/part-* | tar -xf - -C "$wheels"
(cd "$wheels" && sha256sum --quiet -c "$parts/SHA256SUMS")
"$python" -m pip install --quiet --no-deps --no-index --target "$target" "$wheels"/*.whl

cat > "$target/sitecustomize.py" <<'EOF'
"""Loads the CUDA 12 libraries of this directory before anything loads CUDA 13's (see
lab/cuda12_env.sh)."""
import ctypes
import glob
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
# Dependencies first: NVRTC opens its builtins library by soname.
_libraries = [
    ("cudart", "nvidia/cuda_runtime/lib/libcudart.so.12"),
    ("nvJitLink", "nvidia/nvjitlink/lib/libnvJitLink.so.12"),
    (None, "nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.12.*"),
    ("nvrtc", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12"),
    ("nvvm", "nvidia/cuda_nvcc/nvvm/lib64/libnvvm.so"),
]
try:
    for _name, _pattern in _libraries:
        _path, = glob.glob(os.path.join(_here, _pattern))
        ctypes.CDLL(_path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    from cuda.pathfinder import load_nvidia_dynamic_lib

    for _name, _pattern in _libraries:
        if _name is not None:
            _loaded = load_nvidia_dynamic_lib(_name)
            if not _loaded.abs_path.startswith(_here):
                raise RuntimeError(f"cuda-pathfinder gives {_loaded.abs_path} for {_name}")
except Exception as error:  # the suite must not run on a mixture without saying so
    print(f"cuda12 sitecustomize: {error!r}", file=sys.stderr)
    raise
EOF

cat > "$target/env.sh" <<EOF
export PYTHONPATH="$target\${PYTHONPATH:+:\$PYTHONPATH}"
EOF

# The versions the kernels get, torch imported first as the tests do.
PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}" "$python" - "$target" <<'EOF'
import importlib.metadata as md
import sys

target = sys.argv[1]
try:
    import torch
    print("torch", torch.__version__, "CUDA", torch.version.cuda)
except ImportError:
    print("torch: not installed")
import cupy
import cuda.bindings
import numba_cuda
from numba.cuda.cudadrv import nvvm

major, minor = cupy.cuda.nvrtc.getVersion()
print("cupy", cupy.__version__, "from", cupy.__file__)
print("NVRTC via cupy", f"{major}.{minor}")
print("numba-cuda", md.version("numba-cuda"), "from", numba_cuda.__file__)
print("NVVM via numba-cuda", nvvm.NVVM().get_version())
print("cuda-bindings", md.version("cuda-bindings"), "from", cuda.bindings.__file__)
print("cuda-core", md.version("cuda-core"), "cuda-pathfinder", md.version("cuda-pathfinder"))
try:
    print("CUDA runtime via cupy", cupy.cuda.runtime.runtimeGetVersion(),
          "driver", cupy.cuda.runtime.driverGetVersion())
except Exception as error:  # no GPU or driver here
    print("CUDA runtime via cupy: unavailable:", error)
with open("/proc/self/maps") as maps:
    loaded = sorted({line.split()[-1] for line in maps
                     if any(k in line for k in ("libnvrtc", "libnvvm", "libcudart", "libnvJitLink"))})
print("loaded:", *loaded, sep="\n  ")
problems = [what for what, ok in [
    ("cupy is not cupy-cuda12x from the target", cupy.__file__.startswith(target)
     and md.version("cupy-cuda12x") == cupy.__version__),
    ("cupy's NVRTC is not 12.x", major == 12),
    ("cuda-bindings is not 12.x from the target", cuda.bindings.__file__.startswith(target)
     and md.version("cuda-bindings").startswith("12.")),
]if not ok]
if problems:
    sys.exit("NOT the cuda12 combination: " + "; ".join(problems))
print("cuda12 combination in", target)
EOF
