"""Poisoned outputs: every element an operator must write starts as NaN (e4m3 code 0x7F, NaN
scales, flags -7), so an element it skips shows in the comparison."""
from h3kernels.constants import HIDDEN

E4M3_NAN = 0x7F


def _nan_codes(shape, device):
    import torch

    return torch.full(shape, E4M3_NAN, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)


def poisoned_row_workspaces(m, device="cuda"):
    """workspace_a_q (codes 0x7F) and workspace_a_scale (NaN) for the row stage of M rows."""
    import torch

    return dict(workspace_a_q=_nan_codes((m, HIDDEN), device),
                workspace_a_scale=torch.full((m,), float("nan"), device=device))


def poisoned_mlp_workspaces(m, device="cuda"):
    """Caller workspaces for minimax_h3_mlp_fp8, every one filled with NaN (codes 0x7F) and the
    flags with -7, so that an element the operator skips shows."""
    import torch

    import h3kernels
    from h3kernels.constants import FFN

    nan = float("nan")
    return dict(poisoned_row_workspaces(m, device),
                workspace_y=torch.full((m, FFN), nan, dtype=torch.bfloat16, device=device),
                workspace_y_q=_nan_codes((m, FFN), device),
                workspace_y_scale=torch.full((m,), nan, device=device),
                workspace_flags=torch.full((h3kernels.minimax_h3_mlp_fc2_flags(m),), -7, dtype=torch.int32,
                                           device=device))


def poisoned_like(t):
    """A bf16 output shaped like torch tensor `t`, on its device, all NaN."""
    import torch

    return torch.full(t.shape, float("nan"), dtype=torch.bfloat16, device=t.device)
