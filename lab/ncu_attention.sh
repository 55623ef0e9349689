#!/usr/bin/env bash
# Nsight Compute on the attention kernel (the third call) for each segment set named, after
# source lab/device_env.sh (clocks left alone). Output: $OUT/ncu_attention.txt, and per set the
# report ($OUT/ncu_<set>.ncu-rep, the run's output in ncu_<set>.log) and its SASS with each
# instruction's stall samples ($OUT/ncu_<set>_sass.csv, summed by lab/ncu_stalls.py).
# Usage: bash lab/ncu_attention.sh 4x4096 1x16384
# H3_NCU_KERNELS='regex:kv_block|k_quant|v_quant|q_kernel' H3_NCU_COUNT=4 profiles the quantization
# passes instead (Numba names its kernels after the Python functions).
set -u
for set in "$@"; do
  echo "=== $set" >> "$OUT/ncu_attention.txt"
  rm -f "$OUT/ncu_$set.ncu-rep"  # a failed run must not leave an older report to read below
  timeout 150 ncu --clock-control none --kernel-name "${H3_NCU_KERNELS:-regex:h3_varlen_attention}" \
    --launch-skip "${H3_NCU_SKIP:-2}" --launch-count "${H3_NCU_COUNT:-1}" \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    --section Occupancy --section LaunchStats --section SourceCounters --section InstructionStats \
    -o "$OUT/ncu_$set" -f python3 lab/attention_once.py "$set" 3 > "$OUT/ncu_$set.log" 2>&1
  [ -f "$OUT/ncu_$set.ncu-rep" ] || { echo "ncu failed on $set: $OUT/ncu_$set.log" | tee -a "$OUT/ncu_attention.txt"; continue; }
  ncu --import "$OUT/ncu_$set.ncu-rep" --page details 2>&1 | grep -vE "^==PROF==|^\s*$" >> "$OUT/ncu_attention.txt"
  ncu --import "$OUT/ncu_$set.ncu-rep" --page source --print-source sass --csv > "$OUT/ncu_${set}_sass.csv" 2>&1
done
grep -E "^===|Context [0-9]|Memory Throughput|Registers Per|Achieved Occupancy|Duration|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|L2 Hit Rate|DRAM Throughput|Stall" \
  "$OUT/ncu_attention.txt" | head -60
