"""One MiniMax-H3 DiT block (examples/h3_block.py) over N GPUs with sequence parallelism: each rank
holds a contiguous token range of the packed sequence; the row stage, the projections and the
FP8 MLP run on each rank's own tokens (token-parallel, the same weights everywhere); the attention
is h3kernels.parallel's Ulysses (all-to-all to whole heads; bitwise the one-GPU attention) or ring
(K/V blocks around the ring, merged by LSE).

    torchrun --nproc_per_node=2 examples/sequence_parallel.py [--mode ulysses|ring]
        [--segments 1] [--tokens 65536] [--rows 50] [--reps 10] [--split even|uneven]

Rank 0 also runs the block on one GPU over all tokens and prints how far the N-GPU result is
from it (attention alone and the whole block), the time per block on 1 and on N GPUs, the
scaling efficiency (t1 / (N tN)) and, from an instrumented run, the attention's communication
time apart from its kernel time. The ring's per-rank step (queries against another rank's key
block) has no GPU kernel yet: there it runs h3kernels.reference's torch code on the GPU, correct
but slow, so time the ring only at small sizes.

Exit status 0 when it ran, 3 without a CUDA GPU (as examples/h3_block.py), 2 on bad arguments.
"""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def token_counts(tokens, world, split):
    """Each rank's token count: equal shares, or (uneven) shares growing with the rank."""
    if split == "even":
        base = [tokens // world] * world
    else:
        weights = list(range(1, world + 1))
        base = [tokens * w // sum(weights) for w in weights]
    base[-1] += tokens - sum(base)
    return base


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("ulysses", "ring"), default="ulysses")
    p.add_argument("--segments", type=int, default=1, help="video segments (sequences) packed together")
    p.add_argument("--tokens", type=int, default=65536, help="tokens per segment")
    p.add_argument("--rows", type=int, default=50, help="AdaLN rows")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--split", choices=("even", "uneven"), default="even", help="token ranges over the ranks")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("examples/sequence_parallel.py needs CUDA GPUs (one per rank, under torchrun): the FP8 kernels run "
              "there; none found.", file=sys.stderr)
        return 3
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast (SHARP) collectives
    import torch.distributed as dist

    sys.path.insert(0, HERE)
    from h3_block import INNER, H3Block

    from h3kernels import parallel, torch_ops
    from h3kernels.constants import H3_HEADS, HEAD_DIM, HIDDEN
    from h3kernels.peers.torch_mlp import row_stage
    from h3kernels.testing.checks import rel_l2, same_bits
    from h3kernels.testing.inputs import cu_seqlens_of
    from h3kernels.testing.timing import median_ms

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        torch.manual_seed(0)
        block = H3Block()  # the same seed on every rank: the same weights
        tokens = a.segments * a.tokens
        x = torch.randn(tokens, HIDDEN, device="cuda").bfloat16()
        mod = (0.1 * torch.randn(a.rows, 6 * HIDDEN, device="cuda")).bfloat16()
        index = torch.randint(0, a.rows, (tokens,), device="cuda")
        cu_host = cu_seqlens_of([a.tokens] * a.segments)
        counts = token_counts(tokens, world, a.split)
        first = sum(counts[:rank])
        mine = slice(first, first + counts[rank])
        attention = parallel.ulysses_attention if a.mode == "ulysses" else parallel.ring_attention

        def sp_block(x_local, idx_local, timings=None):
            """The block on this rank's tokens; only the attention talks to the other ranks."""
            n = x_local.shape[0]
            shift1, scale1, gate1, shift2, scale2, gate2 = (mod[:, i * HIDDEN:(i + 1) * HIDDEN] for i in range(6))
            h = row_stage(x_local, block.norm1, scale1, shift1, idx_local, 1e-5)
            q, k, v = (t.reshape(n, H3_HEADS, HEAD_DIM).contiguous() for t in (h @ block.qkv.t()).chunk(3, dim=-1))
            o = attention(q, k, v, cu_host, tokens_per_rank=counts, timings=timings)
            x2 = x_local + gate1[idx_local] * (o.reshape(n, INNER) @ block.proj.t())
            return torch_ops.minimax_h3_mlp_fp8(x2, block.norm2, scale2, shift2, idx_local, gate2, x2,
                                                block.fc1_q, block.fc1_s, block.fc2_q, block.fc2_s), (q, k, v, o)

        with torch.no_grad():
            out_local, (q, k, v, o_local) = sp_block(x[mine].contiguous(), index[mine].contiguous())
            t_n = median_ms(lambda: sp_block(x[mine].contiguous(), index[mine].contiguous()), warmup=1, reps=a.reps)
            times = torch.tensor([t_n], device="cuda")
            dist.all_reduce(times, op=dist.ReduceOp.MAX)  # the block is done when the slowest rank is
            t_n = times.item()
            split = {}
            for _ in range(a.reps):
                sp_block(x[mine].contiguous(), index[mine].contiguous(), timings=split)
            out_all = gather(out_local, counts, dist)
            o_all = gather(o_local, counts, dist)
            q_all, k_all, v_all = (gather(t, counts, dist) for t in (q, k, v))
            if rank == 0:
                cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
                want = block(x, mod, index, cu, cu_host)
                want_o = torch_ops.minimax_h3_varlen_attention_fp8(q_all, k_all, v_all, cu, cu_host)
                t_1 = median_ms(lambda: block(x, mod, index, cu, cu_host), warmup=1, reps=a.reps)
                print(f"{torch.cuda.get_device_name()} x {world}: one MiniMax-H3 block, {a.segments} x {a.tokens} "
                      f"tokens, {H3_HEADS} heads, {a.mode}, tokens per rank {counts}")
                same = same_bits(o_all, want_o)
                print(f"  attention vs one GPU on the same q, k, v: {'bitwise equal' if same else 'rel L2 '}"
                      f"{'' if same else f'{rel_l2(o_all, want_o):.2e}'}")
                print(f"  block output vs one GPU: rel L2 {rel_l2(out_all, want):.2e} (the bf16 projections "
                      f"run on fewer rows per GPU)")
                print(f"  one GPU: {t_1:.2f} ms per block; {world} GPUs: {t_n:.2f} ms per block; "
                      f"scaling {t_1 / (world * t_n):.2f} of linear")
                comm, att = split.get("comm", 0.0) * 1e3 / a.reps, split.get("attention", 0.0) * 1e3 / a.reps
                print(f"  attention on rank 0 (synchronized laps): communication {comm:.2f} ms, "
                      f"attention kernel and layout {att:.2f} ms per block")
            dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def gather(t, counts, dist):
    """The ranks' token ranges of t concatenated in rank order (all_gather of padded copies)."""
    most = max(counts)
    padded = t.new_zeros((most, *t.shape[1:]))
    padded[:t.shape[0]] = t
    every = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(every, padded)
    return torch.cat([e[:c] for e, c in zip(every, counts)])


if __name__ == "__main__":
    sys.exit(main())
