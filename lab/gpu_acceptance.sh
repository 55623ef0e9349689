#!/usr/bin/env bash
# The GPU checks of a change to the shipped kernels, in steps of a few minutes each on one
# H100/H200, logs under $OUT (default /tmp/h3out):
#   bash lab/gpu_acceptance.sh ab      SASS of the shipped builds and the operators' speed against
#                                     the code before the change (a copy of that checkout in
#                                     .before/), in alternating processes
#   bash lab/gpu_acceptance.sh tests [1|2|3]   the GPU test suite in three parts (one per call:
#                                     a cold H200 takes about 8 minutes for all three)
#   bash lab/gpu_acceptance.sh bench   python -m h3kernels bench --json, the check and info (with the FP8
#                                     attention peers when their wheels are in .whl/)
#   bash lab/gpu_acceptance.sh host    bench/host_time.py: host time per call, the GPU busy
#   bash lab/gpu_acceptance.sh ring    the ring's GPU tests (virtual ranks, the partial with given K
#                                     scales, the statistics passes), examples/sequence_parallel.py
#                                     on one GPU at 1 x 16384 (ring, Ulysses), lab/ring_step_cost.py
#   bash lab/gpu_acceptance.sh pytest ARGS...   pytest with these arguments (a part of the suite)
# H3_AB_ROUNDS: rounds of the speed comparison (2); H3_AB_SASS=0 leaves the SASS out; H3_AB_ONLY=mlp
# (or attention) times one operator; H3_AB_MLP_ROWS="M ..." the MLP's row counts.
# lab/device_env.sh installs wheels placed in .whl/ (a numpy that numba-cuda supports, on a
# machine whose own is newer) into /tmp/site; each side below has its own path and cache.
set -u -o pipefail
cd "$(dirname "$0")/.."
source lab/device_env.sh
SITE=$([ -d /tmp/site ] && echo /tmp/site)
new() { PYTHONPATH=$PWD${SITE:+:$SITE} H3KERNELS_CACHE_DIR=/tmp/h3cache_new "$@"; }
old() { (cd .before && PYTHONPATH=$PWD${SITE:+:$SITE} H3KERNELS_CACHE_DIR=/tmp/h3cache_old "$@"); }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv
  new python3 -c 'import torch, cupy, numba, numpy; print(torch.__version__, cupy.__version__, numba.__version__, numpy.__version__)'; } 2>&1 | tee -a "$OUT/env.txt"
case "${1:-}" in
ab)
  if [ "${H3_AB_SASS:-1}" = 1 ]; then
  for spec in "attention default|varlen_attention_fp8_sm90a|L.defines()|B.AttentionBuild().defines()" \
              "attention lse|varlen_attention_fp8_sm90a|L.defines(EXACT_L=1)|B.AttentionBuild(lse=True).defines()" \
              "mlp|mlp_fp8_sm90a|L.defines()|B.MlpBuild().defines()"; do
    IFS='|' read -r what src before after <<<"$spec"
    echo "== SASS: $what"
    new python3 lab/sass_diff.py --before ".before:(\"$src\",\"sm_90a\",$before)" --setup-before "from h3kernels._launch import $src as L" \
      --after ".:(\"$src\",\"sm_90a\",$after)" --setup-after "from h3kernels._launch import $src as B" 2>&1 | tee -a "$OUT/sass.txt"
  done
  fi
  for round in $(seq "${H3_AB_ROUNDS:-2}"); do
    old timeout 150 python3 "$PWD/lab/ab_time.py" --label before --json "$OUT/ab.jsonl" ${H3_AB_ONLY:+--only $H3_AB_ONLY} \
      ${H3_AB_MLP_ROWS:+--mlp-rows $H3_AB_MLP_ROWS} 2>&1 | tail -1
    new timeout 150 python3 lab/ab_time.py --label after --json "$OUT/ab.jsonl" ${H3_AB_ONLY:+--only $H3_AB_ONLY} \
      ${H3_AB_MLP_ROWS:+--mlp-rows $H3_AB_MLP_ROWS} 2>&1 | tail -1
  done
  new python3 - "$OUT/ab.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = [k for k in rows[0] if k not in ("label", "package", "seconds")]
print(f"{'case':<26}{'before ms':>11}{'after ms':>11}{'after/before':>14}")
for k in keys:  # rows of an earlier run may lack a case (H3_AB_ONLY)
    b = statistics.median(r[k] for r in rows if r["label"] == "before" and k in r)
    a = statistics.median(r[k] for r in rows if r["label"] == "after" and k in r)
    print(f"{k:<26}{b:>11.3f}{a:>11.3f}{a / b:>14.3f}")
PY
  ;;
tests)
  # the suite in three parts of a few minutes each on a cold machine (compiles included); one call
  # runs part $2 (1, 2 or 3), or all three when none is named
  parts=("tests/test_[a-l]*.py -k 'not varlen'" "tests/test_[m-z]*.py -k 'not varlen'" "tests -k varlen")
  for i in ${2:-1 2 3}; do
    eval new timeout 400 python3 -m pytest -q -rsx -o faulthandler_timeout=100 -p no:cacheprovider "${parts[$((i - 1))]}" \
      2>&1 | tee "$OUT/pytest_part$i.log" | grep -E "passed|failed|FAILED|Error" | tail -15
  done
  ;;
host)
  new timeout 300 python3 bench/host_time.py --json "$OUT/host_time.json" 2>&1 | tee "$OUT/host_time.log" | tail -12
  ;;
ring)
  new timeout 200 python3 -m pytest -q -rsx -s -p no:cacheprovider tests/test_parallel.py tests/test_varlen_attention_fp8.py \
    -k "virtual_ring_on_the_gpu or virtual_ring_without or kernel_partial or ring_statistics" 2>&1 | tee "$OUT/ring_tests.log" \
    | grep -E "from one call|passed|failed|FAILED|Error" | tail -15
  for mode in ring ulysses; do
    new timeout 120 torchrun --nproc_per_node=1 examples/sequence_parallel.py --tokens 16384 --mode $mode --reps 5 2>&1 \
      | tee "$OUT/sp_$mode.log" | tail -5
  done
  new timeout 150 python3 lab/ring_step_cost.py --json "$OUT/ring_step_cost.json" 2>&1 | tail -9
  ;;
pytest)
  shift
  new timeout 540 python3 -m pytest -q -rsx -o faulthandler_timeout=100 -p no:cacheprovider "$@" 2>&1 \
    | tee -a "$OUT/pytest_part.log" | grep -E "passed|failed|FAILED|Error" | tail -25
  ;;
bench)
  new timeout 300 python3 -m h3kernels bench --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1; tail -20 "$OUT/bench.log"
  new timeout 150 python3 -m h3kernels check --gpu --json "$OUT/check.json" > "$OUT/check.log" 2>&1; tail -8 "$OUT/check.log"
  new timeout 100 python3 -m h3kernels info --json "$OUT/info.json" 2>&1 | tail -4
  ;;
*) echo "usage: bash lab/gpu_acceptance.sh ab|tests [PART]|bench|host|ring|pytest ARGS..." >&2; exit 2 ;;
esac
