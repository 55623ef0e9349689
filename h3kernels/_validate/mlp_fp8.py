"""The MLP's argument checks, shared by h3kernels.mlp_fp8 and h3kernels.reference: the row
stage's, the whole block's, the weight preparation's, and the small helpers' (fc2 flag count,
fc1 row order device). Each returns the checked scalar values; devices are checked by the caller
afterwards (GPU: _runtime.arrays.Call; reference: one_device)."""
from h3kernels import _validate as v
from h3kernels._runtime import arrays as adapter
from h3kernels.constants import FC1_OUT, FFN, HIDDEN, MAX_M, fc2_flag_count

FP8_MMA_FORMS = (-1, 0, 2, 3)
# minimax_h3_mlp_fp8's array arguments, in its order (mlp_args' `inputs`)
INPUTS = ("x", "x_norm_weight", "adaln_scale", "adaln_shift", "adaln_index", "gate", "residual", "fc1_weight_q",
          "fc1_weight_scale", "fc2_weight_q", "fc2_weight_scale")
WEIGHT_DTYPES = ("bfloat16", "float16", "float32")


def row_stage_args(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps, workspace_a_q=None,
                   workspace_a_scale=None, accepted=v.GPU_ARRAYS):
    """Kinds, dtypes, shapes and layout of the row stage's arguments; returns eps as a float."""
    kind = v.arrays(accepted, dict(x=x, x_norm_weight=x_norm_weight, adaln_scale=adaln_scale, adaln_shift=adaln_shift,
                                   adaln_index=adaln_index),
                    dict(workspace_a_q=workspace_a_q, workspace_a_scale=workspace_a_scale))
    return _row_stage_layout(v.reader(kind), {}, x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps,
                             workspace_a_q, workspace_a_scale)[0]


def _row_stage_layout(read, facts, x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps, workspace_a_q,
                      workspace_a_scale):
    """row_stage_args after the kinds (which mlp_args checks for all its arrays at once): (eps as
    a float, the tables' row stride). read: v.reader of their kind; facts: {name: facts}, to
    which each array's are added."""
    facts["x"] = f = read(x)
    if f[0] != adapter.BF16:
        v.dtype("x", x, adapter.BF16)
    shape = f[1]
    if len(shape) != 2 or shape[1] != HIDDEN:
        v.fail("x", f"shape {tuple(shape)}", f"shape (M, {HIDDEN})")
    m = shape[0]
    if not 1 <= m <= MAX_M:
        v.fail("x", f"M = {m} rows", f"1 <= M <= {MAX_M} (M * 14336 must stay below 2**31)")
    if not f[2]:
        v.contiguous_("x", x)
    v.aligned_of("x", f, 8)  # read as quads of bf16
    facts["x_norm_weight"] = f = read(x_norm_weight)
    if f[0] != adapter.BF16 or f[1] != _NORM_SHAPE or not f[2]:  # array_of only words the failure
        v.array_of("x_norm_weight", x_norm_weight, f, adapter.BF16, _NORM_SHAPE)
    v.aligned_of("x_norm_weight", f, 8)
    facts["adaln_scale"] = f = read(adaln_scale)
    scale_pitch = v.table_of("adaln_scale", adaln_scale, f, HIDDEN)
    facts["adaln_shift"] = f = read(adaln_shift)
    shift_pitch = v.table_of("adaln_shift", adaln_shift, f, HIDDEN)
    if adaln_shift.shape[0] != adaln_scale.shape[0]:
        v.fail("adaln_shift", f"{adaln_shift.shape[0]} rows", f"{adaln_scale.shape[0]} rows, as adaln_scale")
    # the row kernel walks both tables with one row pitch
    if shift_pitch != scale_pitch:
        v.fail("adaln_shift", f"row stride {shift_pitch}", f"adaln_scale's row stride {scale_pitch}")
    facts["adaln_index"] = f = read(adaln_index)
    if f[0] != adapter.I64 or f[1] != (m,) or not f[2]:
        v.array_of("adaln_index", adaln_index, f, adapter.I64, (m,))
    if workspace_a_q is not None:
        facts["workspace_a_q"] = f = read(workspace_a_q)
        v.array_of("workspace_a_q", workspace_a_q, f, adapter.E4M3, (m, HIDDEN))
        v.aligned_of("workspace_a_q", f, 4)  # written as quads of e4m3
    if workspace_a_scale is not None:
        facts["workspace_a_scale"] = f = read(workspace_a_scale)
        v.array_of("workspace_a_scale", workspace_a_scale, f, adapter.F32, (m,))
    return v.positive_finite("eps", eps), scale_pitch


_NORM_SHAPE = (HIDDEN,)
_FIXED = (("fc1_weight_q", adapter.E4M3, (FC1_OUT, HIDDEN)), ("fc1_weight_scale", adapter.F32, (FC1_OUT,)),
          ("fc2_weight_q", adapter.E4M3, (HIDDEN, FFN)), ("fc2_weight_scale", adapter.F32, (HIDDEN,)))
# the arrays the kernels read or write in 16-byte chunks (cp.async) or bf16 pairs (the epilogues),
# in the order their alignment is checked
_ALIGNED = (("residual", 4), ("out", 4), ("fc1_weight_q", 16), ("fc2_weight_q", 16), ("workspace_y", 16),
            ("workspace_y_q", 16), ("workspace_a_q", 16))
