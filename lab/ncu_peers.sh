#!/usr/bin/env bash
# Nsight Compute on our attention kernel, cuDNN's FP8 SDPA and FlashAttention-3's FP8 forward at
# SEGMENTS x LENGTH tokens (lab/peers_once.py; one launch each, clocks left alone), after source
# lab/device_env.sh with the peers' wheels in .whl/. Output: $OUT/ncu_peers.txt (the details
# page), $OUT/ncu_peers_raw.csv (every metric) and, on stdout, the figures the attention's
# decisions table compares: time, warp instructions, issue, pipes and the stalls per instruction.
# Usage: bash lab/ncu_peers.sh [LENGTH 4096] [SEGMENTS 4]
set -u
L=${1:-4096} S=${2:-4}
timeout 300 ncu --clock-control none --nvtx --nvtx-include "ours/" --nvtx-include "cudnn_fp8/" --nvtx-include "fa3_fp8/" \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats \
  --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis \
  -o "$OUT/ncu_peers" -f python3 lab/peers_once.py "$L" "$S" > "$OUT/ncu_peers.log" 2>&1
[ -f "$OUT/ncu_peers.ncu-rep" ] || { echo "ncu failed: $OUT/ncu_peers.log"; exit 1; }
ncu --import "$OUT/ncu_peers.ncu-rep" --page details > "$OUT/ncu_peers.txt" 2>&1
ncu --import "$OUT/ncu_peers.ncu-rep" --page raw --csv > "$OUT/ncu_peers_raw.csv" 2>&1
python3 - "$OUT/ncu_peers_raw.csv" "$L" "$S" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head, data = rows[0], [r for r in rows[2:] if "prepare_varlen" not in r[rows[0].index("Kernel Name")]]
col = {h: i for i, h in enumerate(head)}
scores = int(sys.argv[3]) * int(sys.argv[2]) ** 2 * 56
def show(label, metric, scale=1.0):
    vals = [float(r[col[metric]].replace(",", "")) * scale for r in data]
    print(f"{label:<44}" + "".join(f"{v:>10.2f}" for v in vals))
print(f"{'':<44}" + "".join(f"{r[col['Kernel Name']][:9]:>10}" for r in data))
show("ms", "gpu__time_duration.sum", 1e-6 if "nsecond" in rows[1][col["gpu__time_duration.sum"]] else 1.0)
show("warp instructions per 32 scores", "smsp__inst_executed.sum", 32 / scores)
show("issue slots busy %", "sm__issue_active.avg.pct_of_peak_sustained_elapsed")
for pipe in ("xu", "tensor_op_gmma", "fma", "alu", "uniform"):
    if f"sm__inst_executed_pipe_{pipe}.avg.pct_of_peak_sustained_active" in col:
        show(f"pipe {pipe} %", f"sm__inst_executed_pipe_{pipe}.avg.pct_of_peak_sustained_active")
show("tensor pipe active %", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active")
for h in head:
    if h.startswith("smsp__average_warps_issue_stalled_") and h.endswith("_per_issue_active.ratio"):
        show("stalled per issue: " + h[34:-23], h)
PY
