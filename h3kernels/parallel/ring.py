"""Ring sequence parallelism: each rank keeps its queries and its token range's K/V block; the
blocks travel around the ring (batch_isend_irecv, the next transfer in flight while the current
block is attended to), and each rank merges its partial results by their log-sum-exp in FP32.

Segments may cross rank boundaries. A segment's K is centred on the mean over all of its keys,
its K scales are those of the whole segment's 128-key blocks and its V is scaled by the amax
over all of its keys (all-reduces of per-rank partial sums and maxima, for the segments that
cross a boundary only): every partial quantizes its key block as the single-device attention
does (the mean up to its summation order), so that the partials differ from one attention over
all keys only where P is rounded (against each partial's own row maximum). Where no segment
crosses a rank boundary (a world of one, for one) each rank's call is the plain attention of its
own tokens, with no message but the all-gather of the token counts when tokens_per_rank is not
given (a world of one needs none)."""
import torch
import torch.distributed as dist

from h3kernels._validate import parallel as checks
from h3kernels.constants import E4M3_MAX, HEAD_DIM, K_BLOCK
from h3kernels.parallel import _group, layout
from h3kernels.parallel.local import PARTIAL_FORM, default_attention, default_partial_attention
from h3kernels.parallel.merge import LseMerge


def ring_attention(q, k, v, cu_seqlens, *, tokens_per_rank=None, group=None, out=None, softmax_scale=None,
                   return_lse=False, partial_attention=None, timings=None):
    """Attention over a packed sequence spread over the ranks of `group` by token ranges, the
    arguments and results as ulysses_attention's (any head count). partial_attention(q, k, v,
    cu_seqlens_q, cu_seqlens_k, softmax_scale, k_mean, v_amax, k_scale) -> (out, lse) is the
    attention of this rank's queries to one rank's key block (h3kernels.parallel.local). Every
    check runs before the first message."""
    checks.callable_or_none("partial_attention", partial_attention, PARTIAL_FORM)
    s = _group.Shard(q, k, v, cu_seqlens, tokens_per_rank, group, out, softmax_scale, return_lse, ulysses=False)
    attend = partial_attention or default_partial_attention
    clock = _group.Clock(timings, q.device)
    if partial_attention is None and not s.crossing:
        return _group.plain_call(s, default_attention, q, k, v, out, clock)
    clock.start()
    k_mean, v_amax, block_amax = segment_statistics(k, v, s)
    clock.lap("comm")
    merge = LseMerge(s.tokens, s.heads, HEAD_DIM, q.device)
    steps = s.world if s.crossing else 1  # no segment crosses a boundary: the local block is all there is
    cur = torch.stack((k, v))  # [2, n, heads, D]
    for step in range(steps):
        src = (s.rank - step) % s.world
        nxt = (s.rank - step - 1) % s.world
        reqs, buf = [], None
        if step + 1 < steps:
            ops = []
            if s.counts[src]:
                ops.append(dist.P2POp(dist.isend, cur, s.peer((s.rank + 1) % s.world), s.group))
            if s.counts[nxt]:
                buf = k.new_empty((2, s.counts[nxt], s.heads, HEAD_DIM))
                ops.append(dist.P2POp(dist.irecv, buf, s.peer((s.rank - 1) % s.world), s.group))
            if ops:
                reqs = dist.batch_isend_irecv(ops)
        cu_k = layout.local_seqlens(s.cu, s.starts[src], s.counts[src])
        if s.tokens and s.counts[src] and layout.segments_meeting(s.local_cu, cu_k):
            merge.add(*attend(q, cur[0], cur[1], s.local_cu, cu_k, s.scale, k_mean, v_amax,
                              key_scales(s, block_amax, src)))
        clock.lap("attention")
        for r in reqs:
            r.wait()
        clock.lap("comm")
        cur = buf
    res, lse = merge.result(out)
    return (res, lse) if s.want_lse else res


