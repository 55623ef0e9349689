"""Reference of minimax_h3_varlen_attention_fp8 (docs/spec.md, Attention): the
quantization of q, k (mean-centred per segment, scaled per 128-key block) and v (per segment and
channel), then softmax attention with P rounded to e4m3. The operator checks its arguments as
the GPU one does (h3kernels._validate.varlen_attention_fp8); attention_fp8 is the unchecked
computation, and attention_exact the float64 yardstick."""
import torch

from h3kernels import _validate as validate
from h3kernels._validate import varlen_attention_fp8 as checks
from h3kernels.constants import E4M3_MAX, K_BLOCK
from h3kernels.quantize import F32, bf16, div, e4m3, quantize_rows


def _segments(cu_seqlens):
    cu = [int(c) for c in cu_seqlens.tolist()] if torch.is_tensor(cu_seqlens) else list(cu_seqlens)
    return list(zip(cu[:-1], cu[1:]))


def key_mean(ks):
    """FP32 mean over a segment's keys [L, heads, 128] in the K pass's order: the keys of each
    128-key block (from the segment's start) added in token order, the block sums added in block
    order, then RN(sum / L)."""
    total = torch.zeros_like(ks[0])
    for b0 in range(0, ks.shape[0], K_BLOCK):
        part = torch.zeros_like(ks[0])
        for t in range(b0, min(b0 + K_BLOCK, ks.shape[0])):
            part = part + ks[t]
        total = total + part
    return div(total, ks.shape[0])


def quantize_attention_inputs(q, k, v, cu_seqlens, k_mean=None, v_amax=None, k_scale=None):
    """Returns (q8, s_q, k8, s_k, v8, s_v) as docs/spec.md defines them.

    q8, k8, v8: e4m3 [tokens, heads, 128]; s_q: f32 [tokens, heads];
    s_k: f32 [tokens, heads] (the scale of the 128-key block each key belongs to);
    s_v: f32 [tokens, heads, 128] (its segment's per-channel scale, repeated per key).
    cu_seqlens: a tensor or a host sequence, unchecked.
    k_mean, v_amax: f32 [segments, heads, 128] given from outside (a segment spread over several
    ranks: its mean and |v| maximum over all of its keys), in place of this segment's own
    key_mean and amax |v|; k_scale: f32 [tokens, heads], each key's K scale given (that of its
    128-key block of the whole segment), in place of blocks from each segment's start here.
    """
    q8, s_q = quantize_rows(q)
    k8 = torch.empty_like(k, dtype=torch.float8_e4m3fn)
    s_k = torch.empty(k.shape[:2], dtype=F32, device=k.device)
    v8 = torch.empty_like(v, dtype=torch.float8_e4m3fn)
    s_v = torch.empty(v.shape, dtype=F32, device=v.device)
    for i, (a, b) in enumerate(_segments(cu_seqlens)):
        if a == b:
            continue
        ks = k[a:b].to(F32)
        kc = ks - (key_mean(ks) if k_mean is None else k_mean[i].to(F32))[None]
        for blk in range(a, b, K_BLOCK):
            e = min(blk + K_BLOCK, b)
            part = kc[blk - a:e - a]  # [n, heads, 128]
            if k_scale is None:
                s = div(part.abs().amax(dim=(0, 2)), E4M3_MAX)[None].expand(e - blk, -1)  # [n, heads]
            else:
                s = k_scale[blk:e].to(F32)
            safe = torch.where(s > 0, s, torch.ones_like(s))
            k8[blk:e] = e4m3(torch.where(s[:, :, None] > 0, part / safe[:, :, None], 0.0))
            s_k[blk:e] = s
        vs = v[a:b].to(F32)
        s = div(vs.abs().amax(dim=0) if v_amax is None else v_amax[i].to(F32), E4M3_MAX)  # [heads, 128]
        safe = torch.where(s > 0, s, torch.ones_like(s))
        v8[a:b] = e4m3(torch.where(s[None] > 0, vs / safe[None], 0.0))
        s_v[a:b] = s
    return q8, s_q, k8, s_k, v8, s_v


