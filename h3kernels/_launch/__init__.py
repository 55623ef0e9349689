"""The launch layer: each operator's kernel constants, grids and argument lists (mlp_fp8,
varlen_attention_fp8), the Numba kernels' PTX on the common launch path (numba_ptx), what each
CUDA source is built with (sources), and the Numba kernels on host arrays (host)."""
