#!/usr/bin/env bash
# Downloads the wheels that the cuda12 extra puts under the kernels (CuPy, cuda-bindings, NVRTC,
# NVVM, the runtime, nvJitLink, CCCL headers) for CPython 3.12 on manylinux x86_64, and cuts them
# into parts small enough to copy one by one to a GPU machine without network access. There,
# lab/cuda12_env.sh joins the parts and installs the wheels beside the machine's CUDA 13
# environment. torch stays the machine's own: the cuda12 extra's torch (2.8-2.10, built for CUDA
# 12.8) and the CUDA 12 libraries it pulls in are several GB.
#
# Usage: bash lab/cuda12_wheels.sh [DIR] [PART_MIB]   (DIR defaults to .whl12, PART_MIB to 60)
# Leaves DIR/part-NN (copy them to the GPU machine in as many transfers as its limits need) and DIR/SHA256SUMS (the
# wheels' checksums, copied with the first part); the downloaded wheels stay in DIR/wheels.
set -euo pipefail
dir=${1:-.whl12}
part_mib=${2:-60}

# The versions pip resolves for ".[cuda12]" (python -m pip install --dry-run --report).
wheels=(
    cupy-cuda12x==14.2.0
    cuda-bindings==12.9.4
    cuda-core==1.2.2
    cuda-pathfinder==1.9.1
    nvidia-cuda-nvrtc-cu12==12.8.93
    nvidia-cuda-runtime-cu12==12.8.90
    nvidia-cuda-nvcc-cu12==12.8.93
    nvidia-cuda-cccl-cu12==12.8.90
    nvidia-nvjitlink-cu12==12.8.93
)

mkdir -p "$dir/wheels"
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$dir/wheels" \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux2010_x86_64 --platform manylinux_2_12_x86_64 --platform any \
    "${wheels[@]}"

count=$(ls "$dir/wheels"/*.whl | wc -l)
[ "$count" -eq "${#wheels[@]}" ] || { echo "expected ${#wheels[@]} wheels, found $count" >&2; exit 1; }
(cd "$dir/wheels" && sha256sum -- *.whl) > "$dir/SHA256SUMS"
rm -f "$dir"/part-*
tar -cf - -C "$dir/wheels" . | split -b "${part_mib}M" -d -a 2 - "$dir/part-"

ls -l "$dir/wheels"
parts=("$dir"/part-*)
echo "$(du -cb "$dir/wheels"/*.whl | tail -1 | cut -f1) bytes of wheels in ${#parts[@]} parts of" \
     "at most $part_mib MiB: copy $dir/part-00 with $dir/SHA256SUMS, then the other parts"