def segment_key_means(k, cu_seqlens):
    """key_mean of every segment: f32 [segments, heads, 128] (zeros for an empty segment)."""
    segs = _segments(cu_seqlens)
    out = torch.zeros((len(segs), *k.shape[1:]), dtype=F32, device=k.device)
    for i, (a, b) in enumerate(segs):
        if b > a:
            out[i] = key_mean(k[a:b].to(F32))
    return out


def _attend(q8, s_q, k8, s_k, v8, s_v, qa, qb, ka, kb, scale, res, lse, query_chunk):
    """Rows qa .. qb of q8 against keys ka .. kb of k8 (one segment): res[qa:qb] (bf16) and,
    when lse is given, lse[:, qa:qb] = the log-sum-exp of the mean-centred scores (FP32)."""
    kf = k8[ka:kb].to(F32).transpose(0, 1)  # [heads, L, 128]
    vf = v8[ka:kb].to(F32).transpose(0, 1)
    sk = s_k[ka:kb].T  # [heads, L]
    sv = s_v[ka].to(F32)  # [heads, 128]
    for c in range(qa, qb, query_chunk):
        e = min(c + query_chunk, qb)
        qf = q8[c:e].to(F32).transpose(0, 1)  # [heads, n, 128]
        s = ((qf @ kf.transpose(1, 2)) * s_q[c:e].T[:, :, None]) * sk[:, None, :] * scale
        mx = s.amax(dim=-1, keepdim=True)
        p = torch.exp(s - mx)
        l = p.sum(dim=-1)
        o = e4m3(256.0 * p).to(F32) @ vf
        res[c:e] = bf16(o * sv[:, None, :] / (256.0 * l[:, :, None])).transpose(0, 1)
        if lse is not None:
            lse[:, c:e] = mx[..., 0] + torch.log(l)


def mean_shift(q, k_mean, softmax_scale):
    """softmax_scale * q . k_mean per query row and head: f32 [heads, n] for q [n, heads, 128]
    and k_mean [heads, 128] (what the mean-centred scores lack of the true ones)."""
    return ((q.to(F32) * k_mean[None].to(F32)).sum(dim=-1) * softmax_scale).T


def attention_fp8(q, k, v, cu_seqlens, softmax_scale=None, out=None, query_chunk=1024, return_lse=False):
    """The computation of minimax_h3_varlen_attention_fp8, unchecked: cu_seqlens a tensor or a
    host sequence, the tensors on any one device; queries in chunks of query_chunk rows. With
    return_lse, (out, lse): lse f32 [heads, tokens], the natural log-sum-exp of the true scores
    softmax_scale * q . k (the smoothing shift softmax_scale * q . mean(K) added back)."""
    return attention_fp8_partial(q, k, v, cu_seqlens, cu_seqlens, softmax_scale, out=out, query_chunk=query_chunk,
                                 return_lse=return_lse)


