"""One table of bad calls per operator, run three ways: against h3kernels.reference on CPU tensors,
against the GPU operator on CPU tensors (its dtype, shape and value checks come before the device
check, so they are reported as such on any machine), and against the GPU operator on the GPU.
Each bad call raises the same TypeError or ValueError, naming the argument, what it got and what
it needs (same type, same message start), before any work, and `out` and every workspace keep
their poison.

A case's `where` says which of the three it runs in: R (reference, CPU), C (GPU operator, CPU
tensors), G (GPU operator, GPU). Device cases are G only; cases whose check needs cu_seqlens'
values read back (after the device check) are R and G.
"""
import inspect
import re

import numpy as np
import pytest
import torch

import h3kernels
from h3kernels import reference as R
from h3kernels._runtime import targets
from h3kernels.constants import FC1_OUT, FFN, HIDDEN, MAX_M
from h3kernels.testing.inputs import make_attention_inputs, make_mlp_weights

M, ROWS = 64, 8
E4M3 = torch.float8_e4m3fn
BF = torch.bfloat16
WAYS = {"R": (R, "cpu"), "C": (h3kernels, "cpu"), "G": (h3kernels, "cuda")}


def ways(table):
    """pytest parameters (way, case) for every case of `table` and every way in its `where`."""
    params = []
    for case in table:
        for w in case[4]:
            marks = [pytest.mark.gpu] if w == "G" else []
            params.append(pytest.param(w, case[1:4], id=f"{w}-{case[0]}", marks=marks))
    return params


def raises_before_any_write(call, written, exc, msg):
    """call() raises exc with a message starting with msg, and every tensor of `written` keeps
    its bytes."""
    raw = lambda t: t.contiguous().view(torch.uint8)
    before = {k: raw(t).clone() for k, t in written.items()}
    if any(t.is_cuda for t in written.values()):
        torch.cuda.synchronize()
    with pytest.raises(exc, match="^" + re.escape(msg)):
        call()
    if any(t.is_cuda for t in written.values()):
        torch.cuda.synchronize()
    for k, t in written.items():
        assert torch.equal(raw(t), before[k]), k


def randn(g, *shape, dev):
    return torch.randn(*shape, generator=g, device=dev)


# --- MLP ----------------------------------------------------------------------------------------

_weights = {}


def mlp_args(dev, seed=0):
    """A valid call on `dev`: seeded inputs (AdaLN tables and gate are column chunks of one
    [rows, 6*5376] projection), zero weights (values do not matter here), poisoned out and
    workspaces."""
    g = torch.Generator(device=dev).manual_seed(seed)
    wide = randn(g, ROWS, 6 * HIDDEN, dev=dev).bfloat16()
    if dev not in _weights:
        _weights[dev] = dict(fc1_weight_q=torch.zeros(FC1_OUT, HIDDEN, device=dev).to(E4M3),
                             fc1_weight_scale=torch.ones(FC1_OUT, device=dev),
                             fc2_weight_q=torch.zeros(HIDDEN, FFN, device=dev).to(E4M3),
                             fc2_weight_scale=torch.ones(HIDDEN, device=dev))
    a = dict(x=randn(g, M, HIDDEN, dev=dev).bfloat16(), x_norm_weight=torch.ones(HIDDEN, device=dev).bfloat16(),
             adaln_scale=wide[:, HIDDEN:2 * HIDDEN], adaln_shift=wide[:, 3 * HIDDEN:4 * HIDDEN],
             adaln_index=torch.arange(M, device=dev) % ROWS, gate=wide[:, 2 * HIDDEN:3 * HIDDEN],
             residual=randn(g, M, HIDDEN, dev=dev).bfloat16(), **_weights[dev])
    kw = dict(out=torch.full((M, HIDDEN), 3.0, device=dev).bfloat16(),
              workspace_a_q=torch.full((M, HIDDEN), 0x7F, dtype=torch.uint8, device=dev).view(E4M3),
              workspace_a_scale=torch.full((M,), 7.0, device=dev),
              workspace_y=torch.full((M, FFN), 5.0, device=dev).bfloat16(),
              workspace_y_q=torch.full((M, FFN), 0x7E, dtype=torch.uint8, device=dev).view(E4M3),
              workspace_y_scale=torch.full((M,), 9.0, device=dev),
              workspace_flags=torch.full((h3kernels.minimax_h3_mlp_fc2_flags(M),), -7, dtype=torch.int32, device=dev),
              eps=1e-5, fp8_mma_form=-1)
    return a, kw


def misaligned(t, elems=1):
    """t's values in a same-shape contiguous tensor whose base is `elems` elements off."""
    buf = torch.empty(t.numel() + elems, dtype=t.dtype, device=t.device)
    out = buf[elems:].view(t.shape)
    out.copy_(t)
    return out


