"""The process group of a call and the checks that come before its first message."""
import time

import torch
import torch.distributed as dist

from h3kernels._validate import parallel as checks
from h3kernels._validate import varlen_attention_fp8 as attention_checks
from h3kernels.parallel import layout


class Shard:
    """One rank's view of a call: group, rank, world size, every rank's token count and first
    token, the global and this rank's segment boundaries, the segments crossing ranks, the
    softmax scale."""

    def __init__(self, q, k, v, cu_seqlens, tokens_per_rank, group, out, softmax_scale, return_lse, ulysses):
        self.want_lse = attention_checks.return_lse(return_lse)
        tokens, self.heads = checks.local_arrays(q, k, v, out)
        self.scale = attention_checks.softmax_scale(softmax_scale)
        if not dist.is_initialized():
            raise RuntimeError("h3kernels.parallel: torch.distributed is not initialized "
                               "(torch.distributed.init_process_group first, e.g. under torchrun)")
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        checks.backend_device(q, dist.get_backend(group))
        if ulysses:
            checks.heads_split(self.heads, self.world)
        cu = checks.host_ints("cu_seqlens", cu_seqlens)  # its values are checked once the total is known
        if tokens_per_rank is None:
            counts = (tokens,) if self.world == 1 else gather_counts(tokens, q.device, group, self.world)
        else:
            counts = checks.tokens_per_rank(tokens_per_rank, self.world, self.rank, tokens)
        self.counts = counts
        self.cu = checks.global_seqlens(cu, sum(counts))
        self.starts = layout.starts(counts)
        self.tokens = tokens
        self.local_cu = layout.local_seqlens(self.cu, self.starts[self.rank], tokens)
        self.crossing = layout.crossing_segments(self.cu, counts)  # the segments on more than one rank

    def peer(self, index):
        """The global rank of the group's rank `index` (P2P ops name global ranks)."""
        return dist.get_global_rank(self.group, index) if self.group is not None else index


def gather_counts(tokens, device, group, world):
    """Every rank's token count (one small all-gather)."""
    mine = torch.tensor([tokens], dtype=torch.int64, device=device)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    return tuple(int(c.item()) for c in every)


def plain_call(s, attend, q, k, v, out, clock):
    """The call where every segment of this rank's tokens lies whole on this rank (always so in a
    world of one): one plain attention call on the local tokens, no message of its own. attend has
    the form of local.default_attention."""
    clock.start()
    if s.tokens:
        res = attend(q, k, v, s.local_cu, s.scale, s.want_lse)
        o, lse = res if s.want_lse else (res, None)
    else:
        o, lse = q.new_empty(q.shape), torch.empty((s.heads, 0), dtype=torch.float32, device=q.device)
    if out is not None:
        out.copy_(o)
        o = out
    clock.lap("attention")
    return (o, lse) if s.want_lse else o


class Clock:
    """Wall-clock laps, device-synchronized, when a timings dict is given; otherwise nothing."""

    def __init__(self, timings, device):
        self.timings, self.device = timings, device
        self.t = None

    def _now(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def start(self):
        if self.timings is not None:
            self.t = self._now()

    def lap(self, what):
        if self.timings is not None:
            t = self._now()
            self.timings[what] = self.timings.get(what, 0.0) + t - self.t
            self.t = t
