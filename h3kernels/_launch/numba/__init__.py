"""The Numba kernels: the MLP row stage and the attention's quantization passes (raw bits, simulator-safe)."""
