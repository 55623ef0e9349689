"""h3kernels.parallel on the CPU: gloo groups of 2, 3 and 4 processes (h3kernels.testing.
distributed), the reference as each rank's attention. Ulysses equals the single-process attention
bit for bit; ring is within 0.03 rel L2 of it; uneven token ranges, segments crossing ranks, empty
ranks; bad head counts, devices and layouts raise before any message and write nothing, and the
group stays usable after them. The per-rank (out, lse) form for xDiT / yunchang, and the MLP's
token parallelism. GPU: the same over NCCL on two GPUs.
"""
import itertools
import math
import warnings

import pytest
import torch

from h3kernels import parallel
from h3kernels import reference as R
from h3kernels.parallel import ring
from h3kernels.testing.checks import rel_l2, same_bits
from h3kernels.testing.distributed import run_ranks
from h3kernels.testing.inputs import make_attention_inputs

MODULE = __name__

# name -> (mode, segment lengths, heads, tokens per rank); every set crosses rank boundaries
CASES = {
    2: [("u56", "ulysses", [40, 0, 200, 1, 130], 56, (150, 221)),
        ("r4", "ring", [40, 0, 200, 1, 130], 4, (150, 221)),
        ("r4-one-rank-empty", "ring", [300, 71], 4, (0, 371))],
    3: [("u6-empty-middle", "ulysses", [10, 250, 111], 6, (120, 0, 251)),
        ("r56-empty-middle", "ring", [10, 250, 111], 56, (120, 0, 251)),
        ("r3-no-crossing", "ring", [100, 0, 50, 70], 3, (100, 50, 70))],
    4: [("u56", "ulysses", [0, 77, 260, 1, 40], 56, (0, 90, 200, 88)),
        ("r2", "ring", [0, 77, 260, 1, 40], 2, (0, 90, 200, 88)),
        ("r2-four-way", "ring", [378], 2, (100, 100, 100, 78))],
}


def inputs(seqlens, heads, seed):
    q, k, v, _, cu = make_attention_inputs(seqlens, heads, device="cpu", seed=seed, k_offset=3.0)
    return q, k, v, cu


def local(t, counts, rank):
    a = sum(counts[:rank])
    return t[a:a + counts[rank]].contiguous()


def error_cases(rank, world, seed):
    """Bad calls on every rank: (type name, message, out kept its poison) each, then a good call
    on the same group (nothing was left in flight)."""
    q, k, v, cu = inputs([30, 50], 56, seed)
    counts = (30, 20, 30)
    ql, kl, vl = (local(t, counts, rank) for t in (q, k, v))
    six = [t[:, :6].contiguous() for t in (ql, kl, vl)]
    skewed = torch.empty(kl.numel() + 1, dtype=kl.dtype)[1:].view(kl.shape)  # contiguous, 2 bytes off
    skewed.copy_(kl)
    calls = {
        "heads": lambda out: parallel.ulysses_attention(ql, kl, vl, cu, out=out),
        "devices": lambda out: parallel.ring_attention(ql, kl.to("meta"), vl, cu, out=out),
        "backend": lambda out: parallel.ulysses_attention(*(t[:, :6].to("meta") for t in (ql, kl, vl)), cu),
        "tokens_per_rank": lambda out: parallel.ring_attention(ql, kl, vl, cu, tokens_per_rank=(30, 50), out=out),
        "cu_total": lambda out: parallel.ring_attention(ql, kl, vl, [0, 30, 81], out=out),
        "return_lse": lambda out: parallel.ring_attention(ql, kl, vl, cu, out=out, return_lse=1),
        "local_attention": lambda out: parallel.ulysses_attention(*six, cu, local_attention="ref"),
        "partial_attention": lambda out: parallel.ring_attention(ql, kl, vl, cu, out=out, partial_attention=1),
        "aligned": lambda out: parallel.ring_attention(ql, skewed, vl, cu, out=out),
    }
    res = {}
    for name, call in calls.items():
        out = torch.full_like(ql, 7.0)
        try:
            call(out)
            res[name] = ("no error", "", None)
        except (TypeError, ValueError) as e:
            res[name] = (type(e).__name__, str(e), bool((out == 7).all()))
    res["after"] = parallel.ulysses_attention(*six, cu, return_lse=True)
    return res


def warnings_of_calls(rank, world, seed):
    """The warnings that Ulysses, ring (a segment crossing the ranks) and attn_forward raise, as
    strings: run first in the process, since torch reports some of its own warnings only once."""
    q, k, v, cu = inputs([100, 150], 4, seed)
    counts = (120, 130)
    ql, kl, vl = (local(t, counts, rank) for t in (q, k, v))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parallel.ulysses_attention(ql, kl, vl, cu, return_lse=True)
        parallel.ring_attention(ql, kl, vl, cu, return_lse=True)
        parallel.attn_forward(ql[None], kl[None], vl[None])
    return [f"{w.category.__name__}: {w.message}" for w in caught]


