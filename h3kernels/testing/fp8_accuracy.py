"""The accuracy beside the speed: ours, h3kernels.reference and the FP8 peers (FlashAttention-3's
FP8 forward, cuDNN's FP8 SDPA; h3kernels.peers.fp8_attention) on one segment, each as rel L2
against exact attention in float64, on random keys and on keys with an offset per head (what K
smoothing is for: real keys share a large per-head component, and a per-tensor or per-head scale
spends e4m3's range on it). `python -m h3kernels bench` records these beside its times.
"""
import time

SEQLEN, HEADS = 4096, 16  # one segment; head dim 128
K_OFFSET = 4.0  # K + K_OFFSET x a random vector per head, the same for every token
SEED = 4096
REFERENCE_LABEL = "h3kernels.reference (FP8)"
PEER_LABELS = {"fa3_fp8": "FA3 FP8", "cudnn_fp8": "cuDNN FP8 (e4m3 output)"}


def attention_accuracy(forms=(-1,), seqlen=SEQLEN, heads=HEADS, k_offset=K_OFFSET, seed=SEED, device="cuda"):
    """(figures, unavailable): figures = dict(tokens, heads, head_dim, seed, k_offset, seconds,
    rows=[dict(key, label, rel_l2, rel_l2_k_offset)]) with one row for ours in each fp8_mma_form
    of `forms` (key "ours", with its "form"), then the reference's and each FP8 peer's that ran
    (a peer whose run failed on one input set lacks that figure); unavailable = {peer key: why it
    did not run}. Inputs: make_attention_inputs' seeded bf16 q, k, v, the second set the first
    with the key offset added."""
    import h3kernels
    from h3kernels import reference as R
    from h3kernels._runtime.targets import form_family
    from h3kernels.constants import HEAD_DIM
    from h3kernels.peers import fp8_attention
    from h3kernels.testing.checks import exact_attention, rel_l2
    from h3kernels.testing.inputs import make_attention_inputs

    t0 = time.perf_counter()
    rows, unavailable = {}, {}

    def row(key, label, **extra):
        return rows.setdefault((key, extra.get("form")), dict(key=key, label=label, **extra))

    for field, offset in (("rel_l2", 0.0), ("rel_l2_k_offset", k_offset)):
        q, k, v, cu, cu_host = make_attention_inputs([seqlen], heads, device=device, seed=seed, k_offset=offset)
        exact = exact_attention(q, k, v, cu_host)
        for form in forms:
            out = h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu, cu_seqlens_host=cu_host, fp8_mma_form=form)
            name = f"ours, form {form} ({form_family(form)})" if form >= 0 else "ours"
            row("ours", name, form=form)[field] = rel_l2(out, exact)
        row("reference", REFERENCE_LABEL)[field] = rel_l2(R.attention_fp8(q, k, v, cu_host), exact)
        for key, _, _, run, err in fp8_attention.prepared(q, k, v, cu_host, fp8_only=True):
            if err is None:
                try:
                    row(key, PEER_LABELS.get(key, key))[field] = rel_l2(fp8_attention.values(run, run()), exact)
                except Exception as failed:  # a peer's failure is its own row's
                    err = failed
            if err is not None:
                unavailable.setdefault(key, fp8_attention.reason(err))
            del run
        del q, k, v, exact
    figures = dict(tokens=seqlen, heads=heads, head_dim=HEAD_DIM, seed=seed, k_offset=k_offset,
                   against="exact attention (float64)", rows=list(rows.values()),
                   seconds=round(time.perf_counter() - t0, 3))
    return figures, unavailable
