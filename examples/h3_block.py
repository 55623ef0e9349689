"""One MiniMax-H3 DiT block at real sizes on random weights: AdaLN-modulated attention with the
QKV (5376 -> 3 x 56 x 128) and output (56 x 128 -> 5376) projections in torch bf16 around h3kernels' FP8 varlen attention, then h3kernels'
fused FP8 MLP (RMSNorm + AdaLN + FC1/SwiGLU + FC2 + gate + residual). Runs eagerly and under
torch.compile(fullgraph=True), and prints the time per block.

python examples/h3_block.py [--segments 4] [--tokens 4096] [--rows 50] [--reps 10] [--no-compile]
Exit status 0 when it ran, 3 without a CUDA GPU (as `python -m h3kernels bench`).
"""
import argparse
import sys

import torch

import h3kernels
from h3kernels import torch_ops
from h3kernels.testing.checks import rel_l2
from h3kernels.constants import FC1_OUT, FFN, H3_HEADS, HEAD_DIM, HIDDEN
from h3kernels.testing.inputs import cu_seqlens_of
from h3kernels.testing.timing import median_ms
from h3kernels.peers.torch_mlp import row_stage

INNER = H3_HEADS * HEAD_DIM  # 7168: the attention's width (56 heads x 128), wider than the 5376 hidden


class H3Block(torch.nn.Module):
    """x [tokens, 5376] bf16 -> x; `mod` [rows, 6 * 5376] is the AdaLN projection (shift, scale and
    gate of the attention half, then of the MLP half), `index` [tokens] picks each token's row."""

    def __init__(self, device="cuda", seed=0):
        super().__init__()
        g = torch.Generator(device=device).manual_seed(seed)
        rn = lambda *s, scale=1.0: (torch.randn(*s, generator=g, device=device) * scale).bfloat16()
        self.norm1 = torch.nn.Parameter(1 + rn(HIDDEN, scale=0.1), requires_grad=False)
        self.norm2 = torch.nn.Parameter(1 + rn(HIDDEN, scale=0.1), requires_grad=False)
        self.qkv = torch.nn.Parameter(rn(3 * INNER, HIDDEN, scale=HIDDEN ** -0.5), requires_grad=False)
        self.proj = torch.nn.Parameter(rn(HIDDEN, INNER, scale=INNER ** -0.5), requires_grad=False)
        q1, s1 = h3kernels.prepare_minimax_h3_fc1_weight_fp8(rn(FC1_OUT, HIDDEN, scale=HIDDEN ** -0.5))
        q2, s2 = h3kernels.prepare_minimax_h3_fc2_weight_fp8(rn(HIDDEN, FFN, scale=FFN ** -0.5))
        for name, t in (("fc1_q", q1), ("fc1_s", s1), ("fc2_q", q2), ("fc2_s", s2)):
            self.register_buffer(name, t)

    def forward(self, x, mod, index, cu_seqlens, cu_seqlens_host):
        tokens = x.shape[0]
        shift1, scale1, gate1, shift2, scale2, gate2 = (mod[:, i * HIDDEN:(i + 1) * HIDDEN] for i in range(6))
        h = row_stage(x, self.norm1, scale1, shift1, index, 1e-5)
        q, k, v = (t.reshape(tokens, H3_HEADS, HEAD_DIM).contiguous() for t in (h @ self.qkv.t()).chunk(3, dim=-1))
        o = torch_ops.minimax_h3_varlen_attention_fp8(q, k, v, cu_seqlens, cu_seqlens_host)
        x = x + gate1[index] * (o.reshape(tokens, INNER) @ self.proj.t())
        return torch_ops.minimax_h3_mlp_fp8(x, self.norm2, scale2, shift2, index, gate2, x,
                                            self.fc1_q, self.fc1_s, self.fc2_q, self.fc2_s)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--segments", type=int, default=4, help="video segments (sequences) packed together")
    p.add_argument("--tokens", type=int, default=4096, help="tokens per segment")
    p.add_argument("--rows", type=int, default=50, help="AdaLN rows (e.g. one per timestep in the batch)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--no-compile", action="store_true")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        # exit 3, as `python -m h3kernels bench` without a GPU: nothing ran
        print("examples/h3_block.py needs a CUDA GPU (sm_89, sm_90 or sm_120): the FP8 kernels run there; "
              "none found.", file=sys.stderr)
        return 3
    torch.manual_seed(0)
    block = H3Block()
    tokens = a.segments * a.tokens
    x = torch.randn(tokens, HIDDEN, device="cuda").bfloat16()
    mod = (0.1 * torch.randn(a.rows, 6 * HIDDEN, device="cuda")).bfloat16()
    index = torch.randint(0, a.rows, (tokens,), device="cuda")
    cu_host = cu_seqlens_of([a.tokens] * a.segments)
    cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
    run = lambda f: f(x, mod, index, cu, cu_host)
    with torch.no_grad():
        eager_out = run(block)
        eager = median_ms(lambda: run(block), warmup=1, reps=a.reps)
        print(f"{torch.cuda.get_device_name()}: one MiniMax-H3 block, {a.segments} x {a.tokens} tokens, "
              f"{H3_HEADS} heads, {a.rows} AdaLN rows")
        print(f"  eager: {eager:.2f} ms per block ({50 * eager / 1e3:.2f} s for the 50 blocks)")
        if not a.no_compile:
            compiled = torch.compile(block, fullgraph=True)
            out = run(compiled)
            t = median_ms(lambda: run(compiled), warmup=1, reps=a.reps)
            print(f"  torch.compile(fullgraph=True): {t:.2f} ms per block; output vs eager rel L2 "
                  f"{rel_l2(out, eager_out):.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