def set_(name, f):
    """A mutation that replaces argument `name` by f(its value, args, keyword args)."""
    def mutate(a, kw):
        where = a if name in a else kw
        where[name] = f(where[name], a, kw)
    return mutate


def other_gpu(t, a, kw):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs a second GPU")
    return t.to("cuda:1")


def form2_here(t, a, kw):
    if targets.arch_for(targets.device_cc(torch.cuda.current_device())) == "sm_120a":
        pytest.skip("form 2 is supported on this board")
    return 2


def square_tables(t, a, kw):
    """Tables with M rows, contiguous, and out placed on gate's memory."""
    g = torch.Generator(device=t.device).manual_seed(5)
    for name in ("adaln_scale", "adaln_shift", "gate"):
        a[name] = randn(g, M, HIDDEN, dev=t.device).bfloat16()
    return a["gate"]


def overlapping_rows(t, a, kw):
    buf = torch.empty(M + 1, HIDDEN, dtype=BF, device=t.device)
    buf[:M] = a["residual"]
    a["residual"] = buf[:M]
    return buf[1:]


def shared_y_buffers(a, kw):
    """workspace_y and workspace_y_q on one buffer."""
    buf = torch.zeros(2 * M * FFN, dtype=torch.uint8, device=a["x"].device)
    kw["workspace_y"] = buf.view(BF).view(M, FFN)
    kw["workspace_y_q"] = buf[:M * FFN].view(E4M3).view(M, FFN)


def zeros(*shape, dtype=torch.float32):
    return lambda t, a, kw: torch.zeros(*shape, dtype=dtype, device=t.device)


