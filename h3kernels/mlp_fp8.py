"""minimax_h3_mlp_fp8: the fused W8A8 MLP block (contract.md). This issue's part: the row stage."""
from . import dispatch, validate
from .shapes import HIDDEN, MAX_M


def check_row_stage_args(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps,
                         workspace_a_q=None, workspace_a_scale=None):
    if dispatch.logical_dtype(x) != dispatch.BF16:
        validate.fail("x", x.dtype, dispatch.BF16, TypeError)
    if x.ndim != 2 or x.shape[1] != HIDDEN:
        validate.fail("x", f"shape {tuple(x.shape)}", f"shape (M, {HIDDEN})")
    m = x.shape[0]
    if not 1 <= m <= MAX_M:
        validate.fail("x", f"M = {m} rows", f"1 <= M <= {MAX_M} (M * 14336 must stay below 2**31)")
    validate.array("x", x, dispatch.BF16, (m, HIDDEN))
    validate.array("x_norm_weight", x_norm_weight, dispatch.BF16, (HIDDEN,))
    validate.table("adaln_scale", adaln_scale, HIDDEN)
    validate.table("adaln_shift", adaln_shift, HIDDEN)
    if adaln_shift.shape[0] != adaln_scale.shape[0]:
        validate.fail("adaln_shift", f"{adaln_shift.shape[0]} rows", f"{adaln_scale.shape[0]} rows, as adaln_scale")
    if dispatch.strides_elems(adaln_shift)[0] != dispatch.strides_elems(adaln_scale)[0]:
        validate.fail("adaln_shift", f"row stride {dispatch.strides_elems(adaln_shift)[0]}",
                      f"adaln_scale's row stride {dispatch.strides_elems(adaln_scale)[0]}")
    validate.array("adaln_index", adaln_index, dispatch.I64, (m,))
    if workspace_a_q is not None:
        validate.array("workspace_a_q", workspace_a_q, dispatch.E4M3, (m, HIDDEN))
    if workspace_a_scale is not None:
        validate.array("workspace_a_scale", workspace_a_scale, dispatch.F32, (m,))
    return validate.positive_finite("eps", eps)


def minimax_h3_mlp_fp8_row_stage(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, *,
                                 workspace_a_q=None, workspace_a_scale=None, eps=1e-5):
    """The MLP's first stage alone: RMSNorm + indexed AdaLN + per-token e4m3 quantization.

    Returns (a_q e4m3 [M, 5376], a_scale f32 [M]) of the caller's kind, written into the
    workspaces when given. Bitwise equal to h3kernels.reference.
    """
    named = dict(x=x, x_norm_weight=x_norm_weight, adaln_scale=adaln_scale, adaln_shift=adaln_shift,
                 adaln_index=adaln_index, workspace_a_q=workspace_a_q, workspace_a_scale=workspace_a_scale)
    call = dispatch.Call(named)
    eps = check_row_stage_args(x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps,
                               workspace_a_q, workspace_a_scale)
    m = x.shape[0]
    a_q = workspace_a_q if workspace_a_q is not None else call.empty((m, HIDDEN), dispatch.E4M3)
    a_scale = workspace_a_scale if workspace_a_scale is not None else call.empty((m,), dispatch.F32)
    from . import mlp_fp8_row

    with call.numba_device():
        args = row_stage_launch_args(call, x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps, a_q, a_scale)
        mlp_fp8_row.launch(*args, stream=call.numba_stream())
    return a_q, a_scale


def row_stage_launch_args(call, x, x_norm_weight, adaln_scale, adaln_shift, adaln_index, eps, a_q, a_scale):
    """The row kernel's arguments: raw-bit quad views (validation guarantees their alignment)."""
    nb, quads = call.numba, "uint64"
    return (nb(x, quads), nb(x_norm_weight, quads), call.numba_span(adaln_scale, quads),
            call.numba_span(adaln_shift, quads), dispatch.strides_elems(adaln_scale)[0] // 4,
            adaln_scale.shape[0], nb(adaln_index), eps, nb(a_q, "uint32"), nb(a_scale))
