"""minimax_h3_varlen_attention_fp8.

CPU: the launcher's constants against the kernel's #defines; a lane-level numpy emulation of
cuda_src/varlen_attention_fp8.cu (fragments, swizzles, ring, online softmax, P packing against
the V pass's key permutation) against the reference; argument validation.
GPU: against h3kernels.reference and a float64 unquantized attention within the settled bounds
(h3kernels.testing.checks.attention_misses), segment sets, heads, tokens = 0, cu_seqlens_host or
not, out or not, torch and CuPy, streams, repeats.
"""
import math
import re

import numpy as np
import pytest
import torch

import h3kernels
from h3kernels import reference as R
from h3kernels import varlen_attention_fp8 as A
from h3kernels._launch import varlen_attention_fp8 as L
from h3kernels._launch import varlen_attention_fp8_plan as P
from h3kernels._launch.numba import varlen_attention_fp8_quant as Q
from h3kernels.testing.checks import attention_misses, exact_attention, reference_rows, rel_l2, same_bits
from h3kernels.constants import HEAD_DIM, K_BLOCK
from h3kernels.testing.inputs import make_attention_inputs
from h3kernels.testing.poison import poisoned_like


def test_constants_fit_the_kernel_and_sm120():
    # a key block lies inside one K scale block; P fills whole k32 steps; one warp per 16 queries
    assert L.KSB % L.BKV == 0 and L.BKV % 32 == 0 and L.THREADS // 32 * 16 == L.BQ
    assert L.BQ == P.Q_TILE and L.KSB == P.K_BLOCK and L.TILE_INTS == P.TILE_COLS and L.HD == HEAD_DIM
    assert L.SMEM_BYTES <= 99 * 1024
    assert Q.K_BLOCK == HEAD_DIM == 128  # the V pass uses one thread per channel, then per key column


