#!/usr/bin/env bash
# Nsight Compute on one row-kernel launch at M=16384 (clocks left alone), from the repository root.
set -u
source "$(dirname "$0")/device_env.sh" || exit 1
timeout 400 ncu --clock-control none --kernel-name regex:row_kernel --launch-skip 3 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section Occupancy --section SchedulerStats --section MemoryWorkloadAnalysis \
  python3 bench/bench_row.py --rows 16384 2>&1 | tee "$OUT/ncu_row.txt" | grep -vE "^==PROF==|^\s*$" | tail -90
