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
    v.arrays(accepted, dict(x=x, x_norm_weight=x_norm_weight, adaln_scale=adaln_scale, adaln_shift=adaln_shift,
                            adaln_index=adaln_index),
             dict(workspace_a_q=workspace_a_q, workspace_a_scale=workspace_a_scale))
    return _row_stage_layout(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps, workspace_a_q,
                             workspace_a_scale)


def _row_stage_layout(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps, workspace_a_q,
                      workspace_a_scale):
    """row_stage_args after the kinds (which mlp_args checks for all its arrays at once)."""
    v.dtype("x", x, adapter.BF16)
    if x.ndim != 2 or x.shape[1] != HIDDEN:
        v.fail("x", f"shape {tuple(x.shape)}", f"shape (M, {HIDDEN})")
    m = x.shape[0]
    if not 1 <= m <= MAX_M:
        v.fail("x", f"M = {m} rows", f"1 <= M <= {MAX_M} (M * 14336 must stay below 2**31)")
    v.contiguous_("x", x)
    v.aligned("x", x, 8)  # read as quads of bf16
    v.array("x_norm_weight", x_norm_weight, adapter.BF16, (HIDDEN,))
    v.aligned("x_norm_weight", x_norm_weight, 8)
    v.table("adaln_scale", adaln_scale, HIDDEN)
    v.table("adaln_shift", adaln_shift, HIDDEN)
    if adaln_shift.shape[0] != adaln_scale.shape[0]:
        v.fail("adaln_shift", f"{adaln_shift.shape[0]} rows", f"{adaln_scale.shape[0]} rows, as adaln_scale")
    # the row kernel walks both tables with one row pitch
    if adapter.strides_elems(adaln_shift)[0] != adapter.strides_elems(adaln_scale)[0]:
        v.fail("adaln_shift", f"row stride {adapter.strides_elems(adaln_shift)[0]}",
               f"adaln_scale's row stride {adapter.strides_elems(adaln_scale)[0]}")
    v.array("adaln_index", adaln_index, adapter.I64, (m,))
    if workspace_a_q is not None:
        v.array("workspace_a_q", workspace_a_q, adapter.E4M3, (m, HIDDEN))
        v.aligned("workspace_a_q", workspace_a_q, 4)  # written as quads of e4m3
    if workspace_a_scale is not None:
        v.array("workspace_a_scale", workspace_a_scale, adapter.F32, (m,))
    return v.positive_finite("eps", eps)


def mlp_args(inputs, given, eps=1e-5, fp8_mma_form=-1, accepted=v.GPU_ARRAYS):
    """Every check of minimax_h3_mlp_fp8 but the devices and the board's mma forms; returns eps as
    a float. inputs: {name: array} of its eleven array arguments; given: of out and the six
    workspaces (None where not given), by the operator's names."""
    x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, gate, residual, fc1_weight_q, fc1_weight_scale, \
        fc2_weight_q, fc2_weight_scale = (inputs[n] for n in INPUTS)
    out, workspace_a_q, workspace_y, workspace_y_q = (given[n] for n in ("out", "workspace_a_q", "workspace_y",
                                                                           "workspace_y_q"))
    v.arrays(accepted, inputs, given)
    eps = _row_stage_layout(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps, workspace_a_q,
                            given["workspace_a_scale"])
    m = x.shape[0]
    v.table("gate", gate, HIDDEN)
    if gate.shape[0] != adaln_scale.shape[0]:
        v.fail("gate", f"{gate.shape[0]} rows", f"{adaln_scale.shape[0]} rows, as adaln_scale")
    v.array("residual", residual, adapter.BF16, (m, HIDDEN))
    v.array("fc1_weight_q", fc1_weight_q, adapter.E4M3, (FC1_OUT, HIDDEN))
    v.array("fc1_weight_scale", fc1_weight_scale, adapter.F32, (FC1_OUT,))
    v.array("fc2_weight_q", fc2_weight_q, adapter.E4M3, (HIDDEN, FFN))
    v.array("fc2_weight_scale", fc2_weight_scale, adapter.F32, (HIDDEN,))
    for name, shape, dtype in (("out", (m, HIDDEN), adapter.BF16), ("workspace_y", (m, FFN), adapter.BF16),
                               ("workspace_y_q", (m, FFN), adapter.E4M3), ("workspace_y_scale", (m,), adapter.F32),
                               ("workspace_flags", (fc2_flag_count(m),), adapter.I32)):
        if given[name] is not None:
            v.array(name, given[name], dtype, shape)
    # cp.async reads 16-byte chunks; the epilogues write bf16 pairs
    for name, a, nbytes in (("residual", residual, 4), ("out", out, 4), ("fc1_weight_q", fc1_weight_q, 16),
                            ("fc2_weight_q", fc2_weight_q, 16), ("workspace_y", workspace_y, 16),
                            ("workspace_y_q", workspace_y_q, 16), ("workspace_a_q", workspace_a_q, 16)):
        if a is not None:
            v.aligned(name, a, nbytes)
    mma_form(fp8_mma_form)
    v.no_overlap({k: a for k, a in given.items() if a is not None}, inputs,
                 may_alias={("out", "residual"), ("out", "x")})
    return eps


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
