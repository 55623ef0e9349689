"""h3kernels.parallel.attn_forward inside yunchang's own long-context attention (yunchang 0.6.4,
the test extra): LongContextAttention over a gloo group of two processes on the CPU, with
attn_forward as its per-rank attention (the reference on CPU tensors). Its Ulysses degree 2 is
bitwise the one-process attn_forward; its ring degree 2 merges partials that each quantized
their own key block: against float64 attention as accurate as one process, and from it by the
two FP8 roundings' independent errors. Skipped without yunchang."""
import importlib.util

import pytest
import torch

from h3kernels import parallel
from h3kernels import reference as R
from h3kernels.testing.checks import rel_l2, same_bits
from h3kernels.testing.distributed import run_ranks
from h3kernels.testing.inputs import make_attention_inputs

if importlib.util.find_spec("yunchang") is None:  # looked up, not imported: only the ranks import it
    pytest.skip("yunchang is not installed (pip install '.[test]' brings it)", allow_module_level=True)

MODULE = __name__
BATCH, SEQLEN, HEADS = 2, 256, 4
DEGREES = ((2, 1), (1, 2))  # (Ulysses, ring): all-to-all only, then ring only


def inputs(seed):
    """q, k, v [batch, seqlen, heads, 128] bf16, the same on every rank."""
    q, k, v, _, _ = make_attention_inputs([SEQLEN] * BATCH, HEADS, device="cpu", seed=seed, k_offset=3.0)
    return [t.view(BATCH, SEQLEN, HEADS, 128) for t in (q, k, v)]


def yunchang_ranks(rank, world, seed):
    """This rank's sequence shard through LongContextAttention for each (Ulysses, ring) degree."""
    import warnings

    with warnings.catch_warnings():  # yunchang's import compiles functions with torch.jit.script (deprecated)
        warnings.simplefilter("ignore", DeprecationWarning)
        from yunchang import LongContextAttention, set_seq_parallel_pg

    shard = SEQLEN // world
    mine = [t[:, rank * shard:(rank + 1) * shard].contiguous() for t in inputs(seed)]
    res = {}
    for ulysses, ring in DEGREES:
        set_seq_parallel_pg(ulysses, ring, rank, world)
        # attn_type None: no built-in kernel, so yunchang's ring calls attn_processor for each key block
        layer = LongContextAttention(ring_impl_type="basic", attn_type=None, attn_processor=parallel.attn_forward)
        with torch.no_grad():
            res[(ulysses, ring)] = layer(*mine)
    return res


@pytest.fixture(scope="module")
def shards(seed_of):
    seed = seed_of("parallel-yunchang")
    return seed, run_ranks(2, MODULE, "yunchang_ranks", (seed,))


def test_yunchang_ulysses_with_attn_forward_is_one_process_bitwise(shards):
    seed, results = shards
    q, k, v = inputs(seed)
    got = torch.cat([r[(2, 1)] for r in results], dim=1)
    assert got.shape == q.shape and got.dtype == torch.bfloat16
    assert same_bits(got, parallel.attn_forward(q, k, v, return_lse=False))


def test_yunchang_ring_with_attn_forward_is_as_accurate_as_one_process(shards):
    seed, results = shards
    q, k, v = inputs(seed)
    got = torch.cat([r[(1, 2)] for r in results], dim=1)
    one = parallel.attn_forward(q, k, v, return_lse=False)
    packed = [t.reshape(BATCH * SEQLEN, HEADS, 128) for t in (q, k, v, got, one)]
    cu = [i * SEQLEN for i in range(BATCH + 1)]
    exact = R.attention_exact(*packed[:3], cu)
    err_ring, err_one = rel_l2(packed[3], exact), rel_l2(packed[4], exact)
    print(f"yunchang ring of attn_forward: rel L2 {rel_l2(got, one):.5f} from one process; against float64 "
          f"{err_ring:.5f} (one process {err_one:.5f})")
    # against float64 the ring is as accurate as one process; the two differ by their independent
    # FP8 roundings (each partial quantizes its own key block: its own K mean and scales, V scale)
    assert err_ring <= 1.1 * err_one + 1e-3
    assert rel_l2(got, one) <= 2 * err_one
