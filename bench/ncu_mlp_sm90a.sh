#!/usr/bin/env bash
# Nsight Compute on one FC1 and one FC2 launch of the MLP's wgmma family (fp8_mma_form=3) at
# M = 16384, clocks left alone: tensor-pipe activity, L2 and shared-memory throughput, warp
# stalls. The GEMMs run at 910-1070 TFLOP/s against about 1900 for back-to-back wgmma
# (docs/hopper.md); this says whether the TMA / L2 feed or the issue of the wgmmas limits them.
# Usage on the GPU machine (with the wheels of .whl/ beside the checkout): bash bench/ncu_mlp_sm90a.sh
set -u
source "$(dirname "$0")/device_env.sh" || exit 1
for kernel in h3_mlp_fc1_wgmma h3_mlp_fc2_wgmma; do
  timeout 280 ncu --clock-control none --kernel-name "$kernel" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section Occupancy \
    python3 bench/hopper_mlp.py --check --time 16384 --no-compile 2>&1 | tee "$OUT/ncu_$kernel.txt" \
    | grep -vE "^==PROF==|^\s*$" | tail -70
done
