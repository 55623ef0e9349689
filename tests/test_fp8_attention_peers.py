"""h3kernels.peers.fp8_attention on the CPU: the per-(segment, head) quantization FA3's FP8 peer
runs on, and the peers saying why they cannot run here instead of failing later."""
import pytest
import torch

from h3kernels.constants import E4M3_MAX
from h3kernels.peers import fp8_attention as P
from h3kernels.testing.inputs import make_attention_inputs


def test_segment_head_quantize_scales_each_segment_and_head_by_its_own_amax(seed):
    q, _, _, _, cu = make_attention_inputs([5, 0, 40, 3], 3, device="cpu", seed=seed)
    q[45:48, 1] = 0  # a segment and head with nothing in it: scale 1, codes 0
    q8, scale = P.segment_head_quantize(q, cu)
    assert q8.dtype == torch.float8_e4m3fn and scale.shape == (4, 3)
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        for h in range(3):
            amax = q[a:b, h].float().abs().max().item() if b > a else 0.0
            want = amax / E4M3_MAX if amax > 0 else 1.0
            assert scale[i, h].item() == pytest.approx(want, rel=1e-7)
            if b > a:
                codes = q8[a:b, h].float()
                assert codes.abs().max().item() <= E4M3_MAX
                if amax > 0:  # the largest element lands on the top of the e4m3 range
                    assert codes.abs().max().item() == pytest.approx(E4M3_MAX, rel=1 / 16)
                    back = codes * scale[i, h]
                    assert (back - q[a:b, h].float()).abs().max().item() <= amax / 16  # e4m3: 3 mantissa bits
    assert (q8[45:48, 1].float() == 0).all()


def test_peers_that_cannot_run_here_say_why(no_peer_modules):
    q, k, v, _, cu = make_attention_inputs([64, 64], 2, device="cpu", seed=1)
    for make in (P.fa3_bf16, P.fa3_fp8):
        with pytest.raises(P.PeerUnavailable, match="fa3-fwd"):
            make(q, k, v, cu, 0.1)
    with pytest.raises(P.PeerUnavailable, match="nvidia-cudnn-frontend"):
        P.cudnn_fp8(q, k, v, cu, 0.1)
    q2, k2, v2, _, cu2 = make_attention_inputs([64, 32], 2, device="cpu", seed=1)
    with pytest.raises(P.PeerUnavailable, match="one length"):
        P.cudnn_fp8(q2, k2, v2, cu2, 0.1)
    assert [(key, fp8) for key, _, _, fp8 in P.PEERS] == [("fa3", False), ("fa3_fp8", True), ("cudnn_fp8", True)]
