# Source this on the device machine: installs the carried wheels (.whl/) and sets the paths.
#   source bench/device_env.sh; python3 -m pytest ...
OUT=${OUT:-/tmp/h3out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 H3KERNELS_CACHE_DIR=/tmp/h3cache
