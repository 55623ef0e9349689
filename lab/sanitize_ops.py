"""Both operators once, for compute-sanitizer (lab/sanitize.sh): raw cudaMalloc for every array
(torch's caching allocator and CuPy's pool would hide an access past an array's end inside a
pooled block), then a check that the results are finite where they must be.

PYTORCH_NO_CUDA_MEMORY_CACHING=1 python lab/sanitize_ops.py --mlp M --attn L1,L2,... --heads H
"""
import argparse

import cupy
import torch

import h3kernels
from h3kernels.testing.inputs import make_attention_inputs, make_mlp_weights, make_row_inputs


def mlp(m, form=-1):
    x, w, sc, sh, idx = make_row_inputs(m, rows=8, device="cuda", seed=m)  # every 7th row index-guarded
    idx[3::7] = -2  # and some below zero: the guard has two sides
    gate, residual, _, _, q1, s1, q2, s2 = make_mlp_weights(m, 8, seed=m + 1)  # not the inputs' random stream again
    out = h3kernels.minimax_h3_mlp_fp8(x, w, sc, sh, idx, gate, residual, q1, s1, q2, s2, fp8_mma_form=form)
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all()
    print(f"mlp M={m} form {form}: ok", flush=True)


def attention(lens, heads, form=-1):
    q, k, v, cu_dev, cu = make_attention_inputs(lens, heads, seed=sum(lens))
    out = h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, cu_seqlens_host=cu, fp8_mma_form=form)
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all()
    print(f"attention {lens} x {heads} heads form {form}: ok", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mlp", type=int)
    p.add_argument("--attn")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--form", type=int, default=-1, help="fp8_mma_form of both operators (3: the wgmma families)")
    a = p.parse_args()
    cupy.cuda.set_allocator(None)  # raw cudaMalloc: see the docstring
    if a.mlp:
        mlp(a.mlp, a.form)
    if a.attn:
        attention([int(n) for n in a.attn.split(",")], a.heads, a.form)


if __name__ == "__main__":
    main()