def segment_statistics(k, v, s):
    """(k_mean, v_amax, k_block_amax): each segment's key mean and amax |v| (f32 [segments,
    heads, 128]) and each 128-key block's amax |k - mean| (f32 [blocks, heads], the blocks of
    every whole segment from its start, numbered segment after segment) over all of its tokens
    on every rank. Segments inside one rank need no message; for the others one SUM all-reduce
    gives the means, then one MAX all-reduce the maxima."""
    segments = len(s.cu) - 1
    shape = (segments, s.heads, HEAD_DIM)
    f32 = dict(dtype=torch.float32, device=k.device)
    sums, amax = torch.zeros(shape, **f32), torch.zeros(shape, **f32)
    for i, (a, b) in enumerate(zip(s.local_cu, s.local_cu[1:])):
        if b > a:
            sums[i] = k[a:b].float().sum(dim=0)
            amax[i] = v[a:b].float().abs().amax(dim=0)
    crossing = s.crossing
    talk = bool(crossing)  # a world of one has none
    if talk:
        idx = torch.tensor(crossing, device=k.device)
        part = sums[idx].contiguous()
        dist.all_reduce(part, op=dist.ReduceOp.SUM, group=s.group)
        sums[idx] = part
    lengths = torch.tensor([max(b - a, 1) for a, b in zip(s.cu, s.cu[1:])], **f32)
    k_mean = sums / lengths[:, None, None]
    bases = layout.block_bases(s.cu)
    blocks = torch.zeros((bases[-1], s.heads), **f32)
    first = s.starts[s.rank]
    for i, (a, b) in enumerate(zip(s.local_cu, s.local_cu[1:])):
        if b > a:
            centred = (k[a:b].float() - k_mean[i][None]).abs().amax(dim=2)  # [n, heads]
            into = first + a - s.cu[i]  # this rank's first key of the segment, counted from its start
            part = block_maxima(centred, into % K_BLOCK)
            lo = bases[i] + into // K_BLOCK
            blocks[lo:lo + part.shape[0]] = part  # each rank holds one contiguous run of a segment's blocks
    if talk:
        rows = [r for i in crossing for r in range(bases[i], bases[i + 1])]
        ridx = torch.tensor(rows, device=k.device)
        both = torch.cat((amax[idx].reshape(-1), blocks[ridx].reshape(-1)))
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=s.group)
        n = len(crossing) * s.heads * HEAD_DIM
        amax[idx] = both[:n].view(len(crossing), s.heads, HEAD_DIM)
        blocks[ridx] = both[n:].view(len(rows), s.heads)
    return k_mean, amax, blocks


def block_maxima(centred, offset):
    """The maximum of each 128-key block over the rows of centred (f32 [n, heads], all >= 0) when
    the first block starts `offset` rows before row 0: f32 [blocks, heads]. The rows are laid
    into zero rows on the block grid (a zero changes no maximum of values >= 0) and reduced per
    block: plain tensor ops, exact like any maximum."""
    n, heads = centred.shape
    count = -(-(offset + n) // K_BLOCK)
    grid = centred.new_zeros((count * K_BLOCK, heads))
    grid[offset:offset + n] = centred
    return grid.view(count, K_BLOCK, heads).amax(dim=1)


def key_scales(s, block_amax, src):
    """The K scale of each key of rank src's block, f32 [n_src, heads]: RN(amax / 448) of the
    whole segment's 128-key block it lies in, as the single-device attention quantizes it."""
    bases = layout.block_bases(s.cu)
    first, n = s.starts[src], s.counts[src]
    ids = torch.empty(n, dtype=torch.int64)
    for i, (a, b) in enumerate(zip(s.cu, s.cu[1:])):
        lo, hi = max(a, first), min(b, first + n)
        if hi > lo:
            ids[lo - first:hi - first] = bases[i] + (torch.arange(lo, hi) - a) // K_BLOCK
    amax = block_amax[ids.to(block_amax.device)]
    return amax / torch.full_like(amax, E4M3_MAX)
