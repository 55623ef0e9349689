"""Poisoned outputs: every element an operator must write starts as NaN (e4m3 code 0x7F, NaN
scales, flags -7), so an element it skips shows in the comparison."""
from h3kernels.constants import HIDDEN


def poisoned_mlp_workspaces(m, device="cuda"):
    """Caller workspaces for minimax_h3_mlp_fp8, every one filled with NaN (codes 0x7F) and the
    flags with -7, so that an element the operator skips shows."""
    import torch

    import h3kernels
    from h3kernels.constants import FFN

    nan = float("nan")
    ws = dict(workspace_a_q=torch.empty(m, HIDDEN, dtype=torch.float8_e4m3fn, device=device),
              workspace_a_scale=torch.full((m,), nan, device=device),
              workspace_y=torch.full((m, FFN), nan, dtype=torch.bfloat16, device=device),
              workspace_y_q=torch.empty(m, FFN, dtype=torch.float8_e4m3fn, device=device),
              workspace_y_scale=torch.full((m,), nan, device=device),
              workspace_flags=torch.full((h3kernels.minimax_h3_mlp_fc2_flags(m),), -7, dtype=torch.int32,
                                         device=device))
    ws["workspace_a_q"].view(torch.uint8).fill_(0x7F)  # e4m3 NaN
    ws["workspace_y_q"].view(torch.uint8).fill_(0x7F)
    return ws