MLP_BAD = [
    # id, mutation, exception, message start, where
    ("x-dtype", set_("x", lambda t, a, kw: t.float()), TypeError, "x: got torch.float32; need bfloat16", "RCG"),
    ("x-shape", set_("x", lambda t, a, kw: t[:, :5000]), ValueError, "x: got shape (64, 5000); need shape (M, 5376)",
     "RCG"),
    ("x-hidden-4096", set_("x", lambda t, a, kw: t[:, :4096].contiguous()), ValueError,
     "x: got shape (64, 4096); need shape (M, 5376)", "RCG"),
    ("x-none", set_("x", lambda t, a, kw: None), TypeError, "x: got None; need a torch ", "RCG"),
    ("x-numpy", set_("x", lambda t, a, kw: t.cpu().float().numpy()), TypeError,
     "x: got numpy.ndarray; need a torch ", "RCG"),
    ("norm-weight-none", set_("x_norm_weight", lambda t, a, kw: None), TypeError, "x_norm_weight: got None", "RCG"),
    ("gate-list", set_("gate", lambda t, a, kw: [1.0]), TypeError, "gate: got list; need a torch ", "RCG"),
    ("ws-y-list", set_("workspace_y", lambda t, a, kw: []), TypeError, "workspace_y: got list; need a torch ", "RCG"),
    ("x-cpu", set_("x", lambda t, a, kw: t.cpu()), ValueError, "x: got a tensor on cpu; need a CUDA tensor", "G"),
    ("residual-other-gpu", set_("residual", other_gpu), ValueError,
     "residual: got an array on cuda:1 while x is on cuda:0; need one device", "G"),
    ("x-noncontiguous", set_("x", lambda t, a, kw: t.t().contiguous().t()), ValueError,
     "x: got strides (1, 64); need a contiguous array", "RCG"),
    ("x-misaligned", set_("x", lambda t, a, kw: misaligned(t)), ValueError, "x: got base address 0x", "RCG"),
    ("m-zero", lambda a, kw: a.update(x=a["x"][:0]), ValueError, f"x: got M = 0 rows; need 1 <= M <= {MAX_M}", "RCG"),
    ("m-too-large", set_("x", lambda t, a, kw: t[:1].expand(MAX_M + 1, HIDDEN)), ValueError,
     f"x: got M = {MAX_M + 1} rows; need 1 <= M <= {MAX_M} (M * 14336 must stay below 2**31)", "RCG"),
    ("norm-weight-shape", set_("x_norm_weight", lambda t, a, kw: t[:100]), ValueError,
     "x_norm_weight: got shape (100,); need shape (5376,)", "RCG"),
    ("scale-base-misaligned", set_("adaln_scale", lambda t, a, kw: zeros(ROWS, HIDDEN + 8, dtype=BF)(t, a, kw)
                                   [:, 1:HIDDEN + 1]), ValueError, "adaln_scale: got base address 0x", "RCG"),
    ("scale-row-pitch", set_("adaln_scale", lambda t, a, kw: zeros(ROWS, HIDDEN + 4, dtype=BF)(t, a, kw)[:, :HIDDEN]),
     ValueError, "adaln_scale: got row pitch 10760 bytes; need a row pitch that is a multiple of 16 bytes", "RCG"),
    ("scale-column-stride", set_("adaln_scale", lambda t, a, kw: zeros(ROWS, 2 * HIDDEN, dtype=BF)(t, a, kw)[:, ::2]),
     ValueError, "adaln_scale: got column stride 2; need column stride 1", "RCG"),
    ("shift-rows", set_("adaln_shift", lambda t, a, kw: t[:ROWS - 1]), ValueError,
     "adaln_shift: got 7 rows; need 8 rows, as adaln_scale", "RCG"),
    ("shift-row-stride", set_("adaln_shift", lambda t, a, kw: t.contiguous()), ValueError,
     "adaln_shift: got row stride 5376; need adaln_scale's row stride 32256", "RCG"),
    ("shift-dtype", set_("adaln_shift", lambda t, a, kw: t.half()), TypeError,
     "adaln_shift: got torch.float16; need bfloat16", "RCG"),
    ("gate-rows", set_("gate", lambda t, a, kw: t[:ROWS - 1]), ValueError, "gate: got 7 rows; need 8 rows, as adaln_scale",
     "RCG"),
    ("gate-row-pitch", set_("gate", lambda t, a, kw: zeros(ROWS, HIDDEN + 4, dtype=BF)(t, a, kw)[:, :HIDDEN]),
     ValueError, "gate: got row pitch 10760 bytes", "RCG"),
    ("index-dtype", set_("adaln_index", lambda t, a, kw: t.int()), TypeError, "adaln_index: got torch.int32; need int64",
     "RCG"),
    ("index-shape", set_("adaln_index", lambda t, a, kw: t[:10]), ValueError,
     "adaln_index: got shape (10,); need shape (64,)", "RCG"),
    ("eps-zero", set_("eps", lambda t, a, kw: 0.0), ValueError, "eps: got 0.0; need a positive float", "RCG"),
    ("eps-negative", set_("eps", lambda t, a, kw: -1e-5), ValueError, "eps: got -1e-05", "RCG"),
    ("eps-nan", set_("eps", lambda t, a, kw: float("nan")), ValueError, "eps: got nan", "RCG"),
    ("eps-inf", set_("eps", lambda t, a, kw: float("inf")), ValueError, "eps: got inf", "RCG"),
    ("eps-fp32-zero", set_("eps", lambda t, a, kw: 1e-50), ValueError,
     "eps: got 1e-50; need a positive float, finite and nonzero in FP32", "RCG"),
    ("eps-str", set_("eps", lambda t, a, kw: "1e-5"), TypeError, "eps: got '1e-5'; need a positive finite float", "RCG"),
    ("form-1", set_("fp8_mma_form", lambda t, a, kw: 1), ValueError, "fp8_mma_form: got 1; need -1, 0, 2 or 3", "RCG"),
    ("form-bool", set_("fp8_mma_form", lambda t, a, kw: True), ValueError, "fp8_mma_form: got True; need -1, 0, 2 or 3",
     "RCG"),
    ("form-2-unsupported", set_("fp8_mma_form", form2_here), ValueError, "fp8_mma_form: got 2; need -1 or 0 on this",
     "G"),
    ("ws-a_q-shape", set_("workspace_a_q", lambda t, a, kw: t[:M - 1]), ValueError,
     "workspace_a_q: got shape (63, 5376); need shape (64, 5376)", "RCG"),
    ("ws-a_q-dtype", set_("workspace_a_q", lambda t, a, kw: t.view(torch.uint8)), TypeError,
     "workspace_a_q: got torch.uint8; need float8_e4m3fn", "RCG"),
    ("ws-a_scale-dtype", set_("workspace_a_scale", lambda t, a, kw: t.double()), TypeError,
     "workspace_a_scale: got torch.float64; need float32", "RCG"),
    ("ws-y-dtype", set_("workspace_y", lambda t, a, kw: t.half()), TypeError,
     "workspace_y: got torch.float16; need bfloat16", "RCG"),
    ("ws-y_q-shape", set_("workspace_y_q", lambda t, a, kw: t[:, :FFN - 16]), ValueError,
     "workspace_y_q: got shape (64, 14320); need shape (64, 14336)", "RCG"),
    ("ws-y_scale-cpu", set_("workspace_y_scale", lambda t, a, kw: t.cpu()), ValueError,
     "workspace_y_scale: got a tensor on cpu; need a CUDA tensor", "G"),
    ("ws-flags-shape", set_("workspace_flags", lambda t, a, kw: t[:3]), ValueError, "workspace_flags: got shape (3,)",
     "RCG"),
    ("ws-flags-dtype", set_("workspace_flags", lambda t, a, kw: t.long()), TypeError,
     "workspace_flags: got torch.int64; need int32", "RCG"),
    ("ws-y-overlaps-y_q", shared_y_buffers, ValueError,
     "workspace_y: got memory that overlaps workspace_y_q; need its own memory", "RCG"),
    ("out-shape", set_("out", lambda t, a, kw: t[:, :5000]), ValueError, "out: got shape (64, 5000); need shape (64, 5376)",
     "RCG"),
    ("out-dtype", set_("out", lambda t, a, kw: t.float()), TypeError, "out: got torch.float32; need bfloat16", "RCG"),
    ("out-aliases-gate", set_("out", square_tables), ValueError,
     "out: got memory that overlaps gate; need its own memory (out may be residual or x)", "RCG"),
    ("out-overlaps-residual", set_("out", overlapping_rows), ValueError, "out: got memory that overlaps residual", "RCG"),
    ("out-noncontiguous", set_("out", lambda t, a, kw: a["adaln_shift"][:1].expand(M, HIDDEN)), ValueError,
     "out: got strides (0, 1); need a contiguous array", "RCG"),
    ("residual-shape", set_("residual", lambda t, a, kw: t[:M - 1]), ValueError,
     "residual: got shape (63, 5376); need shape (64, 5376)", "RCG"),
    ("fc1-q-dtype", set_("fc1_weight_q", zeros(FC1_OUT, HIDDEN, dtype=BF)), TypeError,
     "fc1_weight_q: got torch.bfloat16; need float8_e4m3fn", "RCG"),
    ("fc1-scale-shape", set_("fc1_weight_scale", lambda t, a, kw: t[:-1]), ValueError,
     "fc1_weight_scale: got shape (28671,); need shape (28672,)", "RCG"),
    ("fc2-q-shape", set_("fc2_weight_q", lambda t, a, kw: t.t()), ValueError,
     "fc2_weight_q: got shape (14336, 5376); need shape (5376, 14336)", "RCG"),
    ("fc2-scale-dtype", set_("fc2_weight_scale", lambda t, a, kw: t.half()), TypeError,
     "fc2_weight_scale: got torch.float16; need float32", "RCG"),
]


