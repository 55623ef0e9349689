#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck) over both operators at three sizes each,
# ragged segment lists included. Logs under $OUT/sanitize/, one line per run on
# stdout. Usage on a GPU machine, from the repository root: bash lab/sanitize.sh [tools]
# H3_SANITIZE_FORM: fp8_mma_form of both operators (default -1; 3: the wgmma families on sm_90a);
# H3_SANITIZE_SIZES: which of the three sizes (default "0 1 2"); H3_SANITIZE_OPS=mlp: the MLP alone.
# The MLP sizes cover form 3 on 132 SMs: FC2 split at M = 1 and 129 and FC1 at 400, FC1 in 224-column tiles at 1 and 129 and FC2 at 400; the attention
# sizes 0 and 1 its one-read K and V passes (segments of at most 256 keys), size 2 the four others;
# size 3 (H3_SANITIZE_SIZES="3") 512 work tiles of the Hopper kernel, about four a CTA: every slot and
# ring stage of its shared memory reused.
set -u -o pipefail
source "$(dirname "$0")/device_env.sh" || exit 1
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
LOG=$OUT/sanitize; mkdir -p "$LOG"
TOOLS=${1:-memcheck synccheck racecheck}
SIZES=("--mlp 1 --attn 1 --heads 1" "--mlp 129 --attn 0,127,129,0,256,200 --heads 8" "--mlp 400 --attn 4096,1,700 --heads 4"
       "--mlp 1 --attn $(printf '256,%.0s' {1..63})256 --heads 4")
[ "${H3_SANITIZE_OPS:-}" = mlp ] && SIZES=("--mlp 1" "--mlp 129" "--mlp 400")
FORM=${H3_SANITIZE_FORM:--1}
python3 lab/sanitize_ops.py --mlp 1 --attn 1 --heads 1 --form $FORM > "$LOG/warmup.log" 2>&1  # fills the kernel cache
for tool in $TOOLS; do
  for i in ${H3_SANITIZE_SIZES:-0 1 2}; do
    f=$LOG/$tool-$i.log
    start=$(date +%s)
    timeout ${H3_SANITIZE_S:-120} compute-sanitizer --tool "$tool" --error-exitcode 9 --print-limit 20 --report-api-errors no \
      python3 lab/sanitize_ops.py ${SIZES[$i]} --form $FORM > "$f" 2>&1
    rc=$?
    echo "$tool [${SIZES[$i]}]: rc=$rc, $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$f" | tail -1), ran: $(grep -c ': ok$' "$f") of 2 operators, $(( $(date +%s) - start )) s"
  done
done
