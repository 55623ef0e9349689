"""Private runtime: the torch/CuPy array adapter, NVRTC compilation and its cache, argument-check primitives."""
