"""The Numba kernels run directly on CPU tensors and compared with h3kernels.reference, bitwise.

Every output is poisoned first (NaN codes 0x7F, NaN scales), so an element a kernel skips cannot
pass. Under NUMBA_ENABLE_CUDASIM=1 the kernels run on the numpy arrays themselves; on a GPU they
run on device copies. `python -m h3kernels check` (without a GPU) and the tests share this.
Comparisons treat every NaN code (0x7F, 0xFF) alike and a NaN scale as equal to a NaN scale:
NaN signs and payloads differ between runners.
"""
import numpy as np
import torch

from h3kernels import reference as R
from h3kernels._launch import host
from h3kernels._launch import varlen_attention_fp8_plan as plan
from h3kernels._launch.varlen_attention_fp8_plan import key_blocks, plan_host
from h3kernels.constants import HIDDEN

CODE_POISON = 0x7F


def bits16(t):
    """bf16 (or any 16-bit) CPU tensor -> numpy uint16 bits."""
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def _table_quads(t):
    """A [rows, 5376] view with unit column stride, as the flat quads from its base that the row
    kernel indexes with the row stride."""
    flat = torch.as_strided(t, ((t.shape[0] - 1) * t.stride(0) + t.shape[1],), (1,))
    return bits16(flat).view(np.uint64)


def row_stage(x, w, sc, sh, idx, eps=1e-5, scale_poison=np.nan):
    """The row kernel on CPU tensors: (a_q uint8 [M, 5376], a_scale f32 [M]) as numpy arrays.
    scale_poison: what a_scale holds before the run (give a finite value where NaN is expected)."""
    m = x.shape[0]
    quads = lambda t: bits16(t).view(np.uint64)
    a_q, a_s = host.row_stage(quads(x), quads(w), _table_quads(sc), _table_quads(sh), sc.stride(0) // 4, sc.shape[0],
                              idx.numpy(), eps, np.full((m, HIDDEN), CODE_POISON, np.uint8).view(np.uint32),
                              np.full(m, scale_poison, np.float32))
    return a_q.view(np.uint8), a_s


def attention_passes(q, k, v, cu, one_read=None):
    """The attention's quantization passes on bf16 CPU tensors q, k, v [tokens, heads, 128] and
    host cu_seqlens: every array of varlen_attention_fp8_quant.launch, as numpy. one_read: the
    one-read K and V passes (None: where the operator takes them, plan.one_read)."""
    tokens, heads, _ = q.shape
    segs = len(cu) - 1
    blocks = key_blocks(cu)
    n = len(blocks)
    codes = lambda *shape: np.full(shape, CODE_POISON, np.uint8)
    scales = lambda *shape: np.full(shape, np.nan, np.float32)
    arrays = dict(q=bits16(q), k=bits16(k), v=bits16(v), cu=np.array(cu, np.int64), blocks=blocks,
                  block_offset=plan_host(cu, heads)[1], q8=codes(tokens, heads, 128), s_q=scales(tokens, heads),
                  mu=scales(segs, heads, 128), k8=codes(tokens, heads, 128), s_k=scales(n, heads),
                  v8t=codes(heads, 128, n * 128), s_v=scales(segs, heads, 128), partials=scales(2, n, heads, 128))
    return host.attention_passes(arrays, plan.one_read(tuple(cu)) if one_read is None else one_read)


def nan_codes_alike(codes):
    """e4m3 bytes (numpy) with both NaN codes as 0x7F."""
    return np.where((codes & 0x7F) == 0x7F, np.uint8(0x7F), codes)


def same_codes(got, want):
    return got.shape == want.shape and np.array_equal(nan_codes_alike(got), nan_codes_alike(want))


def same_scales(got, want):
    """Bitwise, except that a NaN only has to meet a NaN."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    if got.shape != want.shape or not np.array_equal(np.isnan(got), np.isnan(want)):
        return False
    ok = ~np.isnan(want)
    return np.array_equal(got[ok].view(np.int32), want[ok].view(np.int32))


def row_stage_mismatches(x, w, sc, sh, idx, eps=1e-5, scale_poison=np.nan):
    """Names of the row kernel's outputs that differ from the reference's ([] when all match)."""
    a_q, a_s = row_stage(x, w, sc, sh, idx, eps, scale_poison)
    rq, rs = R.quantize_rows(R.mlp_row_stage(x, w, sc, sh, idx, eps))
    return [name for name, ok in (("a_q", same_codes(a_q, rq.view(torch.uint8).numpy())),
                                  ("a_scale", same_scales(a_s, rs.numpy()))) if not ok]


def attention_pass_mismatches(q, k, v, cu, out=None, one_read=None):
    """Names of the quantization passes' outputs (`out`, from attention_passes: run now when None)
    that differ from the reference's ([] when all match). s_k is the reference's per key, the
    passes' per 128-key block; v8t holds the reference's v8 in the kernel's layout, zero in the
    padding columns."""
    if out is None:
        out = attention_passes(q, k, v, cu, one_read)
    q8, s_q, k8, s_k, v8, s_v = R.quantize_attention_inputs(q, k, v, cu)
    u8 = lambda t: t.view(torch.uint8).numpy()
    blocks = key_blocks(cu)
    per_key_s_k = (np.repeat(out["s_k"], blocks[:, 2], axis=0) if len(blocks)
                   else np.zeros((0, q.shape[1]), np.float32))
    live = [seg for seg in range(len(cu) - 1) if cu[seg + 1] > cu[seg]]
    checks = (("q8", same_codes(out["q8"], u8(q8))), ("s_q", same_scales(out["s_q"], s_q.numpy())),
              ("k8", same_codes(out["k8"], u8(k8))), ("s_k", same_scales(per_key_s_k, s_k.numpy())),
              ("v8t", same_codes(out["v8t"], host.v_transposed(u8(v8), cu))),
              ("s_v", same_scales(out["s_v"][live], s_v[[cu[seg] for seg in live]].numpy())))
    return [name for name, ok in checks if not ok]
