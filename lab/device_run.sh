#!/usr/bin/env bash
# One GPU run from the repository root: the whole test suite on the GPU, then the benchmarks of
# bench/, with logs under $OUT (lab/device_env.sh installs any wheels placed in .whl/ first). Every step has its own time limit, and pytest dumps
# every thread's stack if one test runs past 100 s (a hang then costs minutes, not the call).
# Logs stay plain files; the benchmarks' JSON results are packed into $OUT/results.tgz.
# Usage: bash lab/device_run.sh [pytest args]
# H3_RUN_BENCH="row attention mlp" picks the benchmarks (default: all three; "none": none).
# H3_PYTEST_S and H3_PYTEST_ATTN_S: time limits of the two pytest runs (400 s, 120 s; on the H200
# the attention tests took 36 s, and the rest took 182 s before the wgmma family's tests and more
# than 250 s after).
set -u -o pipefail
source "$(dirname "$0")/device_env.sh" || exit 1
RES=/tmp/h3results; mkdir -p "$RES"
export H3KERNELS_TEST_LOG=$RES/numerics.jsonl
BENCH=${H3_RUN_BENCH:-row attention mlp}
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; \
  python3 -c 'import torch, cupy, numba, numpy; print(torch.__version__, cupy.__version__, numba.__version__, numpy.__version__)'; } 2>&1 | tee "$OUT/env.txt"
# Attention runs in its own process: a fault there must not poison the MLP tests' CUDA context.
if [ $# -gt 0 ]; then
  timeout 300 python3 -m pytest -q -rsx -o faulthandler_timeout=100 -p no:cacheprovider "$@" 2>&1 \
    | tee "$OUT/pytest.log" | grep -E "passed|failed|FAILED|Error" | tail -25
else
  timeout ${H3_PYTEST_S:-400} python3 -m pytest -q -rsx -o faulthandler_timeout=100 -p no:cacheprovider tests -k "not varlen" 2>&1 \
    | tee "$OUT/pytest.log" | grep -E "passed|failed|FAILED|Error" | tail -12
  timeout ${H3_PYTEST_ATTN_S:-120} python3 -m pytest -q -rsx --maxfail=6 -o faulthandler_timeout=60 -p no:cacheprovider tests -k varlen 2>&1 \
    | tee "$OUT/pytest_attention.log" | grep -E "passed|failed|FAILED|XFAIL|Error" | tail -25
fi
case " $BENCH " in *" row "*)
  timeout 60 python3 bench/bench_row.py --json "$RES/bench_row.json" 2>&1 | tee "$OUT/bench_row.log" | tail -3 ;; esac
case " $BENCH " in *" attention "*)
  timeout ${H3_ATTN_BENCH_S:-200} python3 bench/bench_attention.py ${H3_ATTN_BENCH_ARGS:---quick} --json "$RES/attention.json" \
    > "$OUT/attention.log" 2>&1; tail -16 "$OUT/attention.log" ;; esac
case " $BENCH " in *" mlp "*)
  timeout 120 python3 bench/bench_mlp.py --rows 16384 --json "$RES/mlp.json" --compile-budget-s 45 > "$OUT/mlp.log" 2>&1
  tail -4 "$OUT/mlp.log" ;; esac
tar czf "$OUT/results.tgz" -C "$RES" . 2>/dev/null
