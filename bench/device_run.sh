#!/usr/bin/env bash
# One device-tool call: install the carried wheels, run the whole test suite on the GPU, the demo
# and the benchmarks, with logs under $OUT. Usage (device tool): bash bench/device_run.sh [pytest args]
set -u -o pipefail
OUT=${OUT:-/tmp/h3out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 H3KERNELS_CACHE_DIR=/tmp/h3cache
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; \
  python3 -c 'import torch, cupy, numba, numpy; print(torch.__version__, cupy.__version__, numba.__version__, numpy.__version__)'; } 2>&1 | tee "$OUT/env.txt"
timeout 420 python3 -m pytest -q -rs "${@:-tests}" 2>&1 | tee "$OUT/pytest.log" | tail -40
timeout 120 python3 bench/bench_row.py --json "$OUT/bench_row.json" --sass "$OUT/row_kernel.sass" 2>&1 | tee "$OUT/bench_row.log"
timeout 120 python3 -m h3kernels demo 2>&1 | tee "$OUT/demo.log"
timeout 200 python3 bench/debug_row_mismatch.py "$OUT/mismatch.pt" 2>&1 | tee "$OUT/mismatch.log"
