"""Both operators once, for compute-sanitizer (bench/sanitize.sh): raw cudaMalloc for every array
(torch's caching allocator and CuPy's pool would hide an access past an array's end inside a
pooled block), then a check that the results are finite where they must be.

PYTORCH_NO_CUDA_MEMORY_CACHING=1 python bench/sanitize_ops.py --mlp M --attn L1,L2,... --heads H
"""
import argparse

import cupy
import torch

import h3kernels
from h3kernels.demo import make_attention_inputs
from h3kernels.shapes import FC1_OUT, FFN, HIDDEN


def mlp(m):
    g = torch.Generator(device="cuda").manual_seed(m)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=g)
    q1, s1 = h3kernels.prepare_minimax_h3_fc1_weight_fp8((rn(FC1_OUT, HIDDEN) * HIDDEN ** -0.5).bfloat16())
    q2, s2 = h3kernels.prepare_minimax_h3_fc2_weight_fp8((rn(HIDDEN, FFN) * FFN ** -0.5).bfloat16())
    tables = rn(8, 6 * HIDDEN).bfloat16()
    idx = torch.randint(-2, 10, (m,), device="cuda", generator=g)  # some rows index-guarded
    out = h3kernels.minimax_h3_mlp_fp8(rn(m, HIDDEN).bfloat16(), torch.ones(HIDDEN, device="cuda").bfloat16(),
                                       tables[:, :HIDDEN], tables[:, HIDDEN:2 * HIDDEN], idx,
                                       tables[:, 2 * HIDDEN:3 * HIDDEN], rn(m, HIDDEN).bfloat16(), q1, s1, q2, s2)
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all()
    print(f"mlp M={m}: ok", flush=True)


def attention(lens, heads):
    q, k, v, cu_dev, cu = make_attention_inputs(lens, heads, seed=sum(lens))
    out = h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, cu_seqlens_host=cu)
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all()
    print(f"attention {lens} x {heads} heads: ok", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mlp", type=int)
    p.add_argument("--attn")
    p.add_argument("--heads", type=int, default=8)
    a = p.parse_args()
    cupy.cuda.set_allocator(None)  # raw cudaMalloc: see the docstring
    if a.mlp:
        mlp(a.mlp)
    if a.attn:
        attention([int(n) for n in a.attn.split(",")], a.heads)


if __name__ == "__main__":
    main()
