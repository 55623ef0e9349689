"""minimax_h3_varlen_attention_fp8: packed-varlen FP8 attention (docs/spec.md, Attention).

One call: validate every argument (nothing is launched before), take the segment plan (host,
cached; no device sync when cu_seqlens_host is given), then on the caller's stream the Numba
quantization passes into scratch memory from the caller's allocator and the CUDA kernel of
cuda_src/varlen_attention_fp8.cu (form 3: cuda_src/varlen_attention_fp8_sm90a.cu) into `out`
(h3kernels/_launch/varlen_attention_fp8.py; the memory model in h3kernels/_runtime/workspace.py).
"""
from h3kernels._launch import varlen_attention_fp8 as launch
from h3kernels._runtime import arrays, targets, workspace
from h3kernels._validate import varlen_attention_fp8 as checks
from h3kernels.constants import HEAD_DIM


def minimax_h3_varlen_attention_fp8(q, k, v, cu_seqlens, out=None, *, cu_seqlens_host=None, softmax_scale=None,
                                    fp8_mma_form=-1, return_lse=False):
    """Non-causal FP8 attention over the segments [cu_seqlens[i], cu_seqlens[i + 1]) of packed
    q, k, v (bf16 [tokens, heads, 128], torch CUDA tensors or CuPy arrays). Returns `out` (bf16
    [tokens, heads, 128], allocated when None) of the caller's kind. Work runs on the caller's
    current stream; with `cu_seqlens_host` (a host copy of cu_seqlens) there is no device sync,
    without it one device-to-host copy of cu_seqlens. `out` may alias q, k or v: the kernel reads
    only the quantized copies. fp8_mma_form: as minimax_h3_mlp_fp8's (-1 the board's form, 0 the
    legacy e4m3 mma, 2 kind::mxf8f6f4 on sm_120a, 3 the wgmma + TMA kernel on sm_90a); forms 0
    and 2 give the same bits; form 3, what -1 picks on sm_90 (H100, H200), its own, within the
    same bounds (docs/kernels/attention_sm90.md).

    return_lse=True returns (out, lse): lse FP32 [heads, tokens], each row's natural log-sum-exp
    of the true scores softmax_scale * q . k over its segment's keys (the kernel's scores are
    those of the mean-centred K; the shift softmax_scale * q . mean(K) is added back), what
    merging partial attentions (sequence parallelism) needs."""
    want_lse = checks.return_lse(return_lse)
    res, lse, _ = attend(q, k, v, cu_seqlens, out, cu_seqlens_host, softmax_scale, fp8_mma_form, want_lse)
    return (res, lse) if want_lse else res


def attend(q, k, v, cu_seqlens, out, cu_seqlens_host, softmax_scale, fp8_mma_form, want_lse, keep=None):
    """minimax_h3_varlen_attention_fp8's work: (out, lse or None, the attention kernel's
    LaunchRecord or None). keep, a list when given, receives what a replay of the record reads
    (launch.run)."""
    tokens, heads, scale, cu_host = check_call(q, k, v, cu_seqlens, out, cu_seqlens_host, softmax_scale,
                                               fp8_mma_form)
    call = arrays.Call(dict(q=q, k=k, v=v, cu_seqlens=cu_seqlens, out=out))  # kind and device, after
    form = targets.operator_form(call.device_id, fp8_mma_form)
    if cu_host is None:
        cu_host = host_seqlens(call, cu_seqlens, None, tokens)
    res = out if out is not None else call.empty((tokens, heads, HEAD_DIM), arrays.BF16)
    lse = call.empty((heads, tokens), arrays.F32) if want_lse else None
    record = None
    if tokens:
        previous = call.make_current()
        try:
            record = launch.run(call, q, k, v, cu_seqlens, cu_host, heads, scale, res, form, lse, keep)
        finally:
            arrays.restore(previous)
    return res, lse, record


minimax_h3_sm120_varlen_attention_fp8 = minimax_h3_varlen_attention_fp8


