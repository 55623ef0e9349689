"""Ulysses sequence parallelism: one all-to-all turns each rank's token range of all heads
into all tokens of heads / world heads; every rank runs the whole attention for its heads;
a second all-to-all returns each rank its token range of all heads.

The heads of an attention are independent, and so are its quantization scales (per token and
head for Q, per segment, head and channel or 128-key block and head for K and V), so the result
equals the single-device attention bit for bit when the same kernel family runs both."""
import torch
import torch.distributed as dist

from h3kernels._validate import parallel as checks
from h3kernels.constants import HEAD_DIM
from h3kernels.parallel import _group
from h3kernels.parallel.local import ATTENTION_FORM, default_attention


def ulysses_attention(q, k, v, cu_seqlens, *, tokens_per_rank=None, group=None, out=None, softmax_scale=None,
                      return_lse=False, local_attention=None, timings=None):
    """Attention over a packed sequence spread over the ranks of `group` by token ranges.

    q, k, v: this rank's tokens, bf16 [n_r, heads, 128] (rank r holds global tokens
    [n_0 + ... + n_{r-1}, ... + n_r); any n_r >= 0); cu_seqlens: the global segment boundaries
    (host ints, the same on every rank); tokens_per_rank: every rank's n_r (None: one all-gather
    finds them). heads must be a multiple of the world size. Returns this rank's out bf16
    [n_r, heads, 128] (into `out` when given), and with return_lse (out, lse f32 [heads, n_r]).
    local_attention(q, k, v, cu_seqlens, softmax_scale, return_lse) is the per-rank attention
    (default: the GPU operator on CUDA tensors, the reference on the CPU). timings, a dict when
    given, receives 'comm' and 'attention' seconds (synchronizing: for measurements only).
    Every check runs before the first message."""
    checks.callable_or_none("local_attention", local_attention, ATTENTION_FORM)
    s = _group.Shard(q, k, v, cu_seqlens, tokens_per_rank, group, out, softmax_scale, return_lse, ulysses=True)
    attend = local_attention or default_attention
    world, n, hp, D = s.world, s.tokens, s.heads // s.world, HEAD_DIM
    clock = _group.Clock(timings, q.device)
    if world == 1:  # all tokens and all heads are here: the plain call, no all-to-all
        return _group.plain_call(s, attend, q, k, v, out, clock)

    # [n, world, hp, D] -> [world, 3, n, hp, D]: block j (for rank j) holds its heads of q, k, v
    send = torch.stack((q, k, v)).view(3, n, world, hp, D).permute(2, 0, 1, 3, 4).contiguous()
    recv = send.new_empty((3 * sum(s.counts), hp, D))
    clock.start()
    dist.all_to_all_single(recv, send.view(world * 3 * n, hp, D), [3 * c for c in s.counts], [3 * n] * world,
                           group=s.group)
    clock.lap("comm")
    # from rank j: [3, n_j, hp, D]; concatenated in rank order = global token order
    parts = [p.view(3, c, hp, D) for p, c in zip(torch.split(recv, [3 * c for c in s.counts]), s.counts)]
    qh, kh, vh = (torch.cat([p[i] for p in parts]) for i in range(3))
    res = attend(qh, kh, vh, s.cu, s.scale, s.want_lse)
    o, lse = res if s.want_lse else (res, None)
    clock.lap("attention")

    # back: rows of rank j's tokens go to rank j; from rank i come its hp heads of my tokens
    payload = o.reshape(o.shape[0], hp * D)
    if lse is not None:  # the lse rides along as bf16 pairs of its FP32 bits
        payload = torch.cat((payload, lse.T.contiguous().view(torch.bfloat16)), dim=1)
    back = payload.new_empty((world * n, payload.shape[1]))
    dist.all_to_all_single(back, payload, [n] * world, list(s.counts), group=s.group)
    clock.lap("comm")
    width = hp * D
    back = back.view(world, n, payload.shape[1])
    res_out = back[:, :, :width].reshape(world, n, hp, D).permute(1, 0, 2, 3).reshape(n, s.heads, D)
    if out is not None:
        out.copy_(res_out)
        res_out = out
    else:
        res_out = res_out.contiguous()
    if lse is None:
        return res_out
    lse_local = back[:, :, width:].contiguous().view(torch.float32)  # [world, n, hp]
    return res_out, lse_local.permute(0, 2, 1).reshape(s.heads, n).contiguous()
