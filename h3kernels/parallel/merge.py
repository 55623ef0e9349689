"""Merging partial attentions by their log-sum-exp, in FP32."""
import torch


class LseMerge:
    """Running merge of partial results (out_i, lse_i) of the same queries over disjoint key sets:
    out = sum_i exp(lse_i - lse) out_i with lse = log sum_i exp(lse_i). Partials with lse -inf
    (no keys) weigh 0. The first partial's weighted out starts the FP32 accumulator (one pass),
    each later one is added in place (two passes: 18 bytes moved per output value)."""

    def __init__(self, tokens, heads, head_dim, device):
        self.shape, self.device = (tokens, heads, head_dim), device
        self.acc = None  # the first partial's weighted out
        self.lse = torch.full((heads, tokens), float("-inf"), dtype=torch.float32, device=device)

    def add(self, out, lse):
        new = torch.logaddexp(self.lse, lse)
        finite = torch.isfinite(new)
        safe = torch.where(finite, new, torch.zeros_like(new))
        new_w = torch.where(finite, torch.exp(lse - safe), torch.zeros_like(new)).T[:, :, None]
        if self.acc is None:
            self.acc = (out * new_w).float()  # FP32 in one pass (bf16 x FP32 is FP32 already)
        else:
            old_w = torch.where(finite, torch.exp(self.lse - safe), torch.zeros_like(new)).T[:, :, None]
            self.acc.mul_(old_w).addcmul_(out, new_w)
        self.lse = new

    def result(self, out=None):
        """(out bf16, lse f32): into `out` when given."""
        acc = self.acc if self.acc is not None else torch.zeros(self.shape, dtype=torch.float32, device=self.device)
        if out is None:
            return acc.to(torch.bfloat16), self.lse
        out.copy_(acc)
        return out, self.lse