def minimax_h3_varlen_attention_fp8_partial(q, k, v, cu_seqlens_q, cu_seqlens_k, k_mean, v_scale, *, k_scale=None,
                                            softmax_scale=None, exact_lse=True, fp8_mma_form=-1):
    """The attention of one share of the keys, as a ring's step needs it: the queries of segment
    i of q (rows cu_seqlens_q[i] .. cu_seqlens_q[i + 1]) against the keys of segment i of k, v
    (rows cu_seqlens_k[i] ..), with K centred on k_mean and V scaled by v_scale (f32 [segments,
    heads, 128]: the whole segments' key mean and RN(amax |V| / 448), so that every share
    quantizes as the whole segment does). K is scaled per 128-key block from the segment's first
    key in k: by RN(amax |k - k_mean| / 448) over the block's keys here, or by k_scale when given
    (f32 [key blocks, heads], the blocks of every segment of cu_seqlens_k numbered segment after
    segment: the whole segment's block scales where a block's keys lie partly elsewhere; a ring
    cuts its key shares on the whole segment's 128-key grid so that each block here is part of
    one whole-segment block). q, k, v: bf16 [tokens, heads, 128] (k and v of one shape, q with
    its own tokens), torch CUDA tensors or CuPy arrays; the boundaries: host sequences of ints.

    Returns (out bf16 [q tokens, heads, 128], lse f32 [heads, q tokens]) of the caller's kind:
    each row's attention over this share and the natural log-sum-exp of its true scores, what
    merging the shares by their lse needs (h3kernels.parallel.merge); a row whose segment has no
    keys here gets out 0 and lse -inf. exact_lse=False: the lse of the sum that out is divided by
    instead (on the wgmma form the tensor core's sum of the rounded P, where a segment has more
    than one key block; a merge weighted by it adds the shares' P V as one call over all keys
    would), at the speed of the call without the lse; the mma.sync forms' lse is the true one
    either way. On the caller's current stream, no host sync."""
    tokens_q, tokens_k, heads, cu_q, cu_k = checks.check_partial_args(q, k, v, cu_seqlens_q, cu_seqlens_k, k_mean,
                                                                      v_scale, k_scale)
    scale = checks.softmax_scale(softmax_scale)
    checks.boolean("exact_lse", exact_lse)
    checks.fp8_mma_form(fp8_mma_form)
    call = arrays.Call(dict(q=q, k=k, v=v, k_mean=k_mean, v_scale=v_scale, k_scale=k_scale))  # None: skipped
    form = targets.operator_form(call.device_id, fp8_mma_form)
    out = call.empty((tokens_q, heads, HEAD_DIM), arrays.BF16)
    lse = call.empty((heads, tokens_q), arrays.F32)
    previous = call.make_current()
    try:
        if _rows_without_keys(cu_q, cu_k):  # the kernel writes every other row
            call.zero(arrays.data_ptr(out), arrays.nbytes(out))
            _fill_neg_inf(call, lse)
        if tokens_q and tokens_k:
            launch.run_partial(call, q, k, v, cu_q, cu_k, heads, scale, out, lse, k_mean, v_scale, k_scale, form,
                               exact_lse)
    finally:
        arrays.restore(previous)
    return out, lse


def _rows_without_keys(cu_q, cu_k):
    """Whether a segment has queries and no keys (its rows: out 0, lse -inf)."""
    return any(b > a and d == c for a, b, c, d in zip(cu_q, cu_q[1:], cu_k, cu_k[1:]))


def _fill_neg_inf(call, a):
    """a <- -inf, on the call's stream."""
    if call.kind == "torch":
        a.fill_(float("-inf"))
    else:
        with call.active():
            a.fill(float("-inf"))


def check_call(q, k, v, cu_seqlens, out, cu_seqlens_host, softmax_scale, fp8_mma_form=-1):
    """Every argument check but the devices (h3kernels._validate.varlen_attention_fp8), before
    anything is launched: (tokens, heads, softmax scale, cu_seqlens as a tuple). Without
    cu_seqlens_host the tuple is None: cu_seqlens is read back by host_seqlens once the call is
    open (kind and device checked)."""
    tokens, heads = checks.check_args(q, k, v, cu_seqlens, out)
    scale = checks.softmax_scale(softmax_scale)
    checks.fp8_mma_form(fp8_mma_form)
    cu_host = None if cu_seqlens_host is None else host_seqlens(None, cu_seqlens, cu_seqlens_host, tokens)
    return tokens, heads, scale, cu_host


