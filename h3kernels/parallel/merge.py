"""Merging partial attentions by their log-sum-exp, in FP32."""
import torch


class LseMerge:
    """Running merge of partial results (out_i, lse_i) of the same queries over disjoint key sets:
    out = sum_i exp(lse_i - lse) out_i with lse = log sum_i exp(lse_i). Partials with lse -inf
    (no keys) weigh 0."""

    def __init__(self, tokens, heads, head_dim, device):
        self.acc = torch.zeros((tokens, heads, head_dim), dtype=torch.float32, device=device)
        self.lse = torch.full((heads, tokens), float("-inf"), dtype=torch.float32, device=device)

    def add(self, out, lse):
        new = torch.logaddexp(self.lse, lse)
        finite = torch.isfinite(new)
        safe = torch.where(finite, new, torch.zeros_like(new))
        old_w = torch.where(finite, torch.exp(self.lse - safe), torch.zeros_like(new))
        new_w = torch.where(finite, torch.exp(lse - safe), torch.zeros_like(new))
        self.acc = self.acc * old_w.T[:, :, None] + out.float() * new_w.T[:, :, None]
        self.lse = new

    def result(self, out=None):
        """(out bf16, lse f32): into `out` when given."""
        if out is None:
            return self.acc.to(torch.bfloat16), self.lse
        out.copy_(self.acc)
        return out, self.lse