def test_workspace_layout_is_aligned_and_disjoint():
    parts, total = L.layout(1000, 56, 7, 13)
    spans = sorted((off, off + int(np.prod(shape)) * np.dtype(dt).itemsize) for off, shape, dt in parts.values())
    assert all(off % 256 == 0 for off, _ in spans) and spans[-1][1] <= total
    assert all(a_end <= b for (_, a_end), (b, _) in zip(spans, spans[1:]))
    assert parts["v8t"][1] == (56, 128, 13 * 128)
    hopper, smaller = L.layout(1000, 56, 7, 13, with_q=False)  # the Hopper kernel quantizes Q itself
    assert hopper["q8"][1] == (0, 56, 128) and hopper["s_q"][1] == (0, 56)
    assert total - smaller == 1000 * 56 * 128 + -(-1000 * 56 * 4 // 256) * 256


# --- a lane-level emulation of the kernel ------------------------------------------------------

E4M3_VALUE = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).double().numpy()
LANE = np.arange(32)
G, T, LQ, LR = LANE >> 2, LANE & 3, LANE >> 3, LANE & 7
_I16, _I8, _I4 = np.arange(16), np.arange(8), np.arange(4)
# docs/spec.md's m16n8k32 e4m3 fragment layout, per lane and fragment byte (C: per register)
A_ROW, A_COL = G[:, None] + 8 * ((_I16 // 4) % 2), 4 * T[:, None] + _I16 % 4 + 16 * (_I16 // 8)
B_N, B_K = np.broadcast_to(G[:, None], (32, 8)), 4 * T[:, None] + _I8 % 4 + 16 * (_I8 // 4)
C_ROW, C_COL = G[:, None] + 8 * (_I4 // 2), 2 * T[:, None] + _I4 % 2

BQ, BKV, KSB, HD, STAGES, THREADS = L.BQ, L.BKV, L.KSB, L.HD, L.STAGES, L.THREADS
Q_BYTES, K_BYTES = BQ * HD, BKV * HD
STAGE_BYTES = K_BYTES + HD * BKV
WARPS = THREADS // 32


def swz128(row, chunk):
    return row * 128 + ((chunk ^ (row & 7)) << 4)


def swz64(row, chunk):
    return row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4)


def fragment_bytes(regs):
    """uint32 [..., n] -> uint8 [..., 4n]: byte i is byte i % 4 of register i // 4."""
    r = np.ascontiguousarray(regs, dtype="<u4")
    return r.view(np.uint8).reshape(*r.shape[:-1], -1)


def mma(d, a, b):
    """d [W, 32, 4] f32 += A . B of each warp, from lane fragments a [W, 32, 4], b [W, 32, 2]."""
    w = d.shape[0]
    am, bm = np.zeros((w, 16, 32)), np.zeros((w, 8, 32))
    am[:, A_ROW, A_COL] = E4M3_VALUE[fragment_bytes(a)]
    bm[:, B_N, B_K] = E4M3_VALUE[fragment_bytes(b)]
    assert not np.isnan(am).any() and not np.isnan(bm).any()  # no e4m3 NaN code reaches an mma
    prod = am @ bm.transpose(0, 2, 1)  # exact products and sums
    return (d.astype(np.float64) + prod[:, C_ROW, C_COL]).astype(np.float32)


def ldmatrix_x4(smem, addr):
    """addr [W, 32] row addresses (lane 8m + r: row r of matrix m) -> registers [W, 32, 4]."""
    assert (addr % 16 == 0).all()
    out = np.empty(addr.shape + (4,), np.uint32)
    for m in range(4):
        row = addr[:, 8 * m + (LANE >> 2)] + 4 * (LANE & 3)
        b = smem[row[..., None] + np.arange(4)].astype(np.uint32)
        out[..., m] = b[..., 0] | b[..., 1] << 8 | b[..., 2] << 16 | b[..., 3] << 24
    return out


def cp_async_16(smem, dst, src, off, ok):
    assert (dst % 16 == 0).all() and (off % 16 == 0).all()
    got = src[off[:, None] + np.arange(16)]
    smem[dst[:, None] + np.arange(16)] = np.where(ok[:, None], got, 0)


def pack_p(*ps):
    """Four probability arrays -> u32 of their e4m3(256 p) bytes, the first in the low byte."""
    out = np.zeros(ps[0].shape, np.uint32)
    for i, p in enumerate(ps):
        code = R.e4m3(torch.from_numpy(np.float32(256) * p)).view(torch.uint8).numpy().astype(np.uint32)
        out |= code << (8 * i)
    return out


def emulate_kernel(tiles, q8, s_q, k8, s_k, v8t, s_v, heads, scale_log2, lse_inputs=None,
                   q_bounds=None):
    """The kernel, statement by statement, for every tile in turn (all warps at once). Returns
    out as float32 [tokens, heads, 128], NaN where nothing was written; with lse_inputs = (q as
    float32 [tokens, heads, 128] of its bf16 values, mu f32 [segments, heads, 128], softmax_scale),
    (out, lse f32 [heads, tokens], NaN where nothing was written). q_bounds: each segment's query
    rows, whose start the lse takes (the plan's; None: the tiles' own segments, queries = keys)."""
    tokens = q8.shape[0]
    lse = np.full(heads * tokens, np.nan, np.float32)
    q8f, k8f, v8f = q8.reshape(-1), k8.reshape(-1), v8t.reshape(-1)
    s_qf, s_kf, s_vf = s_q.reshape(-1), s_k.reshape(-1), s_v.reshape(-1)
    out = np.full(tokens * heads * HD, np.nan, np.float32)
    v_pitch, pitch = v8t.shape[2], heads * HD
    smem = np.zeros(Q_BYTES + STAGES * STAGE_BYTES, np.uint8)
    tid = np.arange(THREADS)
    warp, lq, lr, g = np.arange(WARPS)[:, None], LQ[None], LR[None], G[None]
    f32 = np.float32

    def load_kv(stage, kseg, vseg, j, length):
        for i in range(BKV * HD // 16 // THREADS):
            idx = tid + i * THREADS
            row, chunk = idx >> 3, idx & 7
            key = j * BKV + row
            ok = key < length
            cp_async_16(smem, stage + swz128(row, chunk), k8f, kseg + np.where(ok, key * pitch, 0) + chunk * 16, ok)
        for i in range(HD * BKV // 16 // THREADS):
            idx = tid + i * THREADS
            row, chunk = idx >> 2, idx & 3
            cp_async_16(smem, stage + K_BYTES + swz64(row, chunk), v8f, vseg + row * v_pitch + j * BKV + chunk * 16,
                        np.ones_like(idx, bool))

    for start, length, q0, h, seg, end, kb0 in tiles.tolist():
        n_blocks = -(-length // BKV)
        q_first = start if q_bounds is None else int(q_bounds[seg])
        n_iter = n_blocks
        kseg, vseg = start * pitch + h * HD, h * HD * v_pitch + kb0 * KSB
        for i in range(BQ * HD // 16 // THREADS):
            idx = tid + i * THREADS
            row, chunk = idx >> 3, idx & 7
            tok = q0 + row
            ok = tok < end
            cp_async_16(smem, swz128(row, chunk), q8f, np.where(ok, tok * pitch + h * HD, 0) + chunk * 16, ok)
        for s in range(STAGES - 1):
            if s < n_iter:
                load_kv(Q_BYTES + s * STAGE_BYTES, kseg, vseg, s % n_blocks, length)
        row0 = q0 + warp * 16 + g
        row1 = row0 + 8
        sq = lambda r: np.where(r < end, s_qf[np.minimum(r, tokens - 1) * heads + h] * f32(scale_log2), f32(0))
        c0, c1 = sq(row0).astype(f32), sq(row1).astype(f32)
        q_frag = swz128(warp * 16 + lr + 8 * (lq & 1), lq >> 1)
        qf = [ldmatrix_x4(smem, q_frag ^ (ks << 5)) for ks in range(HD // 32)]
        o = np.zeros((WARPS, 32, HD // 8, 4), f32)
        m0, m1 = np.full((WARPS, 32), -np.inf, f32), np.full((WARPS, 32), -np.inf, f32)
        l0, l1 = np.zeros((WARPS, 32), f32), np.zeros((WARPS, 32), f32)
        for it in range(n_iter):
            nxt = it + STAGES - 1
            if nxt < n_iter:
                load_kv(Q_BYTES + (nxt % STAGES) * STAGE_BYTES, kseg, vseg, nxt % n_blocks, length)
            j = it
            k_base = Q_BYTES + (it % STAGES) * STAGE_BYTES
            v_base = k_base + K_BYTES
            s = np.zeros((WARPS, 32, BKV // 8, 4), f32)
            for ks in range(HD // 32):
                for npair in range(BKV // 16):
                    b = ldmatrix_x4(smem, k_base + swz128(npair * 16 + lr + 8 * (lq >> 1), 2 * ks + (lq & 1)))
                    s[:, :, 2 * npair] = mma(s[:, :, 2 * npair], qf[ks], b[..., 0:2])
                    s[:, :, 2 * npair + 1] = mma(s[:, :, 2 * npair + 1], qf[ks], b[..., 2:4])
            sk = s_kf[(kb0 + j * BKV // KSB) * heads + h]
            cb0, cb1 = c0 * sk, c1 * sk
            valid = length - j * BKV
            key = np.arange(BKV // 8)[:, None] * 8 + 2 * T[:, None, None] + np.arange(2)  # [32, nt, e]
            ok = key < valid
            s[..., 0:2] = np.where(ok, s[..., 0:2] * cb0[..., None, None], -np.inf)
            s[..., 2:4] = np.where(ok, s[..., 2:4] * cb1[..., None, None], -np.inf)
            mx0 = np.maximum(m0, s[..., 0:2].max(axis=(2, 3)))
            mx1 = np.maximum(m1, s[..., 2:4].max(axis=(2, 3)))
            quad = lambda x: x.reshape(WARPS, 8, 4).max(axis=2).repeat(4, axis=1)  # shuffles over the 4 lanes
            mx0, mx1 = quad(mx0), quad(mx1)
            a0, a1 = np.exp2(m0 - mx0).astype(f32), np.exp2(m1 - mx1).astype(f32)
            m0, m1 = mx0, mx1
            l0, l1 = l0 * a0, l1 * a1
            o[..., 0:2] *= a0[..., None, None]
            o[..., 2:4] *= a1[..., None, None]
            s[..., 0:2] = np.exp2(s[..., 0:2] - m0[..., None, None])
            s[..., 2:4] = np.exp2(s[..., 2:4] - m1[..., None, None])
            l0 = l0 + s[..., 0:2].sum(axis=(2, 3), dtype=f32)
            l1 = l1 + s[..., 2:4].sum(axis=(2, 3), dtype=f32)
            for kk in range(BKV // 32):
                p = s[:, :, 4 * kk:4 * kk + 4]
                pa = np.stack([pack_p(p[:, :, 0, 0], p[:, :, 0, 1], p[:, :, 1, 0], p[:, :, 1, 1]),
                               pack_p(p[:, :, 0, 2], p[:, :, 0, 3], p[:, :, 1, 2], p[:, :, 1, 3]),
                               pack_p(p[:, :, 2, 0], p[:, :, 2, 1], p[:, :, 3, 0], p[:, :, 3, 1]),
                               pack_p(p[:, :, 2, 2], p[:, :, 2, 3], p[:, :, 3, 2], p[:, :, 3, 3])], axis=-1)
                for cp in range(HD // 16):
                    b = ldmatrix_x4(smem, v_base + swz64(cp * 16 + lr + 8 * (lq >> 1), 2 * kk + (lq & 1)))
                    o[:, :, 2 * cp] = mma(o[:, :, 2 * cp], pa, b[..., 0:2])
                    o[:, :, 2 * cp + 1] = mma(o[:, :, 2 * cp + 1], pa, b[..., 2:4])
        quad_sum = lambda x: x.reshape(WARPS, 8, 4).sum(axis=2, dtype=f32).repeat(4, axis=1)
        d0, d1 = f32(1) / (f32(256) * quad_sum(l0)), f32(1) / (f32(256) * quad_sum(l1))  # __frcp_rn
        for ct in range(HD // 8):
            c = ct * 8 + 2 * T
            for e in range(2):
                sv = s_vf[(seg * heads + h) * HD + c + e]
                for row, d, reg in ((row0, d0, e), (row1, d1, 2 + e)):
                    val = (o[:, :, ct, reg] * sv) * d
                    rows, vals = row[row < end], val[row < end]
                    out[(rows * heads + h) * HD + np.broadcast_to(c + e, row.shape)[row < end]] = vals
        if lse_inputs is not None:
            q_bf16, mu, softmax_scale = lse_inputs
            for row, m, l in ((row0, m0, quad_sum(l0)), (row1, m1, quad_sum(l1))):
                src = np.where(row < end, row, q_first)  # [W, 32]
                # lane t: the channels it writes, 8 ct + 2t and 8 ct + 2t + 1 for ct = 0 .. 15, in order
                ch = (8 * np.arange(16)[:, None] + 2 * T[None, :, None, None] + np.arange(2)).reshape(1, 32, 32)
                qv = q_bf16[src[..., None], h, ch].astype(np.float64)
                mv = mu[seg, h, ch].astype(np.float64)
                d = np.zeros(src.shape, f32)
                for c in range(32):
                    d = (qv[..., c] * mv[..., c] + d).astype(f32)  # fmaf
                for x in (1, 2):  # the __shfl_xor_sync sums
                    d = (d + d[:, LANE ^ x]).astype(f32)
                base = ((m + np.log2(l).astype(f32)).astype(f32) * f32(np.log(2.0))).astype(f32)
                val = (np.float64(f32(softmax_scale)) * d + base).astype(f32)  # fmaf
                ok = (row < end) & (T[None] == 0)
                lse[h * tokens + row[ok]] = val[ok]
    res = R.bf16(torch.from_numpy(out)).float().numpy().reshape(tokens, heads, HD)
    return res if lse_inputs is None else (res, lse.reshape(heads, tokens))


def kernel_inputs(q, k, v, cu):
    """The quantization passes' outputs in the kernel's layouts, from the reference (which the
    passes equal bitwise: tests/test_varlen_attention_fp8_quant.py)."""
    q8, s_q, k8, s_k, v8, s_v = R.quantize_attention_inputs(q, k, v, cu)
    heads = q.shape[1]
    blocks = Q.key_blocks(cu)
    s_k_blocks = np.stack([s_k[first].numpy() for first in blocks[:, 1]]) if len(blocks) else np.zeros((0, heads))
    s_v_seg = np.stack([s_v[a].numpy() if b > a else np.zeros((heads, HD), np.float32) for a, b in zip(cu, cu[1:])])
    u8 = lambda x: x.view(torch.uint8).numpy()
    return u8(q8), s_q.numpy(), u8(k8), s_k_blocks.astype(np.float32), Q.v_transposed(u8(v8), cu), s_v_seg


def random_inputs(seqlens, heads, k_offset=0.0, seed=0, device="cpu"):
    """make_attention_inputs in the argument order of the softmax-variant tests below."""
    return make_attention_inputs(seqlens, heads, device=device, seed=seed, k_offset=k_offset)


@pytest.fixture(scope="module")
def emulation_case(seed_of):
    seqlens, heads = [1, 60, 0, 200, 129], 2  # 60: one key block
    q, k, v, _, cu = make_attention_inputs(seqlens, heads, device="cpu", seed=seed_of("emulation_case"), k_offset=20.0)
    tiles, _ = P.plan_host(cu, heads)
    args = (tiles, *kernel_inputs(q, k, v, cu), heads, np.float32(HEAD_DIM ** -0.5 * L.LOG2E))
    return args, R.attention_fp8(q, k, v, cu).float(), R.attention_exact(q, k, v, cu), np.asarray(cu, np.int32)


def test_emulated_kernel_with_online_max_matches_the_reference(emulation_case):
    args, want, exact, q_bounds = emulation_case
    got = emulate_kernel(*args, q_bounds=q_bounds)
    assert not np.isnan(got).any()  # every (token, head) written exactly by its tile
    # one key block (<= 64 keys): the online max is the final max, so P is the reference's
    assert rel_l2(got[:61], want[:61]) <= 0.003, rel_l2(got[:61], want[:61])
    # longer: P rounds against running maxima (the settled bound: docs/spec.md, Accuracy bounds)
    assert rel_l2(got, want) <= 0.03, rel_l2(got, want)
    assert rel_l2(got, exact) <= 1.1 * rel_l2(want, exact)

    # the check has teeth: V in plain key order (no v_key_at permutation) is far off
    tiles, q8, s_q, k8, s_k, v8t, s_v, heads, scale_log2 = args
    perm = Q.v_key_at(np.arange(128, dtype=np.uint64)).astype(np.int64)
    plain = np.zeros_like(v8t)
    for b in range(v8t.shape[2] // 128):
        plain[:, :, b * 128 + perm] = v8t[:, :, b * 128:(b + 1) * 128]
    bad = emulate_kernel(tiles, q8, s_q, k8, s_k, plain, s_v, heads, scale_log2, q_bounds=q_bounds)
    assert rel_l2(bad[61:], want[61:]) > 0.2


# --- the log-sum-exp ----------------------------------------------------------------------------

def dequantized_lse64(q, k, v, cu, softmax_scale=None):
    """float64 logsumexp of the reference's own (dequantized, mean-centred) scores plus the float64
    shift softmax_scale * q . mean(K): what the reference's FP32 lse computes, without rounding."""
    scale = HEAD_DIM ** -0.5 if softmax_scale is None else softmax_scale
    q8, s_q, k8, s_k, _, _ = R.quantize_attention_inputs(q, k, v, cu)
    qd = q8.double() * s_q.double()[..., None]
    kd = k8.double() * s_k.double()[..., None]
    means = R.segment_key_means(k, cu).double()
    out = torch.full((q.shape[1], q.shape[0]), float("nan"), dtype=torch.float64)
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        for h in range(q.shape[1] if b > a else 0):  # one head at a time: [L, L] float64 scores
            s = (qd[a:b, h] @ kd[a:b, h].T) * scale
            out[h, a:b] = torch.logsumexp(s, dim=-1) + (q[a:b, h].double() @ means[i, h]) * scale
    return out


@pytest.mark.parametrize("k_offset", [0.0, 20.0])
def test_reference_lse_is_the_float64_lse_of_its_scores_and_near_the_exact_one(k_offset, seed):
    q, k, v, cu_dev, cu = make_attention_inputs([1, 60, 0, 200, 129], 3, device="cpu", seed=seed, k_offset=k_offset)
    out, lse = R.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, return_lse=True, softmax_scale=0.1)
    assert same_bits(out, R.attention_fp8(q, k, v, cu, softmax_scale=0.1))  # the lse changes nothing of out
    assert lse.dtype == torch.float32 and lse.shape == (3, 390)
    own = dequantized_lse64(q, k, v, cu, softmax_scale=0.1)
    assert torch.allclose(lse.double(), own, rtol=2e-6, atol=2e-5), (lse.double() - own).abs().max()
    exact = R.lse_exact(q, k, cu, softmax_scale=0.1)
    # what the FP8 scores cost: about 0.005 on average, at most 0.03 on these inputs
    assert (lse.double() - exact).abs().max() <= 0.05 and (lse.double() - exact).abs().mean() <= 0.01
    if k_offset:  # the smoothing shift is large here: without it the lse would be far off
        shift = R.mean_shift(q[1:61], R.key_mean(k[1:61].float()), 0.1)
        assert shift.abs().mean() > 100 * (lse.double() - exact).abs().mean()


def test_reference_lse_of_single_keys_and_empty_sets():
    """One key: lse = scale * q . k exactly up to rounding (no quantization error in a 1-key
    softmax's lse: its centred score is 0); no tokens: an empty [heads, 0]."""
    q, k, v, cu_dev, cu = make_attention_inputs([1, 1, 0, 1], 2, device="cpu", seed=3, k_offset=5.0)
    _, lse = R.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, return_lse=True)
    assert torch.allclose(lse.double(), R.lse_exact(q, k, cu), rtol=1e-6, atol=1e-5)
    empty = torch.zeros(0, 2, HEAD_DIM, dtype=torch.bfloat16)
    out, lse = R.minimax_h3_varlen_attention_fp8(empty, empty, empty, torch.zeros(3, dtype=torch.int32),
                                                 return_lse=True)
    assert out.shape == (0, 2, HEAD_DIM) and lse.shape == (2, 0) and lse.dtype == torch.float32


def test_emulated_kernel_lse_matches_the_reference(seed_of):
    """The kernel's lse (online max m in log2 units, l without P's 2^8 bias, the shift from bf16 q
    and the segment's mu) against the reference's, on every (head, token), with a large key offset
    so that the shift matters."""
    seqlens, heads = [1, 60, 0, 200, 129], 2
    q, k, v, _, cu = make_attention_inputs(seqlens, heads, device="cpu", seed=seed_of("emulation_case"), k_offset=20.0)
    tiles, _ = P.plan_host(cu, heads)
    scale = HEAD_DIM ** -0.5
    mu = R.segment_key_means(k, cu).numpy()
    got, lse = emulate_kernel(tiles, *kernel_inputs(q, k, v, cu), heads, np.float32(scale * L.LOG2E),
                              lse_inputs=(q.float().numpy(), mu, scale), q_bounds=np.asarray(cu, np.int32))
    want_out, want = R.attention_fp8(q, k, v, cu, return_lse=True)
    assert not np.isnan(lse).any()  # every (head, token) written
    err = np.abs(lse.astype(np.float64) - want.double().numpy())
    assert err.max() <= 1e-4 * (1 + np.abs(want.numpy()).max()), err.max()
    assert rel_l2(got, want_out.float()) <= 0.03
    # against the float64 lse of the reference's own scores: the FP32 rounding of each path only
    own = dequantized_lse64(q, k, v, cu)
    assert np.abs(lse - own.numpy()).max() <= 1e-4 * (1 + own.abs().max().item())


def test_emulated_kernel_with_two_segmentations_matches_the_reference_partial(seed):
    """The ring's step: this rank's queries (tokens 0 .. 199) against another rank's key block
    (tokens 200 .. 374) of one packed sequence, with the whole segments' key mean and V amax,
    through the kernel's cross plan (keys from one range, query bounds from the other) against
    h3kernels.reference.attention_fp8_partial; rows whose segment has no keys there are left
    unwritten (the merge gives them weight 0)."""
    from h3kernels.parallel import local_seqlens

    heads, scale = 2, HEAD_DIM ** -0.5
    q, k, v, _, cu = make_attention_inputs([70, 0, 300, 5], heads, device="cpu", seed=seed, k_offset=5.0)
    mean = R.segment_key_means(k, cu)
    amax = torch.stack([v[a:b].float().abs().amax(0) if b > a else torch.zeros(heads, HD) for a, b in zip(cu, cu[1:])])
    cu_q, cu_k = local_seqlens(cu, 0, 200), local_seqlens(cu, 200, 175)
    qa, kb, vb = q[:200].contiguous(), k[200:].contiguous(), v[200:].contiguous()
    tiles, block_offset, blocks, q_bounds = P.cross_plan_arrays(cu_q, cu_k, heads)
    assert set(tiles[:, 4].tolist()) == {2}  # segment 0 has no keys there, segment 3 no queries
    assert (tiles[:, 5] == q_bounds[tiles[:, 4] + 1]).all() and (tiles[:, 6] == block_offset[tiles[:, 4]]).all()
    q8, s_q = R.quantize_rows(qa)
    _, _, k8, s_k, v8, _ = R.quantize_attention_inputs(qa[:0], kb, vb, cu_k, k_mean=mean, v_amax=amax)
    s_k_blocks = np.stack([s_k[first].numpy() for first in blocks[:, 1]])
    s_v = R.div(amax, 448.0).numpy()
    u8 = lambda x: x.view(torch.uint8).numpy()
    got, lse = emulate_kernel(tiles, u8(q8), s_q.numpy(), u8(k8), s_k_blocks, Q.v_transposed(u8(v8), cu_k),
                              s_v, heads, np.float32(scale * L.LOG2E), lse_inputs=(qa.float().numpy(), mean.numpy(), scale),
                              q_bounds=q_bounds)
    want, want_lse = R.attention_fp8_partial(qa, kb, vb, cu_q, cu_k, k_mean=mean, v_amax=amax)
    rows = slice(70, 200)  # segment 2's queries
    assert np.isnan(got[:70]).all() and np.isnan(lse[:, :70]).all()  # no keys here: not written
    assert not np.isnan(got[rows]).any() and not np.isnan(lse[:, rows]).any()
    assert rel_l2(got[rows], want[rows].float()) <= 0.03, rel_l2(got[rows], want[rows].float())
    err = np.abs(lse[:, rows] - want_lse[:, rows].numpy()).max()
    assert err <= 1e-4 * (1 + want_lse[:, rows].abs().max().item()), err


def test_launch_values_fit_the_kernels_parameters(monkeypatch):
    """Every launch of the operator and of the ring's step passes as many values as its kernel
    has parameters (the Numba kernels' flattened arrays, the CUDA kernel's PARAMS)."""
    from h3kernels._launch import numba_ptx

    monkeypatch.setattr(numba_ptx, "kernel", lambda name, device_id: name)
    ptr = 1 << 20
    own = L.quant_launches(0, 300, 2, 3, 4, ptr, ptr, ptr, ptr, 1, ptr, ptr, ptr)
    cross = L.partial_launches(0, 200, 175, 2, 4, 3, ptr, ptr, ptr, ptr, ptr, None, ptr, ptr)
    assert [name for name, *_ in cross] == ["q_kernel", "k_quant_kernel", "v_quant_kernel"]
    for name, kern, grid, threads, values in own + cross:
        assert len(values) == len(numba_ptx.params(name)), name
    build = L.AttentionBuild("sm_90")
    assert build.kernel_params(L.KERNEL) == L.PARAMS and build.kernels == (L.KERNEL,)
    assert len(L.PARAMS) == 18  # 12 of the attention, then lse, q, mu, tokens, softmax_scale, q_bounds
    assert [name for name, *_ in L.quant_launches(0, 300, 2, 3, 4, ptr, ptr, ptr, ptr, 1, ptr, ptr, ptr,
                                                  with_q=False)] == [name for name, *_ in own][1:]
    assert [name for name, *_ in L.partial_launches(0, 200, 175, 2, 4, 3, ptr, ptr, ptr, ptr, ptr, None, ptr, ptr,
                                                    with_q=False)] == ["k_quant_kernel", "v_quant_kernel"]
    assert L.runs_q_pass(build) and not L.runs_q_pass(L.hopper.AttentionBuild())


def test_mma_sync_builds_are_values_one_per_form_of_the_arch():
    assert L.shipped_builds("sm_120a") == (L.AttentionBuild("sm_120a", 0), L.AttentionBuild("sm_120a", 2))
    assert L.shipped_builds("sm_90") == (L.AttentionBuild("sm_90", 0),) == L.shipped_builds("sm_90")
    assert L.shipped_builds("sm_89") == (L.AttentionBuild("sm_89", 0),) and L.shipped_builds("sm_90a") == ()
    d90, d120 = L.AttentionBuild("sm_90").defines(), L.AttentionBuild("sm_120a", 2).defines()
    assert (d90["Q_IN_REGS"], d90["SKIP_SETTLED_RESCALE"], d90["H3_MMA_FORM"]) == (0, 0, 0)
    assert (d120["Q_IN_REGS"], d120["SKIP_SETTLED_RESCALE"], d120["H3_MMA_FORM"]) == (1, 1, 2)
    assert L.AttentionBuild("sm_89").dynamic_smem(L.KERNEL) == L.SMEM_BYTES and L.ARCHS == ("sm_120a", "sm_90", "sm_89")


def test_mma_sync_launch_takes_the_build_and_returns_its_record(monkeypatch, stand_in_plan):
    """Form 0 through the launch layer with stand-in scratch: the call's build through the one
    loader, a grid of at most the kernel's cap, the parameters in the kernel's order; run()
    returns the launch's record, None when the plan has no tiles."""
    from h3kernels._runtime import compiler, targets

    cu, heads, base = (0, 300, 300, 429), 2, stand_in_plan.base
    tiles, block_offset, blocks, q_bounds = P.plan_arrays(cu, heads)
    stand_in_plan.set((len(tiles), len(block_offset), len(blocks), len(q_bounds)))

    class Kernel:
        def grid_cap(self, threads):
            return 4

        def launch(self, stream, grid, threads, values):
            launched.append((stream, grid, threads, values))
            return "record"


    launched, loaded = [], []
    monkeypatch.setattr(targets, "device_arch", lambda device_id: "sm_120a")
    monkeypatch.setattr(compiler, "kernel", lambda *a: loaded.append(a) or Kernel())
    q = torch.zeros(cu[-1], heads, HEAD_DIM, dtype=torch.bfloat16)
    out = torch.zeros_like(q)
    assert L.run(stand_in_plan.call, q, q, q, torch.tensor(cu, dtype=torch.int32), cu, heads, 0.125, out, 2) == "record"
    assert loaded == [(L.SOURCE, L.KERNEL, "sm_120a", L.AttentionBuild("sm_120a", 2), 0)]
    (stream, grid, threads, values), = launched
    parts, _ = L.layout(cu[-1], heads, len(cu) - 1, len(blocks))
    assert (stream, grid, threads) == (7, (4, 1), L.THREADS) and len(values) == len(L.PARAMS)
    assert values == (11, len(tiles), base + parts["q8"][0], base + parts["s_q"][0], base + parts["k8"][0],
                      base + parts["s_k"][0], base + parts["v8t"][0], base + parts["s_v"][0], out.data_ptr(), heads,
                      len(blocks) * K_BLOCK, 0.125 * L.LOG2E, 0, q.data_ptr(), base + parts["mu"][0], cu[-1], 0.125,
                      14)
    stand_in_plan.set((0, 1, 0, 2))
    assert L.run(stand_in_plan.call, q, q, q, torch.tensor(cu, dtype=torch.int32), cu, heads, 0.125, out, 2) is None
    assert stand_in_plan.released == [True, False]  # the plan given back after each call, its use recorded where launched


# --- validation ---------------------------------------------------------------------------------

def _args(device="cpu", seqlens=(3, 0, 5), heads=2):
    """A valid call (values do not matter to the checks: zeros)."""
    cu_host = [0, *np.cumsum(seqlens).tolist()]
    q, k, v = (torch.zeros(cu_host[-1], heads, HEAD_DIM, dtype=torch.bfloat16, device=device) for _ in range(3))
    cu = torch.tensor(cu_host, dtype=torch.int32, device=device)
    return dict(q=q, k=k, v=v, cu_seqlens=cu, out=None, cu_seqlens_host=cu_host, softmax_scale=None)


def _set(name, fn):
    def mutate(a):
        a[name] = fn(a[name])
        return a
    return mutate


BAD = [
    # (mutation of the arguments, exception, message start)
    (_set("q", lambda x: x.float()), TypeError, "q: got torch.float32; need bfloat16"),
    (_set("v", lambda x: x.half()), TypeError, "v: got torch.float16; need bfloat16"),
    (_set("q", lambda x: x[..., :64]), ValueError, "q: got shape (8, 2, 64); need shape (tokens, heads >= 1, 128)"),
    (_set("q", lambda x: x[0]), ValueError, "q: got shape (2, 128); need shape (tokens, heads >= 1, 128)"),
    (_set("k", lambda x: x[:, :1]), ValueError, "k: got shape (8, 1, 128); need q's shape (8, 2, 128)"),
    (_set("v", lambda x: x[:7]), ValueError, "v: got shape (7, 2, 128); need q's shape (8, 2, 128)"),
    (_set("k", lambda x: x.transpose(0, 1).contiguous().transpose(0, 1)), ValueError, "k: got strides (128, 1024, 1)"),
    (_set("k", lambda x: torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)[1:].view(x.shape)), ValueError,
     "k: got base address 0x"),  # contiguous, 2 bytes off: the passes read 8-byte quads
    (_set("cu_seqlens", lambda x: x.long()), TypeError, "cu_seqlens: got torch.int64; need int32"),
    (_set("cu_seqlens", lambda x: x[None]), ValueError, "cu_seqlens: got shape (1, 4); need shape (segments + 1,)"),
    (_set("softmax_scale", lambda x: 0.0), ValueError, "softmax_scale: got 0.0; need a positive float"),
    (_set("softmax_scale", lambda x: float("nan")), ValueError, "softmax_scale: got nan"),
    (_set("softmax_scale", lambda x: 1e39), ValueError, "softmax_scale: got 1e+39"),
    (_set("softmax_scale", lambda x: "0.1"), TypeError, "softmax_scale: got '0.1'; need a positive finite float"),
    (_set("softmax_scale", lambda x: True), TypeError, "softmax_scale: got True; need a positive finite float"),
    (_set("softmax_scale", lambda x: [0.1]), TypeError, "softmax_scale: got [0.1]; need a positive finite float"),
    (_set("cu_seqlens_host", lambda x: [1, 3, 3, 8]), ValueError, "cu_seqlens_host: got first entry 1; need 0"),
    (_set("cu_seqlens_host", lambda x: [0, 4, 3, 8]), ValueError,
     "cu_seqlens_host: got entries 4, 3 at 1, 2; need non-decreasing entries"),
    (_set("cu_seqlens_host", lambda x: [0, 3, 3, 9]), ValueError,
     "cu_seqlens_host: got last entry 9; need tokens = 8 (q.shape[0])"),
    (_set("cu_seqlens_host", lambda x: [0, 3, 8]), ValueError, "cu_seqlens_host: got 3 entries; need 4, as cu_seqlens"),
    (_set("cu_seqlens_host", lambda x: ["a", 3, 3, 8]), TypeError,
     "cu_seqlens_host: got list; need a sequence of ints"),
]
def _out(make):
    """A bad out, made from q and filled with 7 (the poison the GPU test checks)."""
    def mutate(a):
        a["out"] = make(a["q"]).fill_(7)
        return a
    return mutate


BAD += [
    (_out(lambda q: torch.empty(8, 2, 128, dtype=torch.float32, device=q.device)), TypeError,
     "out: got torch.float32; need bfloat16"),
    (_out(lambda q: torch.empty(8, 2, 64, dtype=torch.bfloat16, device=q.device)), ValueError,
     "out: got shape (8, 2, 64); need shape (8, 2, 128)"),
    (_out(lambda q: torch.empty(2, 8, 128, dtype=torch.bfloat16, device=q.device).transpose(0, 1)), ValueError,
     "out: got strides (128, 1024, 1); need a contiguous array"),
]


def _check(args):
    return A.check_call(args["q"], args["k"], args["v"], args["cu_seqlens"], args["out"],
                        args["cu_seqlens_host"], args["softmax_scale"])


@pytest.mark.parametrize("mutate,exc,msg", BAD, ids=[f"bad-{i}" for i in range(len(BAD))])
# softmax_scale 1e39 overflows in its FP32 conversion inside the check that refuses it
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_bad_arguments_are_named(mutate, exc, msg):
    with pytest.raises(exc, match="^" + re.escape(msg)):
        _check(mutate(_args()))


def test_good_arguments_pass_the_checks():
    tokens, heads, scale, cu = _check(_args())
    assert (tokens, heads, cu) == (8, 2, (0, 3, 3, 8)) and scale == 1 / math.sqrt(128)
    args = _args()
    args["cu_seqlens_host"] = np.array([0, 3, 3, 8])  # a numpy array or CPU tensor also serves
    assert _check(args)[3] == (0, 3, 3, 8)


def test_cpu_tensors_are_refused_before_anything_runs():
    args = _args()
    with pytest.raises(ValueError, match=r"^q: got a tensor on cpu; need a CUDA tensor"):
        h3kernels.minimax_h3_varlen_attention_fp8(**args)
    assert h3kernels.minimax_h3_sm120_varlen_attention_fp8 is h3kernels.minimax_h3_varlen_attention_fp8


def test_workspace_bytes_before_any_call_is_0_and_needs_no_gpu():
    """A fresh process, no device visible: nothing held, and nothing asks the driver."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    code = "import h3kernels; print(h3kernels.workspace_bytes(), h3kernels.workspace_bytes('cuda:3'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.split() == ["0", "0"], out.stdout + out.stderr[-2000:]


# --- GPU ----------------------------------------------------------------------------------------

def test_chunked_exact_equals_the_reference_exact(seed):
    q, k, v, _, cu = make_attention_inputs([5, 0, 40], 2, device="cpu", seed=seed)
    assert torch.allclose(exact_attention(q, k, v, cu, chunk=16), R.attention_exact(q, k, v, cu), rtol=0, atol=1e-12)


def test_attention_misses_name_what_is_out_of_bounds(seed):
    """checks.attention_misses passes the reference's own output and names an unwritten element, a
    one-block segment 1% off (its bound is 0.005) and a whole set 5% off (0.03)."""
    q, k, v, _, cu = make_attention_inputs([1, 60, 0, 200], 2, device="cpu", seed=seed)
    want = R.attention_fp8(q, k, v, cu)
    assert attention_misses(want, q, k, v, cu) == []
    g = torch.Generator().manual_seed(seed)
    noisy = lambda t, rel: (t.float() * (1 + rel * torch.randn(t.shape, generator=g))).bfloat16()
    unwritten = want.clone()
    unwritten[70, 1, 3] = float("nan")
    one_block = want.clone()
    one_block[1:61] = noisy(want[1:61], 0.01)
    everywhere = noisy(want, 0.05)
    for got, what in ((unwritten, "non-finite"), (one_block, "segment 1 (60 keys)"), (everywhere, "all rows")):
        misses = attention_misses(got, q, k, v, cu)
        assert any(m[0].startswith(what) for m in misses), (what, misses)


def run_op(q, k, v, cu_dev, cu, *, host=True, give_out=True, **kw):
    """The operator, into a NaN-poisoned out when give_out."""
    out = poisoned_like(q) if give_out else None
    res = h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, out, cu_seqlens_host=cu if host else None, **kw)
    if give_out:
        assert res is out
    return res


@pytest.mark.gpu
def test_every_form_gives_the_same_bits(seed):
    """Every mma.sync form this board builds (0; and 2 on sm_120a) gives the same bits, and
    fp8_mma_form -1 those of the form it picks (3, the wgmma family, on compute capability 9.0)."""
    from h3kernels._runtime import targets
    from h3kernels.peers import mma_ceiling

    q, k, v, cu_dev, cu = make_attention_inputs([300, 0, 129, 64], 4, device="cuda", seed=seed)
    chosen = targets.operator_form(torch.cuda.current_device(), -1)
    forms = (-1, chosen) + tuple(f for f in mma_ceiling.supported_forms() if f in (0, 2) and f != chosen)
    outs = [run_op(q, k, v, cu_dev, cu, fp8_mma_form=form) for form in forms]
    torch.cuda.synchronize()
    assert torch.isfinite(outs[0].float()).all()
    assert same_bits(outs[1], outs[0]), chosen
    sync = [o for f, o in zip(forms, outs) if f in (0, 2)]
    for o in sync[1:]:
        assert same_bits(o, sync[0])


def check_accuracy(seqlens, heads, k_offset=0.0, seed=0, host=True, give_out=True, form=-1, q_scale=1.0):
    """Random inputs of that seed through the operator (fp8_mma_form `form`), within the settled
    bounds: rel L2 from the reference at most checks.reference_bound (0.005 for the rows of
    segments of one key block, 0.03 on longer ones), against exact attention at most 1.1x the
    reference's, every element written."""
    q, k, v, cu_dev, cu = make_attention_inputs(seqlens, heads, device="cuda", seed=seed, k_offset=k_offset,
                                                q_scale=q_scale)
    got = run_op(q, k, v, cu_dev, cu, host=host, give_out=give_out, fp8_mma_form=form)
    torch.cuda.synchronize()
    misses = attention_misses(got, q, k, v, cu)
    assert not misses, misses
    return got


SEGMENT_SETS = [
    ([0, 1, 127, 128, 129, 4096], 1),
    ([0, 1, 127, 128, 129, 4096], 8),
    ([0, 1, 127, 128, 129, 4096], 56),
    ([0, 300, 0, 77, 1, 0], 8),  # empty segments at the start, in the middle and at the end
    ([16384], 8),
]


@pytest.mark.gpu
@pytest.mark.parametrize("seqlens,heads", SEGMENT_SETS, ids=[f"{len(s)}seg-{h}h" for s, h in SEGMENT_SETS])
def test_matches_reference_and_exact(seqlens, heads, seed):
    check_accuracy(seqlens, heads, seed=seed)


def board_forms():
    """Every fp8_mma_form this GPU runs (none without one): the accuracy sets run on each family."""
    if not torch.cuda.is_available():
        return [-1]
    from h3kernels._runtime import targets
    from h3kernels.peers import mma_ceiling

    dev = torch.cuda.current_device()
    extra = [targets.WGMMA_FORM] if targets.device_arch(dev) == "sm_90" else []
    return sorted(set(mma_ceiling.supported_forms(dev)) | set(extra))


@pytest.mark.gpu
@pytest.mark.parametrize("form", board_forms())
@pytest.mark.parametrize("seqlens,heads,k_offset,q_scale", [([0, 1, 127, 128, 129, 4096], 8, 0.0, 1.0),
                                                            ([7000, 3000, 6000, 384], 4, 0.0, 1.0),
                                                            ([0, 1, 127, 128, 129, 2000], 8, 40.0, 1.0),
                                                            ([0, 1, 127, 128, 129, 2000], 8, 10.0, 3.0)],
                         ids=["short-and-long", "mixed", "k-offset-40", "k-offset-10-q-times-3"])
def test_every_family_within_the_bounds(seqlens, heads, k_offset, q_scale, form, seed):
    """The settled bounds hold for every kernel family of this board, not only the one -1 picks."""
    check_accuracy(seqlens, heads, k_offset=k_offset, seed=seed, form=form, q_scale=q_scale)


@pytest.mark.gpu
def test_64_random_segments(seed):
    lens = np.random.default_rng(seed).integers(0, 700, 64).tolist()
    check_accuracy(lens, 8, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [1, 56])
def test_large_per_channel_key_offset(heads, seed):
    check_accuracy([0, 1, 127, 128, 129, 2000], heads, k_offset=40.0, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("host,give_out", [(False, True), (True, False), (False, False)])
def test_without_host_seqlens_or_out(host, give_out, seed):
    check_accuracy([5, 0, 333, 64], 8, seed=seed, host=host, give_out=give_out)


@pytest.mark.gpu
def test_softmax_scale_and_zero_scales(seed):
    q, k, v, cu_dev, cu = make_attention_inputs([200, 0, 130], 8, device="cuda", seed=seed)
    q[3] = 0  # s_q = 0 rows
    # s_k = 0 needs k' = k - mu = 0: a constant block inside a varying segment still has k' != 0,
    # so the whole third segment [200, 330) is constant for head 1 (mu = 2.5 exactly, both blocks 0)
    k[200:330, 1] = 2.5
    v[:, 2, 7] = 0  # a zero V channel: s_v = 0
    got = run_op(q, k, v, cu_dev, cu, softmax_scale=0.3)
    want = R.attention_fp8(q, k, v, cu, softmax_scale=0.3)
    torch.cuda.synchronize()
    assert torch.isfinite(got.float()).all()
    assert rel_l2(got, want) <= 0.02, rel_l2(got, want)
    assert (got[:, 2, 7] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("seqlens,heads,k_offset", [([0, 1, 127, 128, 129, 4096], 8, 0.0),
                                                   ([300, 0, 77, 1, 2000], 56, 40.0), ([8192], 2, 0.0)])
def test_lse_matches_float64(seqlens, heads, k_offset, seed):
    """The operator's lse against the float64 lse of the reference's own scores (FP32 rounding
    only) and of the unquantized scores (what FP8 costs), out unchanged by return_lse."""
    q, k, v, cu_dev, cu = make_attention_inputs(seqlens, heads, device="cuda", seed=seed, k_offset=k_offset)
    plain = run_op(q, k, v, cu_dev, cu)
    out, lse = h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, cu_seqlens_host=cu, return_lse=True)
    torch.cuda.synchronize()
    assert same_bits(out, plain)
    assert lse.shape == (heads, q.shape[0]) and lse.dtype == torch.float32 and lse.is_cuda
    lse = lse.cpu().double()
    assert torch.isfinite(lse).all()
    qc, kc, vc = q.cpu(), k.cpu(), v.cpu()
    own = dequantized_lse64(qc, kc, vc, cu)
    assert (lse - own).abs().max() <= 1e-4 * (1 + own.abs().max()), (lse - own).abs().max()
    exact = R.lse_exact(qc, kc, cu)
    assert (lse - exact).abs().max() <= 0.05 and (lse - exact).abs().mean() <= 0.01


@pytest.mark.gpu
def test_lse_with_out_aliasing_q(seed):
    """out = q: the kernel reads each q element for the lse before the same thread writes that
    element of out."""
    q, k, v, cu_dev, cu = make_attention_inputs([700, 0, 129], 8, device="cuda", seed=seed, k_offset=10.0)
    want = h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, cu_seqlens_host=cu, return_lse=True)
    q2 = q.clone()
    got = h3kernels.minimax_h3_varlen_attention_fp8(q2, k, v, cu_dev, q2, cu_seqlens_host=cu, return_lse=True)
    torch.cuda.synchronize()
    assert got[0] is q2 and same_bits(q2, want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
def test_kernel_partial_attention_matches_the_reference_partial(seed):
    """The ring's step on the GPU (kernel_partial_attention: the cross plan, the caller's key mean
    and V amax) against the reference's, the rank boundary 256 keys into a segment so that both
    use the whole segment's K scale grid."""
    from h3kernels._runtime import targets
    from h3kernels.parallel import local_seqlens
    from h3kernels.parallel.local import kernel_partial_attention, reference_partial_attention

    q, k, v, _, cu = make_attention_inputs([70, 0, 1286, 5], 8, device="cuda", seed=seed, k_offset=5.0)
    mean = R.segment_key_means(k.cpu(), cu).cuda()
    amax = torch.stack([v[a:b].float().abs().amax(0) if b > a else torch.zeros(8, 128, device="cuda")
                        for a, b in zip(cu, cu[1:])])
    cu_q, cu_k = local_seqlens(cu, 0, 326), local_seqlens(cu, 326, 1035)
    args = (q[:326].contiguous(), k[326:].contiguous(), v[326:].contiguous(), cu_q, cu_k, HEAD_DIM ** -0.5, mean,
            amax, None)
    got, got_lse = kernel_partial_attention(*args)
    want, want_lse = reference_partial_attention(*args)
    torch.cuda.synchronize()
    assert (got[:70] == 0).all() and torch.isinf(got_lse[:, :70]).all()  # no keys for segment 0 here
    assert rel_l2(got[70:], want[70:]) <= 0.03, rel_l2(got[70:], want[70:])
    assert (got_lse[:, 70:] - want_lse[:, 70:]).abs().max() <= 1e-4 * (1 + want_lse[:, 70:].abs().max())
    # the whole segments' K scales given, one per 128-key block of cu_k: here those the K pass
    # computes itself (the boundary lies on the grid)
    s_k = R.quantize_attention_inputs(q[:0].cpu(), k.cpu(), v.cpu(), cu, k_mean=mean.cpu(), v_amax=amax.cpu())[3]
    blocks = s_k[326 + torch.as_tensor(P.key_blocks(cu_k)[:, 1])].cuda()
    given = kernel_partial_attention(*args[:-1], blocks)
    assert same_bits(given[0], got) and torch.equal(given[1], got_lse)
    # scales 1.5 times as large (a power of two would scale the codes exactly): another
    # quantization of K, as the reference's with those scales
    given = kernel_partial_attention(*args[:-1], 1.5 * blocks)
    want, want_lse = reference_partial_attention(*args[:-1], 1.5 * blocks)
    assert not same_bits(given[0], got) and rel_l2(given[0][70:], want[70:]) <= 0.03
    assert (given[1][:, 70:] - want_lse[:, 70:]).abs().max() <= 1e-4 * (1 + want_lse[:, 70:].abs().max())
    # exact_lse=False: the same out; on the wgmma form the lse of the tensor core's sum of the
    # rounded P, each P within 2^-4 of its value (e4m3), so within -ln(1 - 2^-4) of the true lse
    # (the mma.sync forms' lse is the true one either way)
    fast = kernel_partial_attention(*args, exact_lse=False)
    diff = (fast[1][:, 70:] - got_lse[:, 70:]).abs().max().item()
    print(f"lse of the rounded P's sum against the true lse: max |diff| {diff:.2e}")
    assert same_bits(fast[0], got) and torch.isinf(fast[1][:, :70]).all()
    wgmma = targets.form_family(targets.operator_form(q.device.index or 0, -1)) == targets.WGMMA
    assert 0 < diff <= -math.log(1 - 2 ** -4) if wgmma else diff == 0


@pytest.mark.gpu
def test_lse_of_no_tokens_and_the_torch_op(seed):
    from h3kernels import torch_ops

    q = torch.empty(0, 4, 128, dtype=torch.bfloat16, device="cuda")
    out, lse = h3kernels.minimax_h3_varlen_attention_fp8(q, q, q, torch.zeros(1, dtype=torch.int32, device="cuda"),
                                                         return_lse=True)
    assert out.shape == (0, 4, 128) and lse.shape == (4, 0) and lse.dtype == torch.float32
    q, k, v, cu_dev, cu = make_attention_inputs([5, 0, 300], 8, device="cuda", seed=seed)
    want = h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, cu_seqlens_host=cu, return_lse=True)
    got = torch_ops.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, cu, return_lse=True)
    assert same_bits(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
def test_tokens_zero_returns_empty():
    q = torch.empty(0, 56, 128, dtype=torch.bfloat16, device="cuda")
    cu = torch.zeros(1, dtype=torch.int32, device="cuda")
    res = h3kernels.minimax_h3_varlen_attention_fp8(q, q, q, cu)
    assert res.shape == (0, 56, 128) and res.dtype == torch.bfloat16 and res.is_cuda
    out = torch.empty(0, 56, 128, dtype=torch.bfloat16, device="cuda")
    assert h3kernels.minimax_h3_varlen_attention_fp8(q, q, q, torch.zeros(3, dtype=torch.int32, device="cuda"), out,
                                                    cu_seqlens_host=[0, 0, 0]) is out


@pytest.mark.gpu
def test_repeated_runs_are_bitwise_identical(seed):
    q, k, v, cu_dev, cu = make_attention_inputs([3000, 1, 1000], 56, device="cuda", seed=seed)
    first = run_op(q, k, v, cu_dev, cu)
    for _ in range(3):
        again = run_op(q, k, v, cu_dev, cu)
        torch.cuda.synchronize()
        assert same_bits(first, again)


@pytest.mark.gpu
def test_callers_stream_and_kind_give_the_same_bits(seed, array_kind):
    """On a new stream of the caller's kind, q written there behind a delay (a launch on any other
    stream would read its NaN poison), with cu_seqlens_host and without: the default stream's bits,
    in an array of the caller's kind."""
    q, k, v, cu_dev, cu = make_attention_inputs([100, 0, 700], 8, device="cuda", seed=seed)
    want = run_op(q, k, v, cu_dev, cu)
    torch.cuda.synchronize()
    cq, ck, cv, ccu = (array_kind.to(t) for t in (q, k, v, cu_dev))
    for host in (cu, None):
        q_late = array_kind.nan_like(cq)
        with array_kind.side_stream():
            array_kind.delay()
            array_kind.write(q_late, cq)
            got = h3kernels.minimax_h3_varlen_attention_fp8(q_late, ck, cv, ccu, cu_seqlens_host=host)
        assert got.shape == (800, 8, 128)
        assert same_bits(array_kind.torch(got, torch.bfloat16), want), host


@pytest.mark.gpu
def test_two_streams_at_once_match_serial_runs(seed):
    cases = [make_attention_inputs([4096, 100], 56, device="cuda", seed=seed),
             make_attention_inputs([129, 2500], 8, device="cuda", seed=seed + 1)]
    serial = [run_op(q, k, v, cu_dev, cu) for q, k, v, cu_dev, cu in cases]
    torch.cuda.synchronize()
    plans = h3kernels.workspace_bytes()  # the two plans, on the device
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = [poisoned_like(c[0]) for c in cases]
    torch.cuda.synchronize()
    for _ in range(3):
        for (q, k, v, cu_dev, cu), out, s in zip(cases, outs, streams):
            with torch.cuda.stream(s):
                h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, out, cu_seqlens_host=cu)
    torch.cuda.synchronize()
    for out, want in zip(outs, serial):
        assert same_bits(out, want)
    assert h3kernels.workspace_bytes() == plans  # each call's scratch went back to torch's allocator


def _device_cu(values):
    """cu_seqlens given on the device only (read back once, then checked like a host copy)."""
    def mutate(a):
        a["cu_seqlens_host"] = None
        a["cu_seqlens"] = torch.tensor(values, dtype=torch.int32, device=a["q"].device)
        return a
    return mutate


def _on_second_gpu(name):
    def mutate(a):
        if torch.cuda.device_count() < 2:
            pytest.skip("needs a second GPU")
        a[name] = a[name].to("cuda:1")
        return a
    return mutate


BAD_GPU = [(m, e, s) for m, e, s in BAD] + [
    (_set("q", lambda x: x.cpu()), ValueError, "q: got a tensor on cpu; need a CUDA tensor"),
    (_on_second_gpu("k"), ValueError, "k: got an array on cuda:1 while q is on cuda:0; need one device"),
    (_device_cu([1, 3, 3, 8]), ValueError, "cu_seqlens: got first entry 1; need 0"),
    (_device_cu([0, 4, 3, 8]), ValueError, "cu_seqlens: got entries 4, 3 at 1, 2; need non-decreasing entries"),
    (_device_cu([0, 3, 3, 7]), ValueError, "cu_seqlens: got last entry 7; need tokens = 8 (q.shape[0])"),
    (_set("cu_seqlens", lambda x: x.cpu()), ValueError, "cu_seqlens: got a tensor on cpu; need a CUDA tensor"),
    (_set("cu_seqlens_host", lambda x: torch.tensor(x, dtype=torch.int32, device="cuda")), TypeError,
     "cu_seqlens_host: got a torch device array; need a host sequence of ints"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("mutate,exc,msg", BAD_GPU, ids=[f"bad-{i}" for i in range(len(BAD_GPU))])
def test_gpu_bad_arguments_raise_before_launch_and_leave_out_untouched(mutate, exc, msg):
    args = _args("cuda")
    args["out"] = torch.full((8, 2, 128), 7.0, dtype=torch.bfloat16, device="cuda")  # a bad out replaces it
    args = mutate(args)
    before = h3kernels.workspace_bytes()
    with pytest.raises(exc, match="^" + re.escape(msg)):
        h3kernels.minimax_h3_varlen_attention_fp8(**args)
    torch.cuda.synchronize()
    assert (args["out"] == 7).all() and h3kernels.workspace_bytes() == before


@pytest.mark.gpu
def test_device_cu_seqlens_are_checked_after_one_copy():
    args = _args("cuda")
    args["cu_seqlens_host"] = None
    args["cu_seqlens"] = torch.tensor([0, 3, 3, 9], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match=r"^cu_seqlens: got last entry 9; need tokens = 8"):
        h3kernels.minimax_h3_varlen_attention_fp8(**args)


def test_reference_rows_are_the_references(seed):
    """checks.reference_rows (what bench/ compares ours with at long segments) computes the
    reference for sampled query rows only; those rows must be the whole-set reference's, bit for bit."""
    q, k, v, _, cu = make_attention_inputs([5, 0, 200, 130], 3, device="cpu", seed=seed, k_offset=5.0)
    want = R.attention_fp8(q, k, v, cu, softmax_scale=0.2)
    idx = torch.tensor([0, 4, 5, 6, 100, 204, 205, 300, 334])
    got = reference_rows(q, k, v, cu, idx, softmax_scale=0.2, chunk=2)
    assert same_bits(got, want[idx])


@pytest.mark.gpu
def test_ring_statistics_passes(seed):
    """The ring's statistics of a rank's keys on the GPU: each segment's key sums (FP32, to their
    order of addition) and amax |v| (bitwise), and the K scale RN(amax |k - mean| / 448) of each
    block of the whole segments' 128-key grid (bitwise), keys starting inside a block and a
    segment with none."""
    from h3kernels._launch.varlen_attention_fp8_plan import grid_blocks
    from h3kernels.varlen_attention_fp8 import (minimax_h3_varlen_attention_fp8_key_block_scales,
                                                minimax_h3_varlen_attention_fp8_segment_sums)

    _, k, v, _, cu = make_attention_inputs([130, 5, 0, 200, 60], 4, device="cuda", seed=seed, k_offset=3.0)
    sums, amax = minimax_h3_varlen_attention_fp8_segment_sums(k, v, cu)
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        want = k[a:b].float().sum(0) if b > a else torch.zeros_like(sums[i])
        assert torch.allclose(sums[i], want, rtol=1e-5, atol=1e-4), i
        assert same_bits(amax[i], v[a:b].float().abs().amax(0) if b > a else torch.zeros_like(amax[i])), i
    mean = sums / torch.tensor([max(b - a, 1) for a, b in zip(cu, cu[1:])], device="cuda")[:, None, None]
    firsts = (0, 5, 33, 198, 127)
    got = minimax_h3_varlen_attention_fp8_key_block_scales(k, cu, mean, firsts)
    blocks = grid_blocks(tuple(cu), firsts)[1]
    amax = torch.stack([(k[f:f + c].float() - mean[s]).abs().amax(dim=(0, 2)) for s, f, c in blocks.tolist()])
    want = R.div(amax, 448.0)
    assert got.shape == (8, 4) and same_bits(got, want)
