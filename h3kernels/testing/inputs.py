"""Seeded random inputs of both operators, shared by the tests, the CLI, the notebooks and bench/.

Every generator takes a seed and draws from its own torch.Generator, so a failing case is
reproduced from the seed alone."""
import itertools

from h3kernels.constants import HIDDEN


def cu_seqlens_of(seqlens):
    """Segment lengths -> the host cu_seqlens list [0, L0, L0 + L1, ...]."""
    return [0, *itertools.accumulate(int(n) for n in seqlens)]


def make_row_inputs(m, rows=50, device="cpu", seed=0):
    """Random MLP row-stage inputs: AdaLN tables are column chunks of a [rows, 6*5376] projection,
    and every 7th index (rows 6, 13, ...) is out of range."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    x = (torch.randn(m, HIDDEN, generator=g, device=device) * 2).bfloat16()
    w = (1 + 0.1 * torch.randn(HIDDEN, generator=g, device=device)).bfloat16()
    mod = (0.5 * torch.randn(rows, 6 * HIDDEN, generator=g, device=device)).bfloat16()
    idx = torch.randint(0, rows, (m,), generator=g, device=device)
    idx[6::7] = rows + 3  # from row 6 on: M < 7 runs every row through the GEMMs
    return x, w, mod[:, HIDDEN:2 * HIDDEN], mod[:, 3 * HIDDEN:4 * HIDDEN], idx


def make_attention_inputs(seqlens, heads=56, device="cuda", seed=3):
    """Random bf16 q, k, v [tokens, heads, 128] packed from segments of the given lengths, and
    cu_seqlens as an int32 tensor on `device` and as a host list."""
    import torch

    from h3kernels.constants import HEAD_DIM

    cu_host = cu_seqlens_of(seqlens)
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(cu_host[-1], heads, HEAD_DIM, generator=g, device=device).bfloat16() for _ in range(3))
    return q, k, v, torch.tensor(cu_host, dtype=torch.int32, device=device), cu_host


def make_mlp_weights(m, rows, seed=2, device="cuda"):
    """gate [rows, 5376], residual [M, 5376], bf16 weights w1, w2 and their prepared e4m3 forms
    (q1, s1, q2, s2), on `device`."""
    import torch

    import h3kernels
    from h3kernels.constants import FC1_OUT, FFN

    g = torch.Generator(device=device).manual_seed(seed)
    w1 = (torch.randn(FC1_OUT, HIDDEN, generator=g, device=device) * HIDDEN ** -0.5).bfloat16()
    w2 = (torch.randn(HIDDEN, FFN, generator=g, device=device) * FFN ** -0.5).bfloat16()
    gate = torch.randn(rows, HIDDEN, generator=g, device=device).bfloat16()
    residual = torch.randn(m, HIDDEN, generator=g, device=device).bfloat16()
    q1, s1 = h3kernels.prepare_minimax_h3_fc1_weight_fp8(w1)
    q2, s2 = h3kernels.prepare_minimax_h3_fc2_weight_fp8(w2)
    return gate, residual, w1, w2, q1, s1, q2, s2
