"""Sequence parallelism over several processes: each rank holds a contiguous token range of the
packed sequence and the attention is h3kernels.parallel's Ulysses (all-to-all to whole heads;
bitwise the one-process attention) or ring (K/V blocks around the ring, merged by LSE).

    torchrun --nproc_per_node=N examples/sequence_parallel.py [--device auto|cuda|cpu]
        [--mode ulysses|ring] [--segments S] [--tokens T] [--split even|uneven]
        [--rows 50] [--reps 10] [--heads H]
    python examples/sequence_parallel.py ...      the same as one rank, without torchrun

With CUDA GPUs (--device auto finds them, or --device cuda; one GPU per rank, NCCL): one
MiniMax-H3 DiT block (examples/h3_block.py) at real sizes (56 heads, 1 x 65536 tokens by
default); the row stage, the projections and the FP8 MLP run on each rank's own tokens
(token-parallel, the same weights everywhere), the attention by --mode (default ulysses). Rank 0
also runs the block on one GPU over all tokens and prints how far the N-GPU result is from it
(attention alone and the whole block), the time per block on 1 and on N GPUs (the medians of three rounds
that time the two in turn), the scaling
efficiency (t1 / (N tN)) and, from an instrumented run, the attention's communication time apart
from its kernel time. The ring's per-rank step runs the partial-attention kernel.

Without a CUDA GPU (or with --device cpu): the CPU reference path. The attention alone over gloo,
each rank's attention computed by h3kernels.reference (torch code that computes what the FP8
kernels compute, slowly), at small sizes (2 x 300 tokens, max(4, 2 N) heads, uneven token ranges
by default); both Ulysses and ring unless --mode picks one. Rank 0 compares them with the
one-process reference attention: Ulysses bitwise (out and lse), ring within 0.03 rel L2. No
block, no timing: --rows and --reps are the GPU block's.

Exit status of each rank: 0 when it ran (on the CPU path: and the comparisons held), 1 when a CPU
comparison failed, 2 on bad arguments, 3 with --device cuda and no CUDA GPU for this rank.
torchrun itself exits 0 when every rank exits 0 and 1 otherwise, after a ChildFailedError report
that lists each failed rank's exitcode (-15 for a rank it stopped once another had failed).
"""
import argparse
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))

# the GPU block's sizes, and the CPU reference path's: seconds of work on two cores
GPU_DEFAULTS = dict(segments=1, tokens=65536, split="even")
CPU_DEFAULTS = dict(segments=2, tokens=300, split="uneven")
RING_BOUND = 0.03  # rel L2 of the ring from one process: the FP8 attention's own error, drawn twice


