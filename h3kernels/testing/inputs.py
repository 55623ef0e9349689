"""Seeded random inputs of both operators, shared by the tests, the CLI, the notebooks and bench/.

Every generator takes a seed and draws from its own torch.Generator, so a failing case is
reproduced from the seed alone. Inputs are drawn on `device` (CUDA draws differ from CPU draws
of the same seed); fuzz_row_inputs draws on the CPU, so that the simulator and the GPU see the
same rows."""
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


def fuzz_row_inputs(index, rows, seed, device="cpu"):
    """Row-stage inputs for the given adaln_index list, drawn on the CPU: x rows of magnitudes from
    1e-30 to 1e20 (a tenth of them zero; squares of the largest overflow FP32), AdaLN tables as
    column chunks. Returns x, x_norm_weight, adaln_scale, adaln_shift, adaln_index on `device`."""
    import torch

    g = torch.Generator().manual_seed(seed)
    m = len(index)
    mag = torch.pow(10.0, torch.randint(-30, 21, (m, 1), generator=g).double()).float()
    mag[torch.rand(m, 1, generator=g) < 0.1] = 0
    x = (torch.randn(m, HIDDEN, generator=g) * mag).bfloat16()
    w = (1 + 0.1 * torch.randn(HIDDEN, generator=g)).bfloat16()
    mod = (0.5 * torch.randn(rows, 6 * HIDDEN, generator=g)).bfloat16().to(device)
    idx = torch.tensor(index, dtype=torch.int64)
    return x.to(device), w.to(device), mod[:, HIDDEN:2 * HIDDEN], mod[:, 3 * HIDDEN:4 * HIDDEN], idx.to(device)


def make_mlp_inputs(m, rows=50, device="cuda", seed=0, row_inputs=None):
    """The activation arguments of minimax_h3_mlp_fp8 as a dict named like its parameters: x,
    x_norm_weight, adaln_scale, adaln_shift, adaln_index (make_row_inputs, plus a negative index
    in row 1 when m >= 3: every out-of-range kind), gate (a column chunk of a [rows, 2*5376]
    table) and residual. row_inputs: those five given instead (e.g. fuzz_row_inputs)."""
    import torch

    if row_inputs is None:
        row_inputs = make_row_inputs(m, rows, device=device, seed=seed)
        if m >= 3:
            row_inputs[4][1] = -5
    x, w, sc, sh, idx = row_inputs
    g = torch.Generator(device=device).manual_seed(seed + 1)  # not make_row_inputs' stream
    gate = torch.randn(rows, 2 * HIDDEN, generator=g, device=device).bfloat16()[:, HIDDEN:]
    residual = torch.randn(m, HIDDEN, generator=g, device=device).bfloat16()
    return dict(x=x, x_norm_weight=w, adaln_scale=sc, adaln_shift=sh, adaln_index=idx, gate=gate, residual=residual)


def make_fc_weights(seed=2, device="cuda"):
    """dict(w1, w2, q1, s1, q2, s2): bf16 FC weights w1 [28672, 5376], w2 [5376, 14336] (randn /
    sqrt(fan-in)) and their prepared e4m3 forms, on `device`."""
    import torch

    import h3kernels
    from h3kernels.constants import FC1_OUT, FFN

    g = torch.Generator(device=device).manual_seed(seed)
    w1 = (torch.randn(FC1_OUT, HIDDEN, generator=g, device=device) * HIDDEN ** -0.5).bfloat16()
    w2 = (torch.randn(HIDDEN, FFN, generator=g, device=device) * FFN ** -0.5).bfloat16()
    q1, s1 = h3kernels.prepare_minimax_h3_fc1_weight_fp8(w1)
    q2, s2 = h3kernels.prepare_minimax_h3_fc2_weight_fp8(w2)
    return dict(w1=w1, w2=w2, q1=q1, s1=s1, q2=q2, s2=s2)


def make_mlp_weights(m, rows, seed=2, device="cuda"):
    """gate [rows, 5376], residual [M, 5376], bf16 weights w1, w2 and their prepared e4m3 forms
    (q1, s1, q2, s2), on `device` (make_fc_weights and make_mlp_inputs' gate and residual)."""
    import torch

    wt = make_fc_weights(seed, device)
    g = torch.Generator(device=device).manual_seed(seed + 1)
    gate = torch.randn(rows, HIDDEN, generator=g, device=device).bfloat16()
    residual = torch.randn(m, HIDDEN, generator=g, device=device).bfloat16()
    return gate, residual, wt["w1"], wt["w2"], wt["q1"], wt["s1"], wt["q2"], wt["s2"]


def mlp_arguments(inputs, weights):
    """The positional arguments of minimax_h3_mlp_fp8 from make_mlp_inputs' dict and
    make_fc_weights' dict."""
    names = ("x", "x_norm_weight", "adaln_scale", "adaln_shift", "adaln_index", "gate", "residual")
    return (*(inputs[n] for n in names), weights["q1"], weights["s1"], weights["q2"], weights["s2"])


def make_attention_inputs(seqlens, heads=56, device="cuda", seed=3, k_offset=0.0, q_scale=1.0):
    """Random bf16 q, k, v [tokens, heads, 128] packed from segments of the given lengths, and
    cu_seqlens as an int32 tensor on `device` and as a host list. k_offset > 0 adds a per-(head,
    channel) offset of that many standard deviations to every key (what K smoothing removes);
    q_scale multiplies the queries (sharper softmax rows)."""
    import torch

    from h3kernels.constants import HEAD_DIM

    cu_host = cu_seqlens_of(seqlens)
    draw = "cpu" if torch.device(device).type == "meta" else device  # meta tensors have no values to draw
    g = torch.Generator(device=draw).manual_seed(seed)
    q, k, v = (torch.randn(cu_host[-1], heads, HEAD_DIM, generator=g, device=draw) for _ in range(3))
    if k_offset:
        k = k + k_offset * torch.randn(1, heads, HEAD_DIM, generator=g, device=draw)
    if q_scale != 1.0:
        q = q * q_scale
    q, k, v = (t.bfloat16().to(device) for t in (q, k, v))
    return q, k, v, torch.tensor(cu_host, dtype=torch.int32, device=device), cu_host