@pytest.mark.parametrize("way,case", ways(MLP_BAD))
def test_mlp_bad_call_raises_before_any_work_and_writes_nothing(way, case):
    mutate, exc, msg = case
    ops, dev = WAYS[way]
    a, kw = mlp_args(dev)
    mutate(a, kw)
    written = {k: t for k, t in kw.items() if isinstance(t, torch.Tensor)}
    raises_before_any_write(lambda: ops.minimax_h3_mlp_fp8(*a.values(), **kw), written, exc, msg)


ROW_STAGE_ARGS = ("x", "x_norm_weight", "adaln_scale", "adaln_shift", "adaln_index", "workspace_a_q",
                  "workspace_a_scale", "eps")
ROW_STAGE_BAD = [case for case in MLP_BAD if case[3].split(":")[0] in ROW_STAGE_ARGS]  # by the argument named


@pytest.mark.parametrize("way,case", ways(ROW_STAGE_BAD))
def test_row_stage_bad_call_raises_before_any_work_and_writes_nothing(way, case):
    mutate, exc, msg = case
    ops, dev = WAYS[way]
    a, kw = mlp_args(dev)
    mutate(a, kw)
    args = {k: a[k] for k in ROW_STAGE_ARGS[:5]}
    kws = {k: kw[k] for k in ROW_STAGE_ARGS[5:]}
    written = {k: t for k, t in kws.items() if isinstance(t, torch.Tensor)}
    raises_before_any_write(lambda: ops.minimax_h3_mlp_fp8_row_stage(*args.values(), **kws), written, exc, msg)


