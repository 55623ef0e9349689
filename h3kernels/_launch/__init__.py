"""Private launch layer: the attention's segment plan and the Numba kernels."""
