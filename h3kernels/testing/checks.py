"""The comparisons the tests, the demo and the benchmarks report: relative L2 error, cosine
similarity (both in float64) and the distance in bf16 steps between two bf16 tensors."""


def rel_l2(a, ref):
    """||a - ref|| / ||ref|| in float64."""
    import torch

    a, ref = torch.as_tensor(a).double(), torch.as_tensor(ref).double()
    return float((a - ref).norm() / ref.norm())


def cos(a, b):
    """Cosine similarity of the flattened tensors, in float64."""
    import torch

    return float(torch.nn.functional.cosine_similarity(torch.as_tensor(a).double().flatten(),
                                                       torch.as_tensor(b).double().flatten(), dim=0))


def bf16_ulps(a, b):
    """Elementwise distance in bf16 steps between two bf16 tensors of finite values (sign-aware:
    -0 and +0 are 0 apart, the smallest values of opposite signs 2)."""
    import torch

    def ordered(t):
        i = t.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(i < 0, -(i & 0x7FFF), i)
    return (ordered(a) - ordered(b)).abs()


# Keys per block of the attention kernel's pipeline: a segment of at most this many keys has
# its final row max from the first block on, so P rounds on the reference's grid.
ONE_BLOCK_KEYS = 64


def reference_bound(seqlen):
    """The rel L2 from h3kernels.reference that the output rows of a segment of `seqlen` keys are
    held to. 0.005 where P rounds on the reference's grid (a segment of one key block, whose
    running max is its final max: only the FP32 order and ex2.approx differ). Otherwise 0.03:
    the contract's online softmax rounds P against each block's running max, on other grids
    before the row's maximum, about 0.025 on thousands of random keys (docs/spec.md)."""
    return 0.005 if seqlen <= ONE_BLOCK_KEYS else 0.03


def attention_reference_misses(got, want, cu_host):
    """Where attention output `got` is further from the reference's `want` than
    varlen_attention_fp8.reference_bound allows, as (what, rel L2, bound) entries: each segment
    that fits one key block on its own (its bound is the tight one), and the whole set against
    the largest bound of its segments. [] when it is within them all."""
    lens = [b - a for a, b in zip(cu_host, cu_host[1:])]
    misses = []
    for seg, (a, n) in enumerate(zip(cu_host, lens)):
        if 0 < n and reference_bound(n) < reference_bound(max(lens)):
            err = rel_l2(got[a:a + n], want[a:a + n])
            if not err <= reference_bound(n):
                misses.append((f"segment {seg} ({n} keys)", err, reference_bound(n)))
    err, bound = rel_l2(got, want), reference_bound(max(lens, default=0))
    if not err <= bound:
        misses.append(("all rows", err, bound))
    return misses


def same_bits(a, b):
    """Whether two tensors of one shape and dtype hold the same bit patterns (NaNs included, -0
    apart from +0), on any device."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))