# out and the workspaces after the row stage's, in the order they are checked: (name, dtype, shape for M)
_GIVEN = (("out", adapter.BF16, lambda m: (m, HIDDEN)), ("workspace_y", adapter.BF16, lambda m: (m, FFN)),
          ("workspace_y_q", adapter.E4M3, lambda m: (m, FFN)), ("workspace_y_scale", adapter.F32, lambda m: (m,)),
          ("workspace_flags", adapter.I32, lambda m: (fc2_flag_count(m),)))
_TABLES = frozenset(("adaln_scale", "adaln_shift", "gate"))  # row views: the rest is contiguous once checked
_MAY_ALIAS = frozenset({("out", "residual"), ("out", "x")})


def mlp_args(inputs, given, eps=1e-5, fp8_mma_form=-1, accepted=v.GPU_ARRAYS):
    """Every check of minimax_h3_mlp_fp8 but the devices and the board's mma forms; returns eps as
    a float. inputs: {name: array} of its eleven array arguments; given: of out and the six
    workspaces (None where not given), by the operator's names."""
    return checked_mlp_args(inputs, given, eps, fp8_mma_form, accepted)[0]


def checked_mlp_args(inputs, given, eps=1e-5, fp8_mma_form=-1, accepted=v.GPU_ARRAYS):
    """mlp_args, returning (eps, {name: facts (v.reader)} of every array given): the operator
    launches with the addresses read here."""
    read = v.reader(v.arrays(accepted, inputs, given))
    facts = {}
    x, adaln_scale, gate = inputs["x"], inputs["adaln_scale"], inputs["gate"]
    eps, table_pitch = _row_stage_layout(read, facts, x, inputs["x_norm_weight"], adaln_scale,
                                         inputs["adaln_shift"], inputs["adaln_index"], eps, given["workspace_a_q"],
                                         given["workspace_a_scale"])
    m = facts["x"][1][0]
    facts["gate"] = f = read(gate)
    gate_pitch = v.table_of("gate", gate, f, HIDDEN)
    if gate.shape[0] != adaln_scale.shape[0]:
        v.fail("gate", f"{gate.shape[0]} rows", f"{adaln_scale.shape[0]} rows, as adaln_scale")
    facts["residual"] = f = read(inputs["residual"])
    if f[0] != adapter.BF16 or f[1] != (m, HIDDEN) or not f[2]:
        v.array_of("residual", inputs["residual"], f, adapter.BF16, (m, HIDDEN))
    for name, dtype, shape in _FIXED:
        facts[name] = f = read(inputs[name])
        if f[0] != dtype or f[1] != shape or not f[2]:
            v.array_of(name, inputs[name], f, dtype, shape)
    written = {k: a for k, a in given.items() if a is not None}
    if written:
        for name, dtype, shape_of in _GIVEN:
            a = given[name]
            if a is not None:
                facts[name] = f = read(a)
                v.array_of(name, a, f, dtype, shape_of(m))
    for name, nbytes in _ALIGNED:
        f = facts.get(name)
        if f is not None:
            v.aligned_of(name, f, nbytes)
    mma_form(fp8_mma_form)
    if written:
        everything = {**written, **inputs}
        spans = {}
        for name, a in everything.items():
            lo = facts[name][3]
            if name in _TABLES:  # bf16 [rows, HIDDEN], unit column stride, as checked: what span() gives
                rows, pitch = facts[name][1][0], gate_pitch if name == "gate" else table_pitch
                spans[name] = lo, lo + 2 * ((rows - 1) * pitch + HIDDEN)
            else:  # contiguous, as checked
                nbytes = a.nbytes
                spans[name] = (lo, lo + nbytes) if nbytes else None
        v.spans_overlap(written, everything, spans, _MAY_ALIAS)
    return eps, facts


def mma_form(requested):
    """fp8_mma_form's value (docs/spec.md): -1 the board's, 0 legacy, 2 mxf8f6f4, 3 the wgmma
    family. Whether this board has form 2 or 3 is the launcher's to check, once the device is
    known."""
    return v.one_of("fp8_mma_form", requested, FP8_MMA_FORMS)


def weight(name, w, shape, accepted):
    """A float weight of exactly `shape` for the preparation (bf16, fp16 or fp32; CuPy's bf16 may
    come as its uint16 bits)."""
    v.arrays(accepted, {name: w})
    if adapter.kind_of(w) == "torch":
        if str(w.dtype).replace("torch.", "") not in WEIGHT_DTYPES:
            v.fail(name, w.dtype, "bfloat16, float16 or float32", TypeError)
    elif w.dtype.name not in WEIGHT_DTYPES + ("uint16",):
        v.fail(name, w.dtype, "bfloat16 (or its uint16 bits), float16 or float32", TypeError)
    if tuple(w.shape) != tuple(shape):
        v.fail(name, f"shape {tuple(w.shape)}", f"shape {tuple(shape)}")


def rows(m):
    """M, the row count of an MLP call, as minimax_h3_mlp_fc2_flags takes it."""
    return v.int_in("m", m, 1, MAX_M)


def torch_device(device):
    """minimax_h3_fc1_row_order's device: None (the CPU), a str or a torch.device that this torch
    can allocate on; returned as a torch.device."""
    import torch

    if device is None:
        return torch.device("cpu")
    need = "None, 'cpu', 'cuda', 'cuda:N' or a torch.device"
    if not isinstance(device, (str, torch.device)):
        v.fail("device", repr(device), need, TypeError)
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        v.fail("device", repr(device), need)
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            v.fail("device", repr(device), "'cpu' or None here: this torch sees no CUDA device")
        if dev.index is not None and dev.index >= count:
            v.fail("device", repr(device), f"a CUDA device index below {count}")
    elif dev.type != "cpu":
        v.fail("device", repr(device), need)
    return dev
