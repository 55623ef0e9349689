"""Ring sequence parallelism: each rank keeps its queries and its token range's K/V block; the
blocks travel around the ring (batch_isend_irecv, the next transfer in flight while the current
block is attended to), and each rank merges its partial results by their log-sum-exp in FP32.

Segments may cross rank boundaries. A segment's K is centred on the mean over all of its keys,
its K scales are those of the whole segment's 128-key blocks and its V is scaled by the amax
over all of its keys (all-reduces of per-rank partial sums and maxima, for the segments that
cross a boundary only). A partial counts K scale blocks from each segment's first key it is
given, so a rank's keys that start inside a whole-segment block go to a partial of their own
up to the next block boundary (key_pieces): every partial then quantizes its keys as the
single-device attention does (the mean up to its summation order), and the partials differ
from one attention over all keys only where P is rounded (against each partial's own row
maximum). Where no segment crosses a rank boundary (a world of one, for one) each rank's call is
the plain attention of its own tokens, with no message but the all-gather of the token counts
when tokens_per_rank is not given (a world of one needs none)."""
import functools

import torch
import torch.distributed as dist

from h3kernels._validate import parallel as checks
from h3kernels.constants import E4M3_MAX, HEAD_DIM, K_BLOCK
from h3kernels.parallel import _group, layout
from h3kernels.parallel.local import PARTIAL_FORM, default_attention, default_partial_attention
from h3kernels.parallel.merge import LseMerge
from h3kernels.quantize import div


def ring_attention(q, k, v, cu_seqlens, *, tokens_per_rank=None, group=None, out=None, softmax_scale=None,
                   return_lse=False, partial_attention=None, timings=None):
    """Attention over a packed sequence spread over the ranks of `group` by token ranges, the
    arguments and results as ulysses_attention's (any head count). partial_attention(q, k, v,
    cu_seqlens_q, cu_seqlens_k, softmax_scale, k_mean, v_amax, k_scale) -> (out, lse) is the
    attention of this rank's queries to one rank's key block, k_scale the scales of its 128-key
    blocks (h3kernels.parallel.local). Every check runs before the first message."""
    checks.callable_or_none("partial_attention", partial_attention, PARTIAL_FORM)
    s = _group.Shard(q, k, v, cu_seqlens, tokens_per_rank, group, out, softmax_scale, return_lse, ulysses=False)
    # without the lse wanted, the partials' lse weigh their outputs by the sums they were divided
    # by (the kernel's build without the lse's own FP32 sum, as fast as the plain call)
    attend = partial_attention or functools.partial(default_partial_attention, exact_lse=s.want_lse)
    clock = _group.Clock(timings, q.device)
    if partial_attention is None and not s.crossing:
        return _group.plain_call(s, default_attention, q, k, v, out, clock)
    clock.start()
    stats = segment_statistics(k, v, s)
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
        attend_keys(q, cur, s, src, stats, attend, merge)
        clock.lap("attention")
        for r in reqs:
            r.wait()
        clock.lap("comm")
        cur = buf
    res, lse = merge.result(out)
    return (res, lse) if s.want_lse else res


def attend_keys(q, kv, s, src, stats, attend, merge):
    """This rank's queries against rank src's keys kv ([2, n, heads, 128]: K, V; None where src
    has none), as partials (attend) added to merge; stats: segment_statistics'. Nothing where no
    segment has both."""
    k_mean, v_amax, block_scales = stats
    cu_k = layout.local_seqlens(s.cu, s.starts[src], s.counts[src])
    if s.tokens and s.counts[src] and layout.segments_meeting(s.local_cu, cu_k):
        for lo, hi, cu_piece in key_pieces(s, src, cu_k):
            merge.add(*attend(q, kv[0, lo:hi], kv[1, lo:hi], s.local_cu, cu_piece, s.scale, k_mean, v_amax,
                              piece_scales(s, block_scales, s.starts[src] + lo, cu_piece)))


def segment_statistics(k, v, s):
    """(k_mean, v_amax, k_block_scales): each segment's key mean and amax |v| (f32 [segments,
    heads, 128]) and each 128-key block's K scale RN(amax |k - mean| / 448) (f32 [blocks, heads],
    the blocks of every whole segment from its start, numbered segment after segment) over all of
    its tokens on every rank. Each rank reduces its own keys (local_sums, local_block_scales: the
    GPU passes on CUDA tensors); segments inside one rank need no message, for the others one SUM
    all-reduce gives the means, then one MAX all-reduce the maxima (the scale is monotonic in the
    amax: the maximum of the ranks' scales is the whole block's)."""
    sums, amax = local_sums(k, v, s)
    crossing = s.crossing
    talk = bool(crossing)  # a world of one has none
    if talk:
        idx = torch.tensor(crossing, device=k.device)
        part = sums[idx].contiguous()
        dist.all_reduce(part, op=dist.ReduceOp.SUM, group=s.group)
        sums[idx] = part
    k_mean = segment_means(sums, s.cu)
    blocks = placed_block_scales(k, s, k_mean)
    bases = layout.block_bases(s.cu)
    if talk:
        rows = [r for i in crossing for r in range(bases[i], bases[i + 1])]
        ridx = torch.tensor(rows, device=k.device)
        both = torch.cat((amax[idx].reshape(-1), blocks[ridx].reshape(-1)))
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=s.group)
        n = len(crossing) * s.heads * HEAD_DIM
        amax[idx] = both[:n].view(len(crossing), s.heads, HEAD_DIM)
        blocks[ridx] = both[n:].view(len(rows), s.heads)
    return k_mean, amax, blocks