def host_seqlens(call, cu_seqlens, cu_seqlens_host, tokens):
    """cu_seqlens as a tuple of ints, checked: from cu_seqlens_host when given (compared with
    cu_seqlens only by length: reading it back would sync), else one device-to-host copy."""

    def read_back():
        if call.capturing:
            raise RuntimeError("minimax_h3_varlen_attention_fp8: cu_seqlens_host is needed while a CUDA graph is "
                               "being captured (reading cu_seqlens back would synchronize)")
        if call.kind == "torch":
            return cu_seqlens.cpu().tolist()  # on torch's current stream, which is ours
        with call.active():
            return cu_seqlens.get().tolist()  # synchronous, on the caller's stream

    return checks.host_seqlens(cu_seqlens, cu_seqlens_host, tokens, read_back)


def workspace_bytes(device=None):
    """Device bytes h3kernels holds between calls on `device` (an int, 'cuda:N', a torch.device
    or a CuPy Device; None: the current device). A call's scratch comes from the caller's own
    allocator and goes back to it, so this counts the device's segment plans (the 64 most recently
    used, a few hundred KB each at H3's sizes, and evicted ones whose launches have not finished)
    and the scratch that CUDA graphs captured from CuPy calls
    point at (kept for the life of the process)."""
    return workspace.workspace_bytes(checks.device(device))


def minimax_h3_varlen_attention_fp8_segment_sums(k, v, cu_seqlens_k):
    """(k_sum, v_amax), f32 [segments, heads, 128] each: the keys of each segment of k, v (rows
    cu_seqlens_k[i] .. cu_seqlens_k[i + 1]) added (each 128-key block's keys in token order, the
    block sums in block order, as the attention's K pass adds them) and their amax |v|; zeros for
    a segment with no keys here. What a ring adds up across ranks for a segment's key mean and V
    scale. k, v as minimax_h3_varlen_attention_fp8_partial's; on the caller's current stream."""
    heads, cu_k = checks.check_segment_sums_args(k, v, cu_seqlens_k)
    call = arrays.Call(dict(k=k, v=v))
    segments = len(cu_k) - 1
    k_sum = call.empty((segments, heads, HEAD_DIM), arrays.F32)
    v_amax = call.empty((segments, heads, HEAD_DIM), arrays.F32)
    previous = call.make_current()
    try:
        launch.run_segment_sums(call, k, v, cu_k, heads, k_sum, v_amax)
    finally:
        arrays.restore(previous)
    return k_sum, v_amax


def minimax_h3_varlen_attention_fp8_key_block_scales(k, cu_seqlens_k, k_mean, k_first):
    """f32 [blocks, heads]: the K scale RN(amax |RN(k - k_mean)| / 448) of each 128-key block of
    the keys of segment i of k (rows cu_seqlens_k[i] ..), the blocks those of the whole segment,
    whose key k_first[i] (host ints) is the first key here: a block ends where the whole
    segment's does, every 128 keys from its start, so the first block here may be short.
    Numbered segment after segment. A block's keys on several ranks: the scale is monotonic in
    the amax, so the maximum over the ranks' scales is the whole block's. On the caller's current
    stream."""
    heads, cu_k, firsts = checks.check_key_block_scales_args(k, cu_seqlens_k, k_mean, k_first)
    call = arrays.Call(dict(k=k, k_mean=k_mean))
    n = launch.grid_block_count(cu_k, firsts)
    s_k = call.empty((n, heads), arrays.F32)
    if n:
        previous = call.make_current()
        try:
            launch.run_key_block_scales(call, k, cu_k, firsts, heads, k_mean, s_k)
        finally:
            arrays.restore(previous)
    return s_k
