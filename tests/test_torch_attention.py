"""torch_attention.sdpa_bf16, the demo's and bench's torch peer, on the CPU: both of its paths
(one batched call for equal segments, one call per segment otherwise) against float64 attention;
sdpa_backend_bf16, bench's pinned-backend peers."""
import torch

from h3kernels import reference as R
from h3kernels.testing.checks import rel_l2
from h3kernels.testing.inputs import make_attention_inputs
from h3kernels.peers.torch_attention import sdpa_bf16


def test_sdpa_bf16_matches_exact_attention_on_both_paths(seed):
    for lens in ([64, 64, 64], [50, 0, 77, 1]):
        q, k, v, cu, cu_host = make_attention_inputs(lens, heads=3, device="cpu", seed=seed)
        assert cu.dtype == torch.int32 and cu.tolist() == cu_host and q.shape == (sum(lens), 3, 128)
        err = rel_l2(sdpa_bf16(q, k, v, cu_host), R.attention_exact(q, k, v, cu_host))
        assert err < 0.01, (lens, err)
    # the same two segments, batched and (with an empty segment between them) one call each
    q, k, v, _, cu_host = make_attention_inputs([64, 64], heads=2, device="cpu", seed=seed + 1)
    err = rel_l2(sdpa_bf16(q, k, v, cu_host), sdpa_bf16(q, k, v, [0, 64, 64, 128]))
    assert err < 1e-2, err


def test_sdpa_backend_bf16_pins_a_backend_or_says_it_is_refused(seed):
    """bench's attention peers: a backend torch refuses on these inputs (cuDNN's on the CPU) gives
    (None, label), never an exception; where a backend runs (torch's CPU flash kernel, the math
    one) the callable computes sdpa_bf16's output."""
    from h3kernels.peers.torch_attention import sdpa_backend_bf16

    q, k, v, _, cu_host = make_attention_inputs([64, 0, 50], heads=2, device="cpu", seed=seed)
    assert sdpa_backend_bf16(q, k, v, cu_host, "CUDNN_ATTENTION") == (None, "cuDNN SDPA bf16")
    for backend, want in (("FLASH_ATTENTION", "flash SDPA bf16"), ("MATH", "MATH")):
        fn, label = sdpa_backend_bf16(q, k, v, cu_host, backend)
        assert label == want and fn is not None and rel_l2(fn(), sdpa_bf16(q, k, v, cu_host)) < 1e-2