def segment_means(sums, cu):
    """The key means from the whole segments' key sums (f32 [segments, heads, 128])."""
    lengths = torch.tensor([max(b - a, 1) for a, b in zip(cu, cu[1:])], dtype=torch.float32, device=sums.device)
    return sums / lengths[:, None, None]


def placed_block_scales(k, s, k_mean):
    """f32 [blocks of the whole segments, heads]: the K scale of this rank's part of each 128-key
    block in the rows of its blocks (local_block_scales), zeros in the others' (a zero changes no
    maximum of values >= 0)."""
    bases = layout.block_bases(s.cu)
    blocks = torch.zeros((bases[-1], s.heads), dtype=torch.float32, device=k.device)
    firsts = local_firsts(s)
    rows = [bases[i] + f // K_BLOCK + j for i, (a, b, f) in enumerate(zip(s.local_cu, s.local_cu[1:], firsts))
            for j in range(-(-(f % K_BLOCK + b - a) // K_BLOCK) if b > a else 0)]
    if rows:  # each rank holds one contiguous run of a segment's blocks
        blocks[torch.tensor(rows, device=k.device)] = local_block_scales(k, s, k_mean, firsts)
    return blocks


def local_firsts(s):
    """Where this rank's keys of each segment start in the whole segment (0 where it has none)."""
    first = s.starts[s.rank]
    return tuple(max(first + a - c, 0) for a, c in zip(s.local_cu[:-1], s.cu))


def local_sums(k, v, s):
    """This rank's keys of each segment added, and their amax |v| (f32 [segments, heads, 128]):
    the GPU pass on CUDA tensors, torch's sums elsewhere."""
    if k.is_cuda:
        from h3kernels.varlen_attention_fp8 import minimax_h3_varlen_attention_fp8_segment_sums

        return minimax_h3_varlen_attention_fp8_segment_sums(k, v, s.local_cu)
    shape = (len(s.cu) - 1, s.heads, HEAD_DIM)
    sums, amax = torch.zeros(shape, dtype=torch.float32), torch.zeros(shape, dtype=torch.float32)
    for i, (a, b) in enumerate(zip(s.local_cu, s.local_cu[1:])):
        if b > a:
            sums[i] = k[a:b].float().sum(dim=0)
            amax[i] = v[a:b].float().abs().amax(dim=0)
    return sums.to(k.device), amax.to(k.device)


def local_block_scales(k, s, k_mean, firsts):
    """RN(amax |k - k_mean| / 448) of this rank's part of each whole-segment 128-key block (f32
    [blocks, heads], segment after segment): the K pass on CUDA tensors, torch elsewhere."""
    if k.is_cuda:
        from h3kernels.varlen_attention_fp8 import minimax_h3_varlen_attention_fp8_key_block_scales

        return minimax_h3_varlen_attention_fp8_key_block_scales(k, s.local_cu, k_mean.contiguous(), firsts)
    parts = [block_maxima((k[a:b].float() - k_mean[i][None]).abs().amax(dim=2), f % K_BLOCK)
             for i, (a, b, f) in enumerate(zip(s.local_cu, s.local_cu[1:], firsts)) if b > a]
    amax = torch.cat(parts) if parts else torch.zeros((0, s.heads), dtype=torch.float32, device=k.device)
    return div(amax, E4M3_MAX)


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


def key_pieces(s, src, cu_k):
    """Rank src's keys as (first row, end row, cu_seqlens of the rows) pieces whose 128-key blocks,
    counted from each segment's first key in the piece, are blocks of the whole segment's grid,
    as a partial's K scale blocks are counted. Only a rank's first segment can start inside a
    whole-segment block (a rank holds one contiguous token range): its keys up to the next block
    boundary then make a piece of their own, the rest (the later segments from their own first
    keys) another; where that segment's keys here end before the boundary, one piece is all."""
    first, n = s.starts[src], s.counts[src]
    seg = next(i for i, (a, b) in enumerate(zip(s.cu, s.cu[1:])) if a <= first < b)
    head = -(first - s.cu[seg]) % K_BLOCK  # keys to the segment's next block boundary
    if head == 0 or head >= cu_k[seg + 1]:  # cu_k[seg] is 0: the segment's keys here come first
        return ((0, n, cu_k),)
    return ((0, head, tuple(min(c, head) for c in cu_k)), (head, n, tuple(max(c - head, 0) for c in cu_k)))


def piece_scales(s, block_scales, first, cu_piece):
    """The K scales of a piece's 128-key blocks (counted from each segment's first key in the
    piece, as a partial counts them; the piece's row 0 is global token `first`), f32 [blocks,
    heads]: each block's whole-segment block, the one its first key lies in (key_pieces makes it
    the one of all its keys)."""
    bases = layout.block_bases(s.cu)
    ids = [bases[i] + (first + r - c) // K_BLOCK
           for i, (a, b, c) in enumerate(zip(cu_piece, cu_piece[1:], s.cu)) for r in range(a, b, K_BLOCK)]
    return block_scales[torch.tensor(ids, dtype=torch.int64, device=block_scales.device)]