def test_reference_row_stage_takes_the_operators_arguments():
    """R.minimax_h3_mlp_fp8_row_stage: (a_q, a_scale), written into the workspaces when given."""
    a, kw = mlp_args("cpu", seed=3)
    args = [a["x"][:2], a["x_norm_weight"], a["adaln_scale"], a["adaln_shift"], a["adaln_index"][:2]]
    want_q, want_s = R.quantize_rows(R.mlp_row_stage(*args, eps=1e-6))
    q, s = R.minimax_h3_mlp_fp8_row_stage(*args, eps=1e-6)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(s, want_s)
    ws_q, ws_s = kw["workspace_a_q"][:2], kw["workspace_a_scale"][:2]
    got = R.minimax_h3_mlp_fp8_row_stage(*args, workspace_a_q=ws_q, workspace_a_scale=ws_s, eps=1e-6)
    assert got[0] is ws_q and got[1] is ws_s
    assert torch.equal(ws_q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(ws_s, want_s)


@pytest.mark.gpu
def test_gate_keeps_its_own_row_stride():
    """gate reaches the FC2 epilogue with its own row pitch, so it may differ from the AdaLN
    tables' (scale and shift share one pitch in the row kernel, and must match). Real weights, so
    that out - residual depends on gate."""
    a, _ = mlp_args("cuda")
    *_, q1, s1, q2, s2 = make_mlp_weights(M, ROWS, seed=4, device="cuda")
    a.update(fc1_weight_q=q1, fc1_weight_scale=s1, fc2_weight_q=q2, fc2_weight_scale=s2)
    want = h3kernels.minimax_h3_mlp_fp8(*a.values()).clone()
    assert not torch.equal(want, a["residual"])  # the gate term is there to be read
    a["gate"] = a["gate"].contiguous()  # row pitch 5376 instead of the chunk's 32256
    got = h3kernels.minimax_h3_mlp_fp8(*a.values())
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    a["gate"] = torch.zeros_like(a["gate"])
    assert torch.equal(h3kernels.minimax_h3_mlp_fp8(*a.values()).view(torch.int16), a["residual"].view(torch.int16))


# --- attention ----------------------------------------------------------------------------------

def attention_args(dev, seqlens=(3, 0, 5), heads=2, seed=1):
    """A valid call on `dev` (seeded inputs, cu_seqlens and its host copy) with a poisoned out."""
    q, k, v, cu, cu_host = make_attention_inputs(list(seqlens), heads, device=dev, seed=seed)
    return dict(q=q, k=k, v=v, cu_seqlens=cu, out=torch.full_like(q, 7.0), cu_seqlens_host=cu_host,
                softmax_scale=None)


def put(name, f):
    def mutate(a):
        a[name] = f(a[name], a)
    return mutate


def device_cu(values):
    """cu_seqlens given on the device only: its values are read back, then checked."""
    def mutate(a):
        a["cu_seqlens_host"] = None
        a["cu_seqlens"] = torch.tensor(values, dtype=torch.int32, device=a["q"].device)
    return mutate


def tokens_200(cu, host):
    """200 tokens with cu_seqlens `cu` (ending short of them): given on the device only unless host."""
    def mutate(a):
        dev = a["q"].device
        a.update(attention_args(dev, seqlens=(100, 100), seed=2))
        a["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32, device=dev)
        a["cu_seqlens_host"] = list(cu) if host else None
    return mutate


def on_second_gpu(name):
    def mutate(a):
        if torch.cuda.device_count() < 2:
            pytest.skip("needs a second GPU")
        a[name] = a[name].to("cuda:1")
    return mutate


def head_dim_64(a):
    for name in ("q", "k", "v"):
        a[name] = a[name][..., :64].contiguous()


ATTENTION_BAD = [
    # id, mutation, exception, message start, where
    ("q-fp32", put("q", lambda t, a: t.float()), TypeError, "q: got torch.float32; need bfloat16", "RCG"),
    ("v-fp16", put("v", lambda t, a: t.half()), TypeError, "v: got torch.float16; need bfloat16", "RCG"),
    ("head-dim-64", head_dim_64, ValueError, "q: got shape (8, 2, 64); need shape (tokens, heads >= 1, 128)", "RCG"),
    ("q-2d", put("q", lambda t, a: t[0]), ValueError, "q: got shape (2, 128); need shape (tokens, heads >= 1, 128)",
     "RCG"),
    ("k-other-length", put("k", lambda t, a: t[:7]), ValueError, "k: got shape (7, 2, 128); need q's shape (8, 2, 128)",
     "RCG"),
    ("k-heads", put("k", lambda t, a: t[:, :1]), ValueError, "k: got shape (8, 1, 128); need q's shape (8, 2, 128)",
     "RCG"),
    ("k-noncontiguous", put("k", lambda t, a: t.transpose(0, 1).contiguous().transpose(0, 1)), ValueError,
     "k: got strides (128, 1024, 1)", "RCG"),
    ("k-misaligned", put("k", lambda t, a: misaligned(t)), ValueError, "k: got base address 0x", "RCG"),
    ("q-none", put("q", lambda t, a: None), TypeError, "q: got None; need a torch ", "RCG"),
    ("v-numpy", put("v", lambda t, a: t.cpu().float().numpy()), TypeError, "v: got numpy.ndarray; need a torch ", "RCG"),
    ("cu-list", put("cu_seqlens", lambda t, a: t.tolist()), TypeError, "cu_seqlens: got list; need a torch ", "RCG"),
    ("cu-dtype", put("cu_seqlens", lambda t, a: t.long()), TypeError, "cu_seqlens: got torch.int64; need int32", "RCG"),
    ("cu-2d", put("cu_seqlens", lambda t, a: t[None]), ValueError,
     "cu_seqlens: got shape (1, 4); need shape (segments + 1,)", "RCG"),
    ("cu-short-of-tokens", tokens_200([0, 100, 150], host=False), ValueError,
     "cu_seqlens: got last entry 150; need tokens = 200 (q.shape[0])", "RG"),
    ("cu-host-short-of-tokens", tokens_200([0, 100, 150], host=True), ValueError,
     "cu_seqlens_host: got last entry 150; need tokens = 200 (q.shape[0])", "RCG"),
    ("cu-decreasing", device_cu([0, 4, 3, 8]), ValueError,
     "cu_seqlens: got entries 4, 3 at 1, 2; need non-decreasing entries", "RG"),
    ("cu-first", device_cu([1, 3, 3, 8]), ValueError, "cu_seqlens: got first entry 1; need 0", "RG"),
    ("cu-host-decreasing", put("cu_seqlens_host", lambda t, a: [0, 4, 3, 8]), ValueError,
     "cu_seqlens_host: got entries 4, 3 at 1, 2; need non-decreasing entries", "RCG"),
    ("cu-host-first", put("cu_seqlens_host", lambda t, a: [1, 3, 3, 8]), ValueError,
     "cu_seqlens_host: got first entry 1; need 0", "RCG"),
    ("cu-host-last", put("cu_seqlens_host", lambda t, a: [0, 3, 3, 9]), ValueError,
     "cu_seqlens_host: got last entry 9; need tokens = 8 (q.shape[0])", "RCG"),
    ("cu-host-length", put("cu_seqlens_host", lambda t, a: [0, 3, 8]), ValueError,
     "cu_seqlens_host: got 3 entries; need 4, as cu_seqlens", "RCG"),
    ("cu-host-strings", put("cu_seqlens_host", lambda t, a: ["a", 3, 3, 8]), TypeError,
     "cu_seqlens_host: got list; need a sequence of ints", "RCG"),
    ("cu-host-on-gpu", put("cu_seqlens_host", lambda t, a: torch.tensor(t, dtype=torch.int32, device="cuda")),
     TypeError, "cu_seqlens_host: got a torch device array; need a host sequence of ints", "G"),
    ("scale-zero", put("softmax_scale", lambda t, a: 0.0), ValueError, "softmax_scale: got 0.0; need a positive float",
     "RCG"),
    ("scale-nan", put("softmax_scale", lambda t, a: float("nan")), ValueError, "softmax_scale: got nan", "RCG"),
    ("scale-fp32-inf", put("softmax_scale", lambda t, a: 1e39), ValueError, "softmax_scale: got 1e+39", "RCG"),
    ("scale-str", put("softmax_scale", lambda t, a: "0.1"), TypeError,
     "softmax_scale: got '0.1'; need a positive finite float", "RCG"),
    ("scale-bool", put("softmax_scale", lambda t, a: True), TypeError,
     "softmax_scale: got True; need a positive finite float", "RCG"),
    ("form-1", lambda a: a.update(fp8_mma_form=1), ValueError, "fp8_mma_form: got 1; need -1, 0, 2 or 3", "RCG"),
    ("form-bool", lambda a: a.update(fp8_mma_form=False), ValueError, "fp8_mma_form: got False; need -1, 0, 2 or 3",
     "RCG"),
    ("return-lse-int", lambda a: a.update(return_lse=1), TypeError, "return_lse: got 1; need True or False", "RCG"),
    ("return-lse-none", lambda a: a.update(return_lse=None), TypeError, "return_lse: got None; need True or False",
     "RCG"),
    ("out-dtype", put("out", lambda t, a: t.float()), TypeError, "out: got torch.float32; need bfloat16", "RCG"),
    ("out-head-dim", put("out", lambda t, a: t[..., :64].contiguous()), ValueError,
     "out: got shape (8, 2, 64); need shape (8, 2, 128)", "RCG"),
    ("out-noncontiguous", put("out", lambda t, a: t.transpose(0, 1).contiguous().transpose(0, 1)), ValueError,
     "out: got strides (128, 1024, 1); need a contiguous array", "RCG"),
    ("q-cpu", put("q", lambda t, a: t.cpu()), ValueError, "q: got a tensor on cpu; need a CUDA tensor", "G"),
    ("cu-cpu", put("cu_seqlens", lambda t, a: t.cpu()), ValueError,
     "cu_seqlens: got a tensor on cpu; need a CUDA tensor", "G"),
    ("k-other-gpu", on_second_gpu("k"), ValueError, "k: got an array on cuda:1 while q is on cuda:0; need one device",
     "G"),
]


@pytest.mark.parametrize("way,case", ways(ATTENTION_BAD))
def test_attention_bad_call_raises_before_any_work_and_writes_nothing(way, case):
    mutate, exc, msg = case
    ops, dev = WAYS[way]
    a = attention_args(dev)
    mutate(a)
    op = ops.minimax_h3_varlen_attention_fp8
    if "fp8_mma_form" in a and "fp8_mma_form" not in inspect.signature(op).parameters:
        pytest.skip("this operator has no fp8_mma_form")
    written = {"out": a["out"]} if isinstance(a["out"], torch.Tensor) else {}
    held = h3kernels.workspace_bytes() if way == "G" else None
    raises_before_any_write(lambda: op(**a), written, exc, msg)
    if way == "G":
        assert h3kernels.workspace_bytes() == held


def test_reference_attention_takes_the_operators_arguments():
    """Every valid fp8_mma_form gives the same result; cu_seqlens_host, when given, replaces the
    read-back; out is written and returned."""
    a = attention_args("cpu", seqlens=(5, 0, 70), heads=2, seed=6)
    want = R.attention_fp8(a["q"], a["k"], a["v"], a["cu_seqlens_host"])
    for form in (-1, 0, 2, 3):
        got = R.minimax_h3_varlen_attention_fp8(a["q"], a["k"], a["v"], a["cu_seqlens"], fp8_mma_form=form)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    out = a["out"]
    got = R.minimax_h3_varlen_attention_fp8(a["q"], a["k"], a["v"], a["cu_seqlens"], out,
                                            cu_seqlens_host=a["cu_seqlens_host"])
    assert got is out and torch.equal(out.view(torch.int16), want.view(torch.int16))


# --- the small public helpers --------------------------------------------------------------------

WEIGHT_BAD = [
    # (bad weight of the given shape, exception, message start after "w1: " or "w2: ")
    (lambda shape: None, TypeError, "got None; need a torch tensor"),
    (lambda shape: np.zeros(shape, np.float32), TypeError, "got numpy.ndarray; need a torch tensor"),
    (lambda shape: torch.zeros(4, 4, dtype=torch.int32), TypeError, "got torch.int32; need bfloat16, float16 or float32"),
    (lambda shape: torch.zeros(shape[0], 8), ValueError, "got shape ({rows}, 8); need shape ({rows}, {cols})"),
]


@pytest.mark.parametrize("make,exc,msg", WEIGHT_BAD, ids=["none", "numpy", "int32", "shape"])
@pytest.mark.parametrize("name,shape", [("w1", (FC1_OUT, HIDDEN)), ("w2", (HIDDEN, FFN))])
@pytest.mark.parametrize("ops", [R, h3kernels], ids=["reference", "operator"])
def test_weight_preparation_refuses_bad_weights(ops, name, shape, make, exc, msg):
    prepare = ops.prepare_minimax_h3_fc1_weight_fp8 if name == "w1" else ops.prepare_minimax_h3_fc2_weight_fp8
    want = f"{name}: " + msg.format(rows=shape[0], cols=shape[1])
    with pytest.raises(exc, match="^" + re.escape(want)):
        prepare(make(shape))


@pytest.mark.parametrize("m,exc,msg", [
    (0, ValueError, f"m: got 0; need an int in [1, {MAX_M}]"),
    (MAX_M + 1, ValueError, f"m: got {MAX_M + 1}; need an int in [1, {MAX_M}]"),
    (1.5, TypeError, "m: got 1.5; need an int"),
    (True, TypeError, "m: got True; need an int"),
    (None, TypeError, "m: got None; need an int"),
])
def test_fc2_flag_count_refuses_bad_row_counts(m, exc, msg):
    with pytest.raises(exc, match="^" + re.escape(msg)):
        h3kernels.minimax_h3_mlp_fc2_flags(m)


def test_fc2_flag_count_of_good_row_counts():
    assert h3kernels.minimax_h3_mlp_fc2_flags(1) == h3kernels.minimax_h3_mlp_fc2_flags(np.int64(128)) == 15


@pytest.mark.parametrize("device,exc,msg", [
    ("gpu", ValueError, "device: got 'gpu'; need None, 'cpu', 'cuda', 'cuda:N' or a torch.device"),
    (3, TypeError, "device: got 3; need None, 'cpu'"),
    ("meta", ValueError, "device: got 'meta'; need None, 'cpu'"),
])
def test_fc1_row_order_refuses_bad_devices(device, exc, msg):
    with pytest.raises(exc, match="^" + re.escape(msg)):
        h3kernels.minimax_h3_fc1_row_order(device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch sees a CUDA device here")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda")])
