#!/usr/bin/env bash
# Nsight Compute on one FC1 and one FC2 launch of each named build of bench/mlp_gemm_probe.py
# (random operands, M = 16384, clocks left alone): throughput of the tensor pipe, L2 and shared
# memory, and the warps' stalls, side by side for the default and the CTA-pair (multicast) builds.
# Usage on the GPU machine: bash bench/ncu_mlp_probe.sh default cluster2 ...   Output: $OUT/ncu_mlp_<build>.txt
set -u
source "$(dirname "$0")/device_env.sh" || exit 1
cd "$(dirname "$0")"
for build in "$@"; do
  timeout 200 ncu --clock-control none --kernel-name regex:'h3_mlp_fc[12]_wgmma' --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --metrics lts__t_sectors_srcunit_tex_op_read.sum,lts__t_bytes.sum.per_second \
    python3 mlp_gemm_probe.py --only "$build" --launches 3 > "$OUT/ncu_mlp_$build.txt" 2>&1
  echo "== $build: rc $?"
  grep -E "h3_mlp_fc|Duration|Throughput|gmma|Stall|Issued Warp|No Eligible|lts__t" "$OUT/ncu_mlp_$build.txt" | head -40
done