def attention_fp8_partial(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale=None, k_mean=None, v_amax=None,
                          k_scale=None, out=None, query_chunk=1024, return_lse=True):
    """Attention of the queries of segment i of q (rows cu_seqlens_q[i] .. cu_seqlens_q[i + 1])
    to the keys and values of segment i of k, v (rows cu_seqlens_k[i] .. cu_seqlens_k[i + 1]),
    unchecked: the local step of ring attention, where a rank's queries meet another rank's
    key block and one segment's tokens are spread over ranks. k_mean and v_amax (f32 [segments,
    heads, 128]) are the whole segment's key mean and amax |v| (an all-reduce over the ranks),
    k_scale (f32 [k tokens, heads]) each key's scale on the whole segment's 128-key blocks; None:
    those of the keys given. Returns (out bf16 [q tokens, heads, 128], lse f32 [heads, q
    tokens]) with lse of the true scores; rows whose segment has no keys here get out 0 and lse
    -inf (weight 0 in a merge). With cu_seqlens_q == cu_seqlens_k and no k_mean, v_amax it is
    attention_fp8 bit for bit."""
    scale = checks.softmax_scale(softmax_scale)
    res = torch.empty_like(q) if out is None else out
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=F32, device=q.device) if return_lse else None
    segs_q, segs_k = _segments(cu_seqlens_q), _segments(cu_seqlens_k)
    if len(segs_q) != len(segs_k):
        raise ValueError(f"cu_seqlens_k: got {len(segs_k)} segments; need {len(segs_q)}, as cu_seqlens_q")
    if q.shape[0]:
        means = segment_key_means(k, cu_seqlens_k) if k_mean is None and return_lse else k_mean
        q8, s_q = quantize_rows(q)
        _, _, k8, s_k, v8, s_v = quantize_attention_inputs(q[:0], k, v, cu_seqlens_k, k_mean, v_amax, k_scale)
        for i, ((qa, qb), (ka, kb)) in enumerate(zip(segs_q, segs_k)):
            if qa == qb:
                continue
            if ka == kb:
                res[qa:qb] = 0
                continue
            _attend(q8, s_q, k8, s_k, v8, s_v, qa, qb, ka, kb, scale, res, lse, query_chunk)
            if lse is not None:
                lse[:, qa:qb] += mean_shift(q[qa:qb], means[i], scale)
    return (res, lse) if return_lse else res


def minimax_h3_varlen_attention_fp8(q, k, v, cu_seqlens, out=None, *, cu_seqlens_host=None, softmax_scale=None,
                                    fp8_mma_form=-1, return_lse=False):
    """Non-causal packed-varlen FP8 attention (docs/spec.md, Attention), as
    h3kernels.minimax_h3_varlen_attention_fp8: q, k, v bf16 [tokens, heads, 128], cu_seqlens int32
    [segments + 1] (its values read back unless cu_seqlens_host is given); returns out, or
    (out, lse) with return_lse (lse f32 [heads, tokens] of the true scores). Every valid
    fp8_mma_form gives the same result."""
    want_lse = checks.return_lse(return_lse)
    tokens, _ = checks.check_args(q, k, v, cu_seqlens, out, validate.TORCH_TENSORS)
    scale = checks.softmax_scale(softmax_scale)
    checks.fp8_mma_form(fp8_mma_form)
    validate.one_device(dict(q=q, k=k, v=v, cu_seqlens=cu_seqlens, out=out))
    cu = checks.host_seqlens(cu_seqlens, cu_seqlens_host, tokens, cu_seqlens.tolist)
    return attention_fp8(q, k, v, cu, scale, out, return_lse=want_lse)


def attention_exact(q, k, v, cu_seqlens, softmax_scale=None):
    """Unquantized float64 softmax attention, the yardstick of the quantized paths (unchecked)."""
    scale = checks.softmax_scale(softmax_scale)
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    for a, b in _segments(cu_seqlens):
        if a == b:
            continue
        qs, ks, vs = (t[a:b].to(torch.float64).transpose(0, 1) for t in (q, k, v))
        p = torch.softmax((qs @ ks.transpose(1, 2)) * scale, dim=-1)
        out[a:b] = (p @ vs).transpose(0, 1)
    return out


def lse_exact(q, k, cu_seqlens, softmax_scale=None):
    """float64 log-sum-exp of the unquantized scores softmax_scale * q . k per row: [heads, tokens]
    (unchecked), the yardstick of the operators' lse."""
    scale = checks.softmax_scale(softmax_scale)
    out = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float64, device=q.device)
    for a, b in _segments(cu_seqlens):
        if a == b:
            continue
        for h in range(q.shape[1]):  # one head at a time: [L, L] float64 scores
            qs, ks = (t[a:b, h].to(torch.float64) for t in (q, k))
            out[h, a:b] = torch.logsumexp((qs @ ks.T) * scale, dim=-1)
    return out