def test_fc1_row_order_on_cuda_without_cuda_is_a_value_error(device):
    with pytest.raises(ValueError, match="^" + re.escape(f"device: got {device!r}; need 'cpu' or None here")):
        h3kernels.minimax_h3_fc1_row_order(device)


@pytest.mark.parametrize("device,exc", [("gpu", TypeError), ("cuda:x", TypeError), (1.5, TypeError),
                                        (True, TypeError), (-1, ValueError), (torch.device("cpu"), ValueError)])
def test_workspace_bytes_refuses_bad_devices_even_when_nothing_is_held(device, exc):
    with pytest.raises(exc, match="^device: got "):
        h3kernels.workspace_bytes(device)


def partial_args(dev, seed=1):
    """Arguments of minimax_h3_varlen_attention_fp8_partial: 8 query tokens in segments (3, 5)
    against 6 keys in (4, 2), 2 heads."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(n, 2, 128, generator=g).to(dev).bfloat16() for n in (8, 6, 6))
    mean, scale = (torch.rand(2, 2, 128, generator=g).to(dev) for _ in range(2))
    return dict(q=q, k=k, v=v, cu_seqlens_q=(0, 3, 8), cu_seqlens_k=[0, 4, 6], k_mean=mean, v_scale=scale)


PARTIAL_BAD = [
    ("q", lambda a: a["q"].float(), TypeError, "q: got .*float32.*bfloat16"),
    ("q", lambda a: a["q"][:, :, :64].contiguous(), ValueError, r"q: got shape \(8, 2, 64\)"),
    ("k", lambda a: a["k"][:, :1].contiguous(), ValueError, "k: got 1 heads; need q's 2"),
    ("v", lambda a: a["v"][:5], ValueError, r"v: got shape \(5, 2, 128\); need k's shape"),
    ("k", lambda a: a["k"].transpose(0, 1).contiguous().transpose(0, 1), ValueError, "k: .*contiguous"),
    ("cu_seqlens_q", lambda a: (0, 3, 7), ValueError, "cu_seqlens_q: got last entry 7; need tokens = 8"),
    ("cu_seqlens_k", lambda a: (1, 4, 6), ValueError, "cu_seqlens_k: got first entry 1; need 0"),
    ("cu_seqlens_k", lambda a: (0, 5, 4, 6), ValueError, "cu_seqlens_k: got entries 5, 4"),
    ("cu_seqlens_k", lambda a: (0, 6), ValueError, "cu_seqlens_k: got 2 entries; need 3, as cu_seqlens_q"),
    ("cu_seqlens_q", lambda a: (0, 3.0, 8), TypeError, "cu_seqlens_q: got tuple; need a sequence of ints"),
    ("cu_seqlens_q", lambda a: (0,), ValueError, "cu_seqlens_q: got 1 entries; need at least 2"),
    ("k_mean", lambda a: a["k_mean"].double(), TypeError, "k_mean: got .*float64.*float32"),
    ("v_scale", lambda a: a["v_scale"][:1], ValueError, r"v_scale: got shape \(1, 2, 128\)"),
    ("v_scale", lambda a: a["v_scale"].cpu().numpy(), TypeError, "v_scale: got numpy.ndarray"),
    ("k_scale", lambda a: torch.ones(3, 2), ValueError, r"k_scale: got shape \(3, 2\); need shape \(2, 2\)"),
    ("k_scale", lambda a: torch.ones(2, 2, dtype=torch.float64), TypeError, "k_scale: got .*float64.*float32"),
    ("k_mean", lambda a: None, TypeError, "k_mean: got None; need"),
    ("exact_lse", lambda a: 1, TypeError, "exact_lse: got 1; need True or False"),
]


@pytest.mark.parametrize("name,make,exc,msg", PARTIAL_BAD, ids=[f"{c[0]}-{i}" for i, c in enumerate(PARTIAL_BAD)])
def test_partial_attention_bad_call_raises_before_any_work(name, make, exc, msg):
    args = partial_args("cpu")
    args[name] = make(args)
    with pytest.raises(exc, match=msg):
        h3kernels.minimax_h3_varlen_attention_fp8_partial(**args)


STATISTICS_BAD = [
    ("segment_sums", dict(v=lambda a: a["v"][:5]), ValueError, r"v: got shape \(5, 2, 128\); need k's shape"),
    ("segment_sums", dict(v=lambda a: None), TypeError, "v: got None; need"),
    ("key_block_scales", dict(k_mean=lambda a: None), TypeError, "k_mean: got None; need"),
    ("segment_sums", dict(cu_seqlens_k=lambda a: (0, 4, 5)), ValueError, "cu_seqlens_k: got last entry 5"),
    ("key_block_scales", dict(k_first=lambda a: (0,)), ValueError, "k_first: got 1 entries; need 2, one per segment"),
    ("key_block_scales", dict(k_first=lambda a: (0, -1)), ValueError, "k_first: got entry -1; need entries >= 0"),
    ("key_block_scales", dict(k_mean=lambda a: a["k_mean"][:, :1]), ValueError, r"k_mean: got shape \(2, 1, 128\)"),
]


@pytest.mark.parametrize("op,change,exc,msg", STATISTICS_BAD, ids=[f"{c[0]}-{i}" for i, c in enumerate(STATISTICS_BAD)])
def test_ring_statistics_bad_call_raises_before_any_work(op, change, exc, msg):
    from h3kernels import varlen_attention_fp8 as A

    a = partial_args("cpu")
    args = (dict(k=a["k"], v=a["v"], cu_seqlens_k=a["cu_seqlens_k"]) if op == "segment_sums" else
            dict(k=a["k"], cu_seqlens_k=a["cu_seqlens_k"], k_mean=a["k_mean"], k_first=(0, 4)))
    args.update({name: make(a) for name, make in change.items()})
    with pytest.raises(exc, match=msg):
        getattr(A, f"minimax_h3_varlen_attention_fp8_{op}")(**args)


def test_partial_attention_on_cpu_tensors_is_a_device_error():
    with pytest.raises(ValueError, match="q: got a tensor on cpu; need a CUDA tensor"):
        h3kernels.minimax_h3_varlen_attention_fp8_partial(**partial_args("cpu"))
