#!/usr/bin/env bash
# One device-tool call: install the carried wheels (.whl/), run the whole test suite on the GPU,
# then the benchmarks, with logs under $OUT. Every step has its own time limit, and pytest dumps
# every thread's stack if one test runs past 100 s (a hang then costs minutes, not the call).
# Usage (device tool, carry [".whl"]): bash bench/device_run.sh [pytest args]
set -u -o pipefail
source "$(dirname "$0")/device_env.sh" || exit 1
export H3KERNELS_TEST_LOG=$OUT/numerics.jsonl
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; \
  python3 -c 'import torch, cupy, numba, numpy; print(torch.__version__, cupy.__version__, numba.__version__, numpy.__version__)'; } 2>&1 | tee "$OUT/env.txt"
# Attention runs in its own process: a fault there must not poison the MLP tests' CUDA context.
if [ $# -gt 0 ]; then
  timeout 300 python3 -m pytest -q -rs -o faulthandler_timeout=100 -p no:cacheprovider "$@" 2>&1 \
    | tee "$OUT/pytest.log" | grep -v "^  File" | tail -25
else
  timeout 200 python3 -m pytest -q -rs -o faulthandler_timeout=100 -p no:cacheprovider tests -k "not varlen" 2>&1 \
    | tee "$OUT/pytest.log" | grep -v "^  File" | tail -12
  timeout 170 python3 -m pytest -q -rs --maxfail=6 -o faulthandler_timeout=60 -p no:cacheprovider tests -k varlen 2>&1 \
    | tee "$OUT/pytest_attention.log" | grep -v "^  File" | tail -25
fi
timeout 120 python3 bench/debug_row_mismatch.py "$OUT/mismatch.pt" > "$OUT/mismatch.log" 2>&1; tail -2 "$OUT/mismatch.log"
timeout 60 python3 bench/bench_row.py --json "$OUT/bench_row.json" --sass "$OUT/row_kernel.sass" 2>&1 | tee "$OUT/bench_row.log" | tail -3
timeout 150 python3 bench/bench_attention.py --quick --json "$OUT/attention.json" > "$OUT/attention.log" 2>&1; tail -16 "$OUT/attention.log"
timeout 120 python3 bench/bench_mlp.py --rows 16384 --json "$OUT/mlp.json" --compile-budget-s 45 > "$OUT/mlp.log" 2>&1; tail -4 "$OUT/mlp.log"
