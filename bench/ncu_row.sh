#!/usr/bin/env bash
# Nsight Compute on one row-kernel launch at M=16384 (clocks left alone).
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
OUT=${OUT:-/tmp/h3out}
timeout 400 ncu --clock-control none --kernel-name regex:row_kernel --launch-skip 3 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section Occupancy --section SchedulerStats --section MemoryWorkloadAnalysis \
  python3 bench/bench_row.py --rows 16384 2>&1 | tee "$OUT/ncu_row.txt" | grep -vE "^==PROF==|^\s*$" | tail -90
