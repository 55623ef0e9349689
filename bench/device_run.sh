#!/usr/bin/env bash
# One device-tool call: install the carried wheels, run the whole test suite on the GPU, the demo
# and the benchmarks, with logs under $OUT. Usage (device tool): bash bench/device_run.sh [pytest args]
set -u -o pipefail
source "$(dirname "$0")/device_env.sh" || exit 1
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; \
  python3 -c 'import torch, cupy, numba, numpy; print(torch.__version__, cupy.__version__, numba.__version__, numpy.__version__)'; } 2>&1 | tee "$OUT/env.txt"
timeout 420 python3 -m pytest -q -rs -o faulthandler_timeout=120 "${@:-tests}" 2>&1 | tee "$OUT/pytest.log" | tail -40
timeout 120 python3 bench/bench_row.py --json "$OUT/bench_row.json" --sass "$OUT/row_kernel.sass" 2>&1 | tee "$OUT/bench_row.log"
timeout 120 python3 -m h3kernels demo 2>&1 | tee "$OUT/demo.log"
timeout 200 python3 bench/debug_row_mismatch.py "$OUT/mismatch.pt" 2>&1 | tee "$OUT/mismatch.log"
