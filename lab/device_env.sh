# Source this on a GPU machine before the scripts of lab/: installs any wheels placed in .whl/ at
# the repository root (for a machine without network access) and sets the paths.
#   source lab/device_env.sh; python3 -m pytest ...
OUT=${OUT:-/tmp/h3out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 H3KERNELS_CACHE_DIR=/tmp/h3cache
# cuDNN's FP8 SDPA (nvidia-cudnn-frontend, installed without its dependencies) loads the cuDNN
# library of torch's own nvidia-cudnn wheel
CUDNN_LIB=$(python3 -c 'import os, nvidia.cudnn as c; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null) \
  && export LD_LIBRARY_PATH=$CUDNN_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
