#!/usr/bin/env bash
# The reliability run on a GPU in one go (lab/device_env.sh installs any wheels placed in .whl/):
# the whole suite, then the hypothesis fuzzing with H3KERNELS_FUZZ_EXAMPLES cases per operator.
# compute-sanitizer runs separately: lab/sanitize.sh. Logs under $OUT.
set -u -o pipefail
source "$(dirname "$0")/device_env.sh" || exit 1
export H3KERNELS_FUZZ_EXAMPLES=${H3KERNELS_FUZZ_EXAMPLES:-200}
timeout ${H3_SUITE_S:-240} python3 -m pytest -q -rsx -o faulthandler_timeout=100 -p no:cacheprovider tests -k "not fuzz" \
  2>&1 | tee "$OUT/pytest.log" | grep -E "passed|failed|FAILED|Error|SKIP" | tail -25
timeout ${H3_FUZZ_S:-300} python3 -m pytest -q -rsx -o faulthandler_timeout=120 -p no:cacheprovider tests/test_fuzz.py \
  --hypothesis-show-statistics 2>&1 | tee "$OUT/fuzz.log" | grep -E "passed|failed|FAILED|Error|passing|failing|Falsifying|runtimes" | tail -25
