"""What the tests, the CLI's check and demo, the notebooks and bench/ share to exercise the
operators: inputs (seeded random inputs: each generator takes a seed and draws from its own
generator), poison (NaN-filled outputs and workspaces, so that an element an operator skips
shows), checks (comparisons, the settled accuracy bounds and the stage-by-stage checks that
raise AssertionError naming what differs), simulator (the Numba kernels on CPU tensors) and
timing."""
