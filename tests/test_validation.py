"""minimax_h3_mlp_fp8's argument checks as one table (issue 5, item 1): each bad call raises
TypeError or ValueError naming the argument, what it got and what it needs, before any launch,
and `out` and every workspace keep their poison. The attention's table is BAD / BAD_GPU in
test_varlen_attention_fp8.py, with the same checks.
"""
import re

import pytest
import torch

import h3kernels
from h3kernels._runtime import compiler as jit
from h3kernels.constants import FC1_OUT, FFN, HIDDEN, MAX_M

M, ROWS = 64, 8
E4M3 = torch.float8_e4m3fn


def base_args():
    """A valid call: inputs, zero weights (values do not matter here), poisoned out and workspaces."""
    dev = "cuda"
    wide = torch.randn(ROWS, 6 * HIDDEN, device=dev).bfloat16()  # AdaLN tables: column chunks
    a = dict(x=torch.randn(M, HIDDEN, device=dev).bfloat16(),
             x_norm_weight=torch.ones(HIDDEN, device=dev).bfloat16(),
             adaln_scale=wide[:, HIDDEN:2 * HIDDEN], adaln_shift=wide[:, 3 * HIDDEN:4 * HIDDEN],
             adaln_index=torch.arange(M, device=dev) % ROWS, gate=wide[:, 2 * HIDDEN:3 * HIDDEN],
             residual=torch.randn(M, HIDDEN, device=dev).bfloat16(),
             fc1_weight_q=torch.zeros(FC1_OUT, HIDDEN, device=dev).to(E4M3),
             fc1_weight_scale=torch.ones(FC1_OUT, device=dev),
             fc2_weight_q=torch.zeros(HIDDEN, FFN, device=dev).to(E4M3),
             fc2_weight_scale=torch.ones(HIDDEN, device=dev))
    kw = dict(out=torch.full((M, HIDDEN), 3.0, device=dev).bfloat16(),
              workspace_a_q=torch.full((M, HIDDEN), 0x7F, dtype=torch.uint8, device=dev).view(E4M3),
              workspace_a_scale=torch.full((M,), 7.0, device=dev),
              workspace_y=torch.full((M, FFN), 5.0, device=dev).bfloat16(),
              workspace_y_q=torch.full((M, FFN), 0x7E, dtype=torch.uint8, device=dev).view(E4M3),
              workspace_y_scale=torch.full((M,), 9.0, device=dev),
              workspace_flags=torch.full((h3kernels.minimax_h3_mlp_fc2_flags(M),), -7, dtype=torch.int32, device=dev))
    return a, kw


def misaligned(t, elems=1):
    """t's values in a same-shape contiguous tensor whose base is `elems` elements off."""
    buf = torch.empty(t.numel() + elems, dtype=t.dtype, device=t.device)
    out = buf[elems:].view(t.shape)
    out.copy_(t)
    return out


def set_(name, f):
    def mutate(a, kw):
        where = a if name in a else kw
        where[name] = f(where[name], a, kw)
    return mutate


def other_gpu(t, a, kw):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs a second GPU")
    return t.to("cuda:1")


def form2_here(t, a, kw):
    if jit.arch_for(jit.device_cc(torch.cuda.current_device())) == "sm_120a":
        pytest.skip("form 2 is supported on this board")
    return 2


def square_tables(t, a, kw):
    """Tables with M rows, contiguous, and out placed on gate's memory."""
    for name in ("adaln_scale", "adaln_shift", "gate"):
        a[name] = torch.randn(M, HIDDEN, device="cuda").bfloat16()
    return a["gate"]


def overlapping_rows(t, a, kw):
    buf = torch.empty(M + 1, HIDDEN, device="cuda").bfloat16()
    buf[:M] = a["residual"]
    a["residual"] = buf[:M]
    return buf[1:]


def shared_y_buffers(a, kw):
    """workspace_y and workspace_y_q on one buffer."""
    buf = torch.zeros(2 * M * FFN, dtype=torch.uint8, device="cuda")
    kw["workspace_y"] = buf.view(torch.bfloat16).view(M, FFN)
    kw["workspace_y_q"] = buf[:M * FFN].view(E4M3).view(M, FFN)