def rank_cases(rank, world, seed):
    """Every case of CASES[world] on this rank: {name: (out, lse)}, and the bad calls."""
    res = {}
    if world == 2:
        res["warnings"] = warnings_of_calls(rank, world, seed)
    for i, (name, mode, seqlens, heads, counts) in enumerate(CASES[world]):
        q, k, v, cu = inputs(seqlens, heads, seed)
        ql, kl, vl = (local(t, counts, rank) for t in (q, k, v))
        fn = parallel.ulysses_attention if mode == "ulysses" else parallel.ring_attention
        given = counts if i % 2 else None  # tokens_per_rank given (on every rank), or gathered
        out = torch.full_like(ql, float("nan"))
        got = fn(ql, kl, vl, torch.tensor(cu, dtype=torch.int32), tokens_per_rank=given, out=out, return_lse=True)
        assert got[0] is out
        res[name] = got
    if world == 3:
        res["errors"] = error_cases(rank, world, seed)
    if world == 2:  # a caller's own per-rank attention: it sees all tokens of half the heads
        seen = []

        def spy(q, k, v, cu, scale, want_lse):
            seen.append((tuple(q.shape), tuple(cu), scale, want_lse))
            return R.attention_fp8(q, k, v, cu, scale, return_lse=want_lse)

        name, _, seqlens, heads, counts = CASES[2][0]
        q, k, v, cu = inputs(seqlens, heads, seed)
        ql, kl, vl = (local(t, counts, rank) for t in (q, k, v))
        laps = {}
        res["spy"] = (parallel.ulysses_attention(ql, kl, vl, cu, local_attention=spy, softmax_scale=0.1,
                                                 timings=laps), seen)
        parallel.ring_attention(ql, kl, vl, cu, timings=laps)
        res["laps"] = sorted(laps)
    return res


# Each world size is a process group of its own to start (~10 s on two cores); 2 and 3 ranks
# already give even and uneven splits, empty ranks and segments crossing ranks.
@pytest.fixture(scope="module", params=[2, 3, pytest.param(4, marks=pytest.mark.slow)], ids=lambda w: f"{w}ranks")
def ranks(request, seed_of):
    world = request.param
    seed = seed_of(f"parallel-{world}")
    return world, seed, run_ranks(world, MODULE, "rank_cases", (seed,))


def gathered(results, name):
    outs, lses = zip(*(r[name] for r in results))
    return torch.cat(outs), torch.cat(lses, dim=1)


def test_ulysses_equals_single_process_bitwise(ranks):
    world, seed, results = ranks
    for name, mode, seqlens, heads, counts in CASES[world]:
        if mode != "ulysses":
            continue
        q, k, v, cu = inputs(seqlens, heads, seed)
        want, want_lse = R.attention_fp8(q, k, v, cu, return_lse=True)
        out, lse = gathered(results, name)
        assert same_bits(out, want), name
        assert same_bits(lse, want_lse), name
        assert [r[name][0].shape[0] for r in results] == list(counts)