def token_counts(tokens, world, split):
    """Each rank's token count: equal shares, or (uneven) shares growing with the rank."""
    if split == "even":
        base = [tokens // world] * world
    else:
        weights = list(range(1, world + 1))
        base = [tokens * w // sum(weights) for w in weights]
    base[-1] += tokens - sum(base)
    return base


def positive(text):
    """An argument that counts something: an int >= 1."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"got {n}; need an int >= 1")
    return n


def parse(argv):
    """The arguments, with the device chosen and the defaults of its path filled in."""
    p = argparse.ArgumentParser(description="h3kernels.parallel on one H3 block (GPUs) or the attention (CPU)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: CUDA when torch finds a GPU, else the CPU reference path")
    p.add_argument("--mode", choices=("ulysses", "ring"), help="default: ulysses on GPUs, both on the CPU")
    p.add_argument("--segments", type=positive, help="video segments (sequences) packed together")
    p.add_argument("--tokens", type=positive, help="tokens per segment")
    p.add_argument("--split", choices=("even", "uneven"), help="token ranges over the ranks")
    p.add_argument("--rows", type=positive, default=50, help="AdaLN rows (GPU block)")
    p.add_argument("--reps", type=positive, default=10, help="timed repetitions (GPU block)")
    p.add_argument("--heads", type=positive, help="CPU path only (the GPU block has the H3's 56); default max(4, 2 N)")
    a = p.parse_args(argv)
    if a.device == "auto":
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    for name, value in (GPU_DEFAULTS if a.device == "cuda" else CPU_DEFAULTS).items():
        if getattr(a, name) is None:
            setattr(a, name, value)
    if a.device == "cuda":
        if a.heads is not None:
            p.error("--heads: the GPU block has the H3's 56 heads; --heads is for the CPU path")
        a.modes = (a.mode or "ulysses",)
    else:
        a.heads = a.heads or max(4, 2 * world)
        a.modes = (a.mode,) if a.mode else ("ulysses", "ring")
        if "ulysses" in a.modes and a.heads % world:
            p.error(f"--heads: got {a.heads} over {world} ranks; Ulysses needs a multiple of the rank count")
    return a


def main(argv=None):
    a = parse(argv)
    if a.device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if local_rank >= torch.cuda.device_count():
            print(f"examples/sequence_parallel.py --device cuda needs one CUDA GPU per rank (under torchrun); "
                  f"{torch.cuda.device_count()} found for local rank {local_rank}. Without --device, a machine "
                  f"without CUDA runs the CPU reference path.", file=sys.stderr)
            return 3
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast (SHARP) collectives
        torch.cuda.set_device(local_rank)
        dist = init_group("nccl", torch.device("cuda", local_rank))
    else:
        dist = init_group("gloo")
    try:
        return gpu_block(a, dist) if a.device == "cuda" else cpu_reference(a, dist)
    finally:
        dist.destroy_process_group()


def init_group(backend, device_id=None):
    """The process group: torchrun's rendezvous (env://) under torchrun, else a group of one."""
    import torch.distributed as dist

    device = {} if device_id is None else {"device_id": device_id}
    if "RANK" in os.environ:
        dist.init_process_group(backend, **device)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **device)
    return dist


def cpu_reference(a, dist):
    """Ulysses and ring over gloo with h3kernels.reference as each rank's attention, against the
    one-process reference attention; 0 when Ulysses is bitwise equal and ring within RING_BOUND."""
    from h3kernels import parallel
    from h3kernels import reference as R
    from h3kernels.testing.checks import rel_l2, same_bits
    from h3kernels.testing.inputs import make_attention_inputs

    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v, _, cu = make_attention_inputs([a.tokens] * a.segments, a.heads, device="cpu", seed=0)  # same on every rank
    counts = token_counts(q.shape[0], world, a.split)
    first = sum(counts[:rank])
    mine = [t[first:first + counts[rank]].contiguous() for t in (q, k, v)]
    got = {}
    for mode in a.modes:
        attention = parallel.ulysses_attention if mode == "ulysses" else parallel.ring_attention
        out, lse = attention(*mine, cu, tokens_per_rank=counts, return_lse=True)
        got[mode] = gather(out, counts, dist), gather(lse.T.contiguous(), counts, dist).T
    ok = True
    if rank == 0:
        print(f"CPU reference path: gloo, {world} process{'es' if world > 1 else ''}, the attention alone "
              f"(no H3 block, no timing)\n"
              f"  {a.segments} x {a.tokens} tokens, {a.heads} heads, tokens per rank {counts}; each rank's attention "
              f"is h3kernels.reference\n"
              f"  (torch code computing what the FP8 kernels compute, slowly). With one CUDA GPU per rank this "
              f"script runs\n"
              f"  a whole MiniMax-H3 block over NCCL with the FP8 kernels instead, compares it with one GPU and "
              f"times it.")
        want, want_lse = R.attention_fp8(q, k, v, cu, return_lse=True)
        for mode, (out, lse) in got.items():
            if mode == "ulysses":
                same = same_bits(out, want) and same_bits(lse, want_lse)
                ok &= same
                print(f"  ulysses vs one process: {'out and lse bitwise equal' if same else 'NOT bitwise equal'}"
                      f"{'' if same else f' (rel L2 {rel_l2(out, want):.2e})'}")
            else:
                err = rel_l2(out, want)
                ok &= err <= RING_BOUND
                print(f"  ring vs one process: rel L2 {err:.2e} (bound {RING_BOUND}), lse max |diff| "
                      f"{(lse - want_lse).abs().max().item():.1e}")
        print("  " + ("as expected" if ok else "FAILED: outside the expected agreement"))
    dist.barrier()
    return 0 if ok else 1


def gpu_block(a, dist):
    """One H3 block over the ranks' GPUs against one GPU: agreement, times, communication."""
    sys.path.insert(0, HERE)
    from h3_block import INNER, H3Block

    from h3kernels import parallel, torch_ops
    from h3kernels.constants import H3_HEADS, HEAD_DIM, HIDDEN
    from h3kernels.peers.torch_mlp import row_stage
    from h3kernels.testing.checks import rel_l2, same_bits
    from h3kernels.testing.inputs import cu_seqlens_of
    from h3kernels.testing.timing import median_ms

    rank, world = dist.get_rank(), dist.get_world_size()
    mode = a.modes[0]
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
    attention = parallel.ulysses_attention if mode == "ulysses" else parallel.ring_attention

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
        cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
        t_ns, t_1s = [], []
        for _ in range(3):  # the two timings alternate, so that a clock ramp falls on both
            times = torch.tensor([median_ms(lambda: sp_block(x[mine].contiguous(), index[mine].contiguous()),
                                            warmup=1, reps=a.reps)], device="cuda")
            dist.all_reduce(times, op=dist.ReduceOp.MAX)  # the block is done when the slowest rank is
            t_ns.append(times.item())
            if rank == 0:
                t_1s.append(median_ms(lambda: block(x, mod, index, cu, cu_host), warmup=1, reps=a.reps))
            dist.barrier()
        t_n = statistics.median(t_ns)
        split = {}
        for _ in range(a.reps):
            sp_block(x[mine].contiguous(), index[mine].contiguous(), timings=split)
        out_all = gather(out_local, counts, dist)
        o_all = gather(o_local, counts, dist)
        q_all, k_all, v_all = (gather(t, counts, dist) for t in (q, k, v))
        if rank == 0:
            want = block(x, mod, index, cu, cu_host)
            want_o = torch_ops.minimax_h3_varlen_attention_fp8(q_all, k_all, v_all, cu, cu_host)
            t_1 = statistics.median(t_1s)
            print(f"{torch.cuda.get_device_name()} x {world}: one MiniMax-H3 block, {a.segments} x {a.tokens} "
                  f"tokens, {H3_HEADS} heads, {mode}, tokens per rank {counts}")
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
