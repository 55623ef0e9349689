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