def test_ulysses_runs_a_given_local_attention(ranks):
    world, seed, results = ranks
    if world != 2:
        pytest.skip("runs in the 2-rank group")
    name, _, seqlens, heads, counts = CASES[2][0]
    q, k, v, cu = inputs(seqlens, heads, seed)
    for r in results:
        out, seen = r["spy"]
        assert seen == [((sum(counts), heads // 2, 128), tuple(cu), 0.1, False)]
        assert r["laps"] == ["attention", "comm"]  # timings: communication apart from the attention
    got = torch.cat([r["spy"][0] for r in results])
    assert same_bits(got, R.attention_fp8(q, k, v, cu, softmax_scale=0.1))


def test_calls_raise_no_warning(ranks):
    """A normal call prints nothing: no beta-API or deprecation warning from the ops it uses."""
    world, _, results = ranks
    if world != 2:
        pytest.skip("runs in the 2-rank group")
    assert [r["warnings"] for r in results] == [[], []]


def test_block_maxima_on_the_segment_grid(seed):
    """The ring's per-block K maxima of a rank's run of a segment, on the segment's 128-key grid,
    are the maxima over each block's rows, wherever the run starts."""
    g = torch.Generator().manual_seed(seed)
    for offset, n in ((0, 1), (0, 128), (5, 123), (5, 124), (127, 300)):
        rows = torch.rand(n, 3, generator=g)
        got = ring.block_maxima(rows, offset)
        ids = (torch.arange(n) + offset) // 128
        want = torch.stack([rows[ids == b].amax(0) for b in range(-(-(offset + n) // 128))])
        assert same_bits(got, want), (offset, n)


RING_REL_L2 = {}


def test_ring_is_within_0_03_of_single_process(ranks):
    world, seed, results = ranks
    for name, mode, seqlens, heads, counts in CASES[world]:
        if mode != "ring":
            continue
        q, k, v, cu = inputs(seqlens, heads, seed)
        want, want_lse = R.attention_fp8(q, k, v, cu, return_lse=True)
        out, lse = gathered(results, name)
        assert torch.isfinite(out.float()).all() and torch.isfinite(lse).all()
        err = rel_l2(out, want)
        RING_REL_L2[(world, name)] = err
        print(f"ring {world} ranks {name}: rel L2 {err:.5f} from single-process, lse max |diff| "
              f"{(lse - want_lse).abs().max().item():.2e}")
        assert err <= 0.03, (name, err)
        # against float64 attention, ring costs at most a little over the single process's own error
        exact = R.attention_exact(q, k, v, cu)
        assert rel_l2(out, exact) <= 1.1 * rel_l2(want, exact) + 1e-3, name
        exact_lse = R.lse_exact(q, k, cu)
        assert (lse.double() - exact_lse).abs().max() <= (want_lse.double() - exact_lse).abs().max() + 0.01, name
        # K and V quantize as on one device: the lse differs only by FP32 rounding (measured 2e-6)
        assert (lse - want_lse).abs().max() <= 1e-4 * (1 + want_lse.abs().max()), name
        if name.endswith("no-crossing"):  # each rank's plain call on whole segments: the single process's bits
            assert same_bits(out, want) and same_bits(lse, want_lse), name


def without_messages(rank, world, seed):
    """Ulysses and ring in a world of one, and ring where no segment crosses a rank boundary,
    with every collective and point-to-point call of torch.distributed made to fail."""
    import torch.distributed as dist

    def refuse(*args, **kwargs):
        raise AssertionError("a message was sent")

    for name in ("all_to_all_single", "all_reduce", "all_gather", "batch_isend_irecv", "isend", "irecv"):
        setattr(dist, name, refuse)
    seqlens, heads = [100, 0, 50, 70], 4
    q, k, v, cu = inputs(seqlens, heads, seed)
    counts = (220,) if world == 1 else (100, 120)
    ql, kl, vl = (local(t, counts, rank) for t in (q, k, v))
    given = None if world == 1 else counts  # a world of one needs no all-gather of the counts
    res = {"ring": parallel.ring_attention(ql, kl, vl, cu, tokens_per_rank=given, return_lse=True)}
    if world == 1:
        laps = {}
        res["ulysses"] = parallel.ulysses_attention(ql, kl, vl, cu, return_lse=True, timings=laps)
        res["laps"] = sorted(laps)
    return res


@pytest.mark.parametrize("world", [1, 2])
def test_no_message_where_no_segment_crosses_a_rank(world, seed):
    """A world of one (both modes), or a ring whose segments each lie on one rank: each rank's
    plain attention call, no message, the single process's bits."""
    results = run_ranks(world, MODULE, "without_messages", (seed,))
    q, k, v, cu = inputs([100, 0, 50, 70], 4, seed)
    want = R.attention_fp8(q, k, v, cu, return_lse=True)
    for mode in ("ring", "ulysses") if world == 1 else ("ring",):
        out, lse = gathered(results, mode)
        assert same_bits(out, want[0]) and same_bits(lse, want[1]), mode
    if world == 1:
        assert results[0]["laps"] == ["attention"]


def test_bad_calls_raise_before_any_message_and_write_nothing(ranks):
    world, seed, results = ranks
    if world != 3:
        pytest.skip("the bad calls run in the 3-rank group")
    want = {
        "heads": ("ValueError", "q: got 56 heads over 3 ranks; need a world size that divides the heads "
                                "(1, 2, 4, 7, 8, 14, 28, 56)"),
        "devices": ("ValueError", "k: got a tensor on meta while q is on cpu; need one device"),
        "backend": ("ValueError", "q: got a tensor on meta; need a CPU tensor with the gloo backend"),
        "tokens_per_rank": ("ValueError", "tokens_per_rank: got 2 entries; need 3, one per rank"),
        "cu_total": ("ValueError", "cu_seqlens: got last entry 81; need tokens = 80 (the tokens of all ranks)"),
        "return_lse": ("TypeError", "return_lse: got 1; need True or False"),
        "local_attention": ("TypeError", "local_attention: got str; need None or a callable (q, k, v, cu_seqlens, "
                                         "softmax_scale, return_lse)"),
        "partial_attention": ("TypeError", "partial_attention: got int; need None or a callable (q, k, v, "
                                           "cu_seqlens_q, cu_seqlens_k, softmax_scale, k_mean, v_amax, k_scale)"),
        "aligned": ("ValueError", "k: got base address 0x"),
    }
    for rank, r in enumerate(results):
        errors = r["errors"]
        for name, (exc, msg) in want.items():
            got_exc, got_msg, untouched = errors[name]
            assert got_exc == exc and got_msg.startswith(msg), (rank, name, got_exc, got_msg)
            assert untouched in (True, None), (rank, name)
    q, k, v, cu = inputs([30, 50], 56, seed)
    want_out, want_lse = R.attention_fp8(*(t[:, :6].contiguous() for t in (q, k, v)), cu, return_lse=True)
    out, lse = gathered([r["errors"] for r in results], "after")
    assert same_bits(out, want_out) and same_bits(lse, want_lse)


def test_local_seqlens_clip_segments_to_a_rank():
    cu = (0, 10, 10, 260, 371)
    assert parallel.local_seqlens(cu, 0, 120) == (0, 10, 10, 120, 120)
    assert parallel.local_seqlens(cu, 120, 0) == (0, 0, 0, 0, 0)
    assert parallel.local_seqlens(cu, 120, 251) == (0, 0, 0, 140, 251)
    assert parallel.starts((120, 0, 251)) == (0, 120, 120)


def virtual_shard(cu, counts, rank, heads):
    """What ring's steps read of a rank's Shard, for rank `rank` of len(counts) virtual ranks."""
    from types import SimpleNamespace

    starts = parallel.starts(counts)
    return SimpleNamespace(cu=tuple(cu), counts=tuple(counts), starts=starts, rank=rank, world=len(counts),
                           heads=heads, tokens=counts[rank], scale=1 / math.sqrt(128),
                           local_cu=parallel.local_seqlens(cu, starts[rank], counts[rank]),
                           crossing=ring.layout.crossing_segments(cu, counts))


def virtual_ring(q, k, v, cu, counts, attend):
    """The ring's per-rank steps in one process, as the ring runs them: each rank's statistics
    reduced over the virtual ranks as its all-reduces do (sums, then maxima), each rank's queries
    against every rank's keys (ring.attend_keys) merged by their lse. (out, lse) of all tokens."""
    world, heads = len(counts), q.shape[1]
    shards = [virtual_shard(cu, counts, r, heads) for r in range(world)]
    parts = [tuple(local(t, counts, r) for t in (q, k, v)) for r in range(world)]
    sums = [ring.local_sums(kr, vr, sh) for (_, kr, vr), sh in zip(parts, shards)]
    k_mean = ring.segment_means(torch.stack([s_ for s_, _ in sums]).sum(0), cu)
    v_amax = torch.stack([a for _, a in sums]).amax(0)
    blocks = torch.stack([ring.placed_block_scales(kr, sh, k_mean) for (_, kr, _), sh in zip(parts, shards)]).amax(0)
    outs, lses = [], []
    for (qr, _, _), sh in zip(parts, shards):
        merge = parallel.LseMerge(qr.shape[0], heads, 128, q.device)
        for src in range(world):
            ring.attend_keys(qr, torch.stack(parts[src][1:]), sh, src, (k_mean, v_amax, blocks), attend, merge)
        o, l_ = merge.result()
        outs.append(o)
        lses.append(l_)
    return torch.cat(outs), torch.cat(lses, dim=1)


# (segment lengths, tokens per rank): boundaries on and off the 128-key grid, a rank inside one
# block, an empty rank, a rank whose first segment ends before its next block boundary
SPLITS = [([700, 300, 1000], (1000, 1000)), ([700, 300, 1000], (450, 1550)), ([2000], (700, 10, 1290)),
          ([129, 1500, 371], (128, 999, 0, 873)), ([2000], (500, 500, 500, 500)), ([64, 1936], (100, 900, 1000)),
          ([200, 300], (150, 350)), ([130, 500], (129, 501))]


@pytest.mark.parametrize("seqlens,counts", SPLITS, ids=[f"{len(c)}ranks-{'-'.join(map(str, c))}" for _, c in SPLITS])
def test_virtual_ring_quantizes_as_one_device(seqlens, counts, seed):
    """The ring's steps on the CPU with the reference's partial (a scale per 128-key block, as the
    kernel takes them): every split quantizes K and V as one device does, so the merged lse is the
    single process's up to FP32 rounding and the output as close to exact attention."""
    q, k, v, cu = inputs(seqlens, 2, seed)
    out, lse = virtual_ring(q, k, v, cu, counts, parallel.local.reference_partial_attention)
    want, want_lse = R.attention_fp8(q, k, v, cu, return_lse=True)
    assert (lse - want_lse).abs().max() <= 1e-4 * (1 + want_lse.abs().max())
    assert rel_l2(out, want) <= 0.03
    exact = R.attention_exact(q, k, v, cu)
    assert rel_l2(out, exact) <= 1.1 * rel_l2(want, exact)


@pytest.mark.parametrize("seqlens,counts", SPLITS, ids=[f"{len(c)}ranks-{'-'.join(map(str, c))}" for _, c in SPLITS])
def test_key_pieces_cut_on_the_whole_segment_grid(seqlens, counts):
    """A rank's keys in pieces that cover them in order, each 128-key block of a piece (counted
    from each segment's first key in it, as a partial counts K scale blocks) inside one block of
    the whole segment's grid."""
    cu = list(itertools.accumulate([0, *seqlens]))
    for src, n in enumerate(counts):
        if not n:
            continue
        shard = virtual_shard(cu, counts, src, 1)
        cu_k = parallel.local_seqlens(cu, shard.starts[src], n)
        pieces = ring.key_pieces(shard, src, cu_k)
        assert [lo for lo, _, _ in pieces] == [0, *[hi for _, hi, _ in pieces[:-1]]] and pieces[-1][1] == n
        for lo, hi, cu_piece in pieces:
            assert cu_piece[-1] == hi - lo
            for i, (a, b) in enumerate(zip(cu_piece, cu_piece[1:])):
                whole = [shard.starts[src] + lo + j - cu[i] for j in range(a, b)]  # positions in segment i
                for f in range(0, b - a, 128):
                    assert len({p // 128 for p in whole[f:f + 128]}) == 1, (src, lo, i, f)


@pytest.mark.gpu
@pytest.mark.parametrize("seqlens,counts", SPLITS, ids=[f"{len(c)}ranks-{'-'.join(map(str, c))}" for _, c in SPLITS])
def test_virtual_ring_on_the_gpu_is_the_single_device_call(seqlens, counts, seed):
    """The ring's steps on one GPU (the statistics passes, the partial kernel on key pieces cut on
    the whole segments' grid) against one attention call: output within 0.03 and as close to
    exact attention (1.1x), lse within 1e-3, at every split."""
    from h3kernels import minimax_h3_varlen_attention_fp8

    q, k, v, cu = (t.cuda() if torch.is_tensor(t) else t for t in inputs(seqlens, 8, seed))
    out, lse = virtual_ring(q, k, v, cu, counts, parallel.local.default_partial_attention)
    cu_dev = torch.tensor(cu, dtype=torch.int32, device="cuda")
    want, want_lse = minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, cu_seqlens_host=cu, return_lse=True)
    exact = R.attention_exact(q, k, v, cu)
    err, want_err = rel_l2(out, exact), rel_l2(want, exact)
    print(f"{counts}: rel L2 {rel_l2(out, want):.4f} from one call; against exact {err:.4f} / {want_err:.4f}; "
          f"lse max |diff| {(lse - want_lse).abs().max().item():.2e}")
    assert torch.isfinite(out.float()).all() and torch.isfinite(lse).all()
    assert rel_l2(out, want) <= 0.03
    assert err <= 1.1 * want_err
    assert (lse - want_lse).abs().max() <= 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("seqlens,counts", SPLITS, ids=[f"{len(c)}ranks-{'-'.join(map(str, c))}" for _, c in SPLITS])
def test_virtual_ring_without_the_lse_on_the_gpu(seqlens, counts, seed):
    """The ring's steps as a call without return_lse runs them (the partials' lse that of the sums
    their outputs were divided by, the build without the lse's FP32 sum): output within 0.03 of
    one attention call and as close to exact attention (1.1x), at every split."""
    import functools

    from h3kernels import minimax_h3_varlen_attention_fp8

    q, k, v, cu = (t.cuda() if torch.is_tensor(t) else t for t in inputs(seqlens, 8, seed))
    attend = functools.partial(parallel.local.default_partial_attention, exact_lse=False)
    out, _ = virtual_ring(q, k, v, cu, counts, attend)
    with_lse, _ = virtual_ring(q, k, v, cu, counts, parallel.local.default_partial_attention)
    cu_dev = torch.tensor(cu, dtype=torch.int32, device="cuda")
    want = minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, cu_seqlens_host=cu)
    exact = R.attention_exact(q, k, v, cu)
    err, want_err = rel_l2(out, exact), rel_l2(want, exact)
    print(f"{counts} without the lse: rel L2 {rel_l2(out, want):.4f} from one call ({rel_l2(with_lse, want):.4f} "
          f"with it); against exact {err:.4f} / {want_err:.4f}")
    assert torch.isfinite(out.float()).all()
    assert rel_l2(out, want) <= 0.03
    assert err <= 1.1 * want_err


def test_lse_merge_of_key_halves_is_the_whole(seed):
    """Two partials of the reference over the two halves of each segment's keys, with the whole
    segments' key mean and V amax, merge to the whole attention (within the P rounding) and to
    its lse."""
    q, k, v, cu = inputs([100, 0, 257], 3, seed)
    mean = R.segment_key_means(k, cu)
    amax = torch.stack([v[a:b].float().abs().amax(0) if b > a else torch.zeros(3, 128) for a, b in zip(cu, cu[1:])])
    half = [0, 50, 50, 178]
    k1, v1 = k[[*range(0, 50), *range(100, 228)]], v[[*range(0, 50), *range(100, 228)]]
    k2, v2 = k[[*range(50, 100), *range(228, 357)]], v[[*range(50, 100), *range(228, 357)]]
    s_k = R.quantize_attention_inputs(q, k, v, cu)[3]  # the whole segments' 128-key block scales
    i1, i2 = [*range(0, 50), *range(100, 228)], [*range(50, 100), *range(228, 357)]
    merge = parallel.LseMerge(q.shape[0], 3, 128, "cpu")
    merge.add(*R.attention_fp8_partial(q, k1, v1, cu, half, k_mean=mean, v_amax=amax, k_scale=s_k[i1]))
    merge.add(*R.attention_fp8_partial(q, k2, v2, cu, [0, 50, 50, 179], k_mean=mean, v_amax=amax, k_scale=s_k[i2]))
    out, lse = merge.result()
    want, want_lse = R.attention_fp8(q, k, v, cu, return_lse=True)
    # P rounds against each half's own maximum, so the merge and the whole round P independently
    # (rel L2 about 0.03 between them); against float64 attention the merge is as accurate as the
    # whole, and its lse is the whole's up to FP32 rounding
    exact = R.attention_exact(q, k, v, cu)
    assert rel_l2(out, exact) <= 1.02 * rel_l2(want, exact), (rel_l2(out, exact), rel_l2(want, exact))
    assert (lse - want_lse).abs().max() <= 1e-4 * (1 + want_lse.abs().max())
    # a partial over no keys weighs nothing
    none = R.attention_fp8_partial(q, k[:0], v[:0], cu, [0, 0, 0, 0], k_mean=mean, v_amax=amax)
    assert torch.isinf(none[1]).all() and (none[0] == 0).all()
    merge.add(*none)
    assert same_bits(merge.result()[0], out)


def test_partial_with_one_segmentation_is_the_attention(seed):
    q, k, v, cu = inputs([100, 0, 257], 3, seed)
    got = R.attention_fp8_partial(q, k, v, cu, cu)
    want = R.attention_fp8(q, k, v, cu, return_lse=True)
    assert same_bits(got[0], want[0]) and same_bits(got[1], want[1])


def test_attn_forward_is_the_per_rank_attention_with_lse(seed):
    q, k, v, _ = inputs([64, 64, 64], 2, seed)
    q4, k4, v4 = (t.view(3, 64, 2, 128) for t in (q, k, v))
    out, lse = parallel.attn_forward(q4, k4, v4, 0.0, None, False)
    want, want_lse = R.attention_fp8(q, k, v, [0, 64, 128, 192], return_lse=True)
    assert out.shape == (3, 64, 2, 128) and lse.shape == (3, 2, 64) and lse.dtype == torch.float32
    assert same_bits(out.reshape(192, 2, 128), want)
    assert same_bits(lse, want_lse.view(2, 3, 64).transpose(0, 1))
    packed = parallel.attn_forward(q[None], k[None], v[None], cu_seqlens=[0, 100, 192], return_lse=False)
    assert same_bits(packed[0], R.attention_fp8(q, k, v, [0, 100, 192]))
    empty = torch.zeros(2, 0, 2, 128, dtype=torch.bfloat16)
    out, lse = parallel.attn_forward(empty, empty, empty)
    assert out.shape == (2, 0, 2, 128) and lse.shape == (2, 2, 0)
    for kw, msg in ((dict(causal=True), "causal: got True"), (dict(dropout_p=0.1), "dropout_p: got 0.1"),
                    (dict(window_size=(8, 8)), "window_size: got (8, 8)")):
        with pytest.raises(ValueError, match="^" + msg.replace("(", r"\(").replace(")", r"\)")):
            parallel.attn_forward(q4, k4, v4, **kw)


def test_attn_forward_casts_half_and_single_precision_and_takes_any_strides(seed):
    q, k, v, _ = inputs([64, 64], 2, seed)
    want, want_lse = R.attention_fp8(q, k, v, [0, 64, 128], return_lse=True)
    for dtype in (torch.float16, torch.float32):
        q4, k4, v4 = (t.view(2, 64, 2, 128).to(dtype) for t in (q, k, v))
        out, lse = parallel.attn_forward(q4, k4, v4)
        assert out.dtype == dtype
        # bf16 -> fp16 -> bf16 is exact for these values, so the operands are the bf16 ones
        assert same_bits(out.reshape(128, 2, 128).bfloat16(), want.to(dtype).bfloat16())
        assert same_bits(lse, want_lse.view(2, 2, 64).transpose(0, 1))
    # [batch, heads, seqlen, 128] tensors transposed to the form: views with other strides
    qt, kt, vt = (t.view(2, 64, 2, 128).transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    assert not qt.is_contiguous()
    assert same_bits(parallel.attn_forward(qt, kt, vt)[0].reshape(128, 2, 128), want)


def _refusals():
    """(keyword arguments over good ones, exception type, message start) of attn_forward's refusals."""
    good = torch.zeros(3, 64, 2, 128, dtype=torch.bfloat16)
    return [
        (dict(q=torch.zeros(3, 64, 2, 64, dtype=torch.bfloat16)), ValueError,
         "q: got shape (3, 64, 2, 64); need shape (batch, seqlen, heads >= 1, 128)"),
        (dict(q=good[0]), ValueError, "q: got shape (64, 2, 128); need shape (batch, seqlen, heads >= 1, 128)"),
        (dict(q=good[:, :, :0]), ValueError, "q: got shape (3, 64, 0, 128); need shape (batch, seqlen, heads >= 1"),
        (dict(q=good.float().numpy()), TypeError, "q: got numpy.ndarray; need a torch tensor"),
        (dict(k=[1.0]), TypeError, "k: got list; need a torch tensor"),
        (dict(q=good.int()), TypeError, "q: got torch.int32; need torch.bfloat16 (torch.float16 and torch.float32"),
        (dict(q=good.double()), TypeError, "q: got torch.float64; need torch.bfloat16"),
        (dict(k=good.half()), TypeError, "k: got torch.float16; need q's dtype torch.bfloat16"),
        (dict(v=good[:, :32]), ValueError, "v: got shape (3, 32, 2, 128); need q's shape (3, 64, 2, 128)"),
        (dict(k=good.to("meta")), ValueError, "k: got a tensor on meta while q is on cpu; need one device"),
        (dict(cu_seqlens=[0, 100]), ValueError, "cu_seqlens: got last entry 100; need tokens = 192 (batch x seqlen"),
        (dict(cu_seqlens=[1, 192]), ValueError, "cu_seqlens: got first entry 1; need 0"),
        (dict(cu_seqlens=[0, 100, 50, 192]), ValueError,
         "cu_seqlens: got entries 100, 50 at 1, 2; need non-decreasing"),
        (dict(cu_seqlens=[]), ValueError, "cu_seqlens: got 0 entries; need segments + 1 >= 1 entries"),
        (dict(cu_seqlens=[0.0, 192.0]), TypeError, "cu_seqlens: got list; need a sequence of ints"),
        (dict(softmax_scale=-1.0), ValueError, "softmax_scale: got -1.0; need a positive float"),
        (dict(softmax_scale="0.1"), TypeError, "softmax_scale: got '0.1'; need a positive finite float"),
        (dict(return_lse=1), TypeError, "return_lse: got 1; need True or False"),
        (dict(local_attention=3), TypeError, "local_attention: got int; need None or a callable (q, k, v, cu_seqlens"),
        (dict(window_size=8), ValueError, "window_size: got 8; need (-1, -1)"),
        (dict(softcap=30.0), ValueError, "softcap: got 30.0; need 0.0"),
        (dict(alibi_slopes=torch.zeros(2)), ValueError, "alibi_slopes: got a tensor; need None"),
        (dict(return_softmax=True), ValueError, "return_softmax: got True; need False"),
    ]


REFUSALS = _refusals()


@pytest.mark.parametrize("bad,exc,msg", REFUSALS, ids=[f"{i}-{next(iter(b))}" for i, (b, _, _) in enumerate(REFUSALS)])
def test_attn_forward_refuses_bad_arguments_before_any_work(bad, exc, msg):
    """Each bad argument raises, naming it, before the attention runs: head dim 128, dtypes,
    shapes, one device, the segment boundaries, the scalars, the callable."""
    called = []
    good = torch.zeros(3, 64, 2, 128, dtype=torch.bfloat16)
    args = dict(q=good, k=good, v=good, local_attention=lambda *a: called.append(a))
    args.update(bad)
    with pytest.raises(exc) as e:
        parallel.attn_forward(**args)
    assert str(e.value).startswith(msg), str(e.value)
    assert not called


@pytest.mark.slow  # the reference MLP at MiniMax-H3 sizes, four times
def test_mlp_is_token_parallel_bitwise(seed):
    """Each rank's token range through the reference MLP, with the same weights and AdaLN tables,
    is that slice of the whole batch's output, bit for bit: no row depends on another."""
    from h3kernels.constants import FC1_OUT, FFN, HIDDEN

    g = torch.Generator().manual_seed(seed)
    m, rows = 11, 3
    x = torch.randn(m, HIDDEN, generator=g).bfloat16()
    norm = (1 + 0.1 * torch.randn(HIDDEN, generator=g)).bfloat16()
    scale, shift, gate = (torch.randn(rows, HIDDEN, generator=g).bfloat16() for _ in range(3))
    idx = torch.randint(0, rows, (m,), generator=g)
    residual = torch.randn(m, HIDDEN, generator=g).bfloat16()
    w1 = (torch.randn(FC1_OUT, HIDDEN, generator=g) * HIDDEN ** -0.5).bfloat16()
    w2 = (torch.randn(HIDDEN, FFN, generator=g) * FFN ** -0.5).bfloat16()
    weights = R.prepare_minimax_h3_fc1_weight_fp8(w1) + R.prepare_minimax_h3_fc2_weight_fp8(w2)
    mlp = lambda a, b: R.minimax_h3_mlp_fp8(x[a:b], norm, scale, shift, idx[a:b], gate, residual[a:b], *weights)
    whole = mlp(0, m)
    for a, b in ((0, 4), (4, 5), (5, 11)):  # three ranks' ranges, uneven
        assert same_bits(mlp(a, b), whole[a:b]), (a, b)


# --- GPU: NCCL on two GPUs ------------------------------------------------------------------------

def nccl_ranks(rank, world, seed):
    """Ulysses and ring with the GPU kernels on GPU `rank`, 56 heads, a segment crossing ranks 1024
    keys into it (on the whole segment's 128-key K scale grid)."""
    q, k, v, _, cu = make_attention_inputs([3000, 5000, 192], 56, device="cuda", seed=seed)
    counts = (4024, 4168)
    ql, kl, vl = (local(t, counts, rank) for t in (q, k, v))
    try:
        parallel.ulysses_attention(ql.cpu(), kl.cpu(), vl.cpu(), cu)
        refused = ""
    except ValueError as e:
        refused = str(e)
    u = parallel.ulysses_attention(ql, kl, vl, cu, return_lse=True)
    r = parallel.ring_attention(ql, kl, vl, cu, return_lse=True)
    return [t.cpu() for t in (*u, *r)] + [refused]


@pytest.mark.gpu
def test_nccl_two_gpus_match_one(seed):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    import h3kernels

    results = run_ranks(2, MODULE, "nccl_ranks", (seed,), backend="nccl")
    q, k, v, cu_dev, cu = make_attention_inputs([3000, 5000, 192], 56, device="cuda", seed=seed)
    want, want_lse = h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, cu_seqlens_host=cu, return_lse=True)
    want, want_lse = want.cpu(), want_lse.cpu()
    u_out = torch.cat([r[0] for r in results])
    u_lse = torch.cat([r[1] for r in results], dim=1)
    assert same_bits(u_out, want) and same_bits(u_lse, want_lse)
    assert all(r[4] == "q: got a tensor on cpu; need a CUDA tensor with the nccl backend" for r in results)
    r_out = torch.cat([r[2] for r in results])
    r_lse = torch.cat([r[3] for r in results], dim=1)
    print(f"ring over NCCL on 2 GPUs: rel L2 {rel_l2(r_out, want):.5f} from one GPU, lse max |diff| "
          f"{(r_lse - want_lse).abs().max().item():.2e}")
    assert math.isfinite(rel_l2(r_out, want)) and rel_l2(r_out, want) <= 0.03
    assert (r_lse - want_lse).abs().max() <= 1e-3 * (1 + want_lse.abs().max())