MLP_BAD = [
    # id, mutation, exception, message (matched from the start)
    ("x-dtype", set_("x", lambda t, a, kw: t.float()), TypeError, "x: got torch.float32; need bfloat16"),
    ("x-shape", set_("x", lambda t, a, kw: t[:, :5000]), ValueError, "x: got shape (64, 5000); need shape (M, 5376)"),
    ("x-cpu", set_("x", lambda t, a, kw: t.cpu()), ValueError, "x: got a tensor on cpu; need a CUDA tensor"),
    ("residual-other-gpu", set_("residual", other_gpu), ValueError,
     "residual: got an array on cuda:1 while x is on cuda:0; need one device"),
    ("x-numpy", set_("x", lambda t, a, kw: t.cpu().float().numpy()), TypeError,
     "x: got numpy.ndarray; need a torch CUDA tensor or a CuPy array"),
    ("x-noncontiguous", set_("x", lambda t, a, kw: t.t().contiguous().t()), ValueError,
     "x: got strides (1, 64); need a contiguous array"),
    ("x-misaligned", set_("x", lambda t, a, kw: misaligned(t)), ValueError, "x: got base address 0x"),
    ("m-zero", lambda a, kw: a.update(x=a["x"][:0]), ValueError, f"x: got M = 0 rows; need 1 <= M <= {MAX_M}"),
    ("m-too-large", lambda a, kw: a.update(x=torch.empty(MAX_M + 1, HIDDEN, device="cuda").bfloat16()), ValueError,
     f"x: got M = {MAX_M + 1} rows; need 1 <= M <= {MAX_M} (M * 14336 must stay below 2**31)"),
    ("norm-weight-shape", set_("x_norm_weight", lambda t, a, kw: t[:100]), ValueError,
     "x_norm_weight: got shape (100,); need shape (5376,)"),
    ("scale-base-misaligned", set_("adaln_scale", lambda t, a, kw: torch.zeros(ROWS, HIDDEN + 8, device="cuda")
                                   .bfloat16()[:, 1:HIDDEN + 1]), ValueError, "adaln_scale: got base address 0x"),
    ("scale-row-pitch", set_("adaln_scale", lambda t, a, kw: torch.zeros(ROWS, HIDDEN + 4, device="cuda")
                             .bfloat16()[:, :HIDDEN]), ValueError,
     "adaln_scale: got row pitch 10760 bytes; need a row pitch that is a multiple of 16 bytes"),
    ("scale-column-stride", set_("adaln_scale", lambda t, a, kw: torch.zeros(ROWS, 2 * HIDDEN, device="cuda")
                                 .bfloat16()[:, ::2]), ValueError, "adaln_scale: got column stride 2; need column stride 1"),
    ("shift-rows", set_("adaln_shift", lambda t, a, kw: t[:ROWS - 1]), ValueError,
     "adaln_shift: got 7 rows; need 8 rows, as adaln_scale"),
    ("shift-row-stride", set_("adaln_shift", lambda t, a, kw: t.contiguous()), ValueError,
     "adaln_shift: got row stride 5376; need adaln_scale's row stride 32256"),
    ("shift-dtype", set_("adaln_shift", lambda t, a, kw: t.half()), TypeError,
     "adaln_shift: got torch.float16; need bfloat16"),
    ("gate-rows", set_("gate", lambda t, a, kw: t[:ROWS - 1]), ValueError, "gate: got 7 rows; need 8 rows, as adaln_scale"),
    ("gate-row-pitch", set_("gate", lambda t, a, kw: torch.zeros(ROWS, HIDDEN + 4, device="cuda").bfloat16()[:, :HIDDEN]),
     ValueError, "gate: got row pitch 10760 bytes"),
    ("index-dtype", set_("adaln_index", lambda t, a, kw: t.int()), TypeError, "adaln_index: got torch.int32; need int64"),
    ("index-shape", set_("adaln_index", lambda t, a, kw: t[:10]), ValueError,
     "adaln_index: got shape (10,); need shape (64,)"),
    ("eps-zero", set_("eps", lambda t, a, kw: 0.0), ValueError, "eps: got 0.0; need a positive float"),
    ("eps-negative", set_("eps", lambda t, a, kw: -1e-5), ValueError, "eps: got -1e-05"),
    ("eps-nan", set_("eps", lambda t, a, kw: float("nan")), ValueError, "eps: got nan"),
    ("eps-inf", set_("eps", lambda t, a, kw: float("inf")), ValueError, "eps: got inf"),
    ("eps-fp32-zero", set_("eps", lambda t, a, kw: 1e-50), ValueError, "eps: got 1e-50; need a positive float, finite and nonzero in FP32"),
    ("eps-str", set_("eps", lambda t, a, kw: "1e-5"), TypeError, "eps: got '1e-5'; need a positive finite float"),
    ("form-1", set_("fp8_mma_form", lambda t, a, kw: 1), ValueError, "fp8_mma_form: got 1; need -1, 0 or 2"),
    ("form-bool", set_("fp8_mma_form", lambda t, a, kw: True), ValueError, "fp8_mma_form: got True; need -1, 0 or 2"),
    ("form-2-unsupported", set_("fp8_mma_form", form2_here), ValueError,
     "fp8_mma_form: got 2; need -1 or 0 on this"),
    ("ws-a_q-shape", set_("workspace_a_q", lambda t, a, kw: t[:M - 1]), ValueError,
     "workspace_a_q: got shape (63, 5376); need shape (64, 5376)"),
    ("ws-a_q-dtype", set_("workspace_a_q", lambda t, a, kw: t.view(torch.uint8)), TypeError,
     "workspace_a_q: got torch.uint8; need float8_e4m3fn"),
    ("ws-a_scale-dtype", set_("workspace_a_scale", lambda t, a, kw: t.double()), TypeError,
     "workspace_a_scale: got torch.float64; need float32"),
    ("ws-y-dtype", set_("workspace_y", lambda t, a, kw: t.half()), TypeError, "workspace_y: got torch.float16; need bfloat16"),
    ("ws-y_q-shape", set_("workspace_y_q", lambda t, a, kw: t[:, :FFN - 16]), ValueError,
     "workspace_y_q: got shape (64, 14320); need shape (64, 14336)"),
    ("ws-y_scale-cpu", set_("workspace_y_scale", lambda t, a, kw: t.cpu()), ValueError,
     "workspace_y_scale: got a tensor on cpu; need a CUDA tensor"),
    ("ws-flags-shape", set_("workspace_flags", lambda t, a, kw: t[:3]), ValueError, "workspace_flags: got shape (3,)"),
    ("ws-flags-dtype", set_("workspace_flags", lambda t, a, kw: t.long()), TypeError,
     "workspace_flags: got torch.int64; need int32"),
    ("ws-y-overlaps-y_q", shared_y_buffers, ValueError,
     "workspace_y: got memory that overlaps workspace_y_q; need its own memory"),
    ("out-shape", set_("out", lambda t, a, kw: t[:, :5000]), ValueError, "out: got shape (64, 5000); need shape (64, 5376)"),
    ("out-dtype", set_("out", lambda t, a, kw: t.float()), TypeError, "out: got torch.float32; need bfloat16"),
    ("out-aliases-gate", set_("out", square_tables), ValueError,
     "out: got memory that overlaps gate; need its own memory (out may be residual or x)"),
    ("out-overlaps-residual", set_("out", overlapping_rows), ValueError, "out: got memory that overlaps residual"),
    ("out-noncontiguous", set_("out", lambda t, a, kw: a["adaln_shift"][:1].expand(M, HIDDEN)), ValueError,
     "out: got strides (0, 1); need a contiguous array"),
    ("residual-shape", set_("residual", lambda t, a, kw: t[:M - 1]), ValueError,
     "residual: got shape (63, 5376); need shape (64, 5376)"),
    ("fc1-q-dtype", set_("fc1_weight_q", lambda t, a, kw: torch.zeros(FC1_OUT, HIDDEN, device="cuda").bfloat16()),
     TypeError, "fc1_weight_q: got torch.bfloat16; need float8_e4m3fn"),
    ("fc1-scale-shape", set_("fc1_weight_scale", lambda t, a, kw: t[:-1]), ValueError,
     "fc1_weight_scale: got shape (28671,); need shape (28672,)"),
    ("fc2-q-shape", set_("fc2_weight_q", lambda t, a, kw: t.t()), ValueError,
     "fc2_weight_q: got shape (14336, 5376); need shape (5376, 14336)"),
    ("fc2-scale-dtype", set_("fc2_weight_scale", lambda t, a, kw: t.half()), TypeError,
     "fc2_weight_scale: got torch.float16; need float32"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("mutate,exc,msg", [c[1:] for c in MLP_BAD], ids=[c[0] for c in MLP_BAD])
def test_mlp_bad_call_raises_before_launch_and_writes_nothing(mutate, exc, msg):
    a, kw = base_args()
    kw.update(eps=1e-5, fp8_mma_form=-1)
    mutate(a, kw)
    written = {k: v for k, v in kw.items() if isinstance(v, torch.Tensor)}
    before = {k: v.clone() for k, v in written.items()}
    torch.cuda.synchronize()
    with pytest.raises(exc, match="^" + re.escape(msg)):
        h3kernels.minimax_h3_mlp_fp8(*a.values(), **kw)
    torch.cuda.synchronize()
    raw = lambda t: t.contiguous().view(torch.uint8)
    for k, v in written.items():
        assert torch.equal(raw(v), raw(before[k])), k


@pytest.mark.gpu
def test_gate_keeps_its_own_row_stride(weights):
    """gate reaches the FC2 epilogue with its own row pitch, so it may differ from the AdaLN
    tables' (scale and shift share one pitch in the row kernel, and must match). Real weights, so
    that out - residual depends on gate."""
    a, _ = base_args()
    for name, key in (("fc1_weight_q", "q1"), ("fc1_weight_scale", "s1"), ("fc2_weight_q", "q2"),
                      ("fc2_weight_scale", "s2")):
        a[name] = weights[key]
    want = h3kernels.minimax_h3_mlp_fp8(*a.values()).clone()
    assert not torch.equal(want, a["residual"])  # the gate term is there to be read
    a["gate"] = a["gate"].contiguous()  # row pitch 5376 instead of the chunk's 32256
    got = h3kernels.minimax_h3_mlp_fp8(*a.values())
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    a["gate"] = torch.zeros_like(a["gate"])
    assert torch.equal(h3kernels.minimax_h3_mlp_fp8(*a.values()).view(torch.int16), a["residual"].view(torch.int16))
