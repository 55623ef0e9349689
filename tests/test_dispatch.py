"""The dispatcher's kind/device checks and the row stage's argument validation."""
import numpy as np
import pytest
import torch

import h3kernels
from h3kernels.testing.inputs import make_row_inputs


def cpu_args(m=4):
    return list(make_row_inputs(m, 3))


def gpu_args(m=4):
    return list(make_row_inputs(m, 3, device="cuda"))  # tables stay column chunks


def test_cpu_tensors_are_refused_before_anything_runs():
    with pytest.raises(ValueError, match=r"^x: got a tensor on cpu; need a CUDA tensor"):
        h3kernels.minimax_h3_mlp_fp8_row_stage(*cpu_args())


def test_numpy_arrays_are_refused():
    args = cpu_args()
    args[0] = np.zeros((4, 5376), np.uint16)
    with pytest.raises(TypeError, match=r"^x: got numpy.ndarray; need a torch CUDA tensor or a CuPy array"):
        h3kernels.minimax_h3_mlp_fp8_row_stage(*args)


@pytest.mark.gpu
def test_mixed_torch_and_cupy_is_a_type_error():
    import cupy

    x, w, sc, sh, idx = gpu_args()
    with pytest.raises(TypeError, match="x_norm_weight: got a cupy array while x is a torch array"):
        h3kernels.minimax_h3_mlp_fp8_row_stage(x, cupy.asarray(w.view(torch.int16).cpu().numpy()), sc, sh, idx)


GPU_BAD = [
    # (argument, mutation, exception, message fragment)
    ("x", lambda a: a.float(), TypeError, "x: got torch.float32; need bfloat16"),
    ("x", lambda a: a[:, :100], ValueError, "x: got shape (4, 100); need shape (M, 5376)"),
    ("x", lambda a: a.t().contiguous().t(), ValueError, "x: got strides"),
    ("x_norm_weight", lambda a: a[:100], ValueError, "x_norm_weight: got shape (100,)"),
    ("adaln_scale", lambda a: a.float(), TypeError, "adaln_scale: got torch.float32"),
    ("adaln_scale", lambda a: a[:, :5000], ValueError, "adaln_scale: got shape (3, 5000)"),
    ("adaln_shift", lambda a: a[:2], ValueError, "adaln_shift: got 2 rows; need 3 rows"),
    ("adaln_shift", lambda a: a.contiguous(), ValueError, "adaln_shift: got row stride 5376; need adaln_scale's row stride 32256"),
    ("adaln_index", lambda a: a.int(), TypeError, "adaln_index: got torch.int32; need int64"),
    ("adaln_index", lambda a: a[:2], ValueError, "adaln_index: got shape (2,)"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("name,mutate,exc,msg", GPU_BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(GPU_BAD)])
def test_bad_arguments_raise_before_launch_and_write_nothing(name, mutate, exc, msg):
    x, w, sc, sh, idx = gpu_args()
    args = dict(x=x, x_norm_weight=w, adaln_scale=sc, adaln_shift=sh, adaln_index=idx)
    args[name] = mutate(args[name])
    a_q = torch.full((4, 5376), 0x7F, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    a_s = torch.full((4,), 7.0, device="cuda")
    with pytest.raises(exc, match=msg.replace("(", r"\(").replace(")", r"\)")):
        h3kernels.minimax_h3_mlp_fp8_row_stage(**args, workspace_a_q=a_q, workspace_a_scale=a_s)
    torch.cuda.synchronize()
    assert (a_q.view(torch.uint8) == 0x7F).all() and (a_s == 7.0).all()


@pytest.mark.parametrize("eps", [0.0, -1e-5, float("nan"), float("inf"), 1e-50, 1e300])
def test_eps_must_be_positive_and_finite_in_fp32(eps):
    from h3kernels import _validate as validate

    with pytest.raises(ValueError, match="eps: got"):
        validate.positive_finite("eps", eps)


@pytest.mark.gpu
def test_misaligned_x_is_refused():
    x, w, sc, sh, idx = gpu_args()
    buf = torch.zeros(4 * 5376 + 8, dtype=torch.bfloat16, device="cuda")
    x_off = buf[2:2 + 4 * 5376].view(4, 5376)  # contiguous, 4 bytes off an 8-byte boundary
    with pytest.raises(ValueError, match="x: got base address .*; need an 8-byte-aligned base"):
        h3kernels.minimax_h3_mlp_fp8_row_stage(x_off, w, sc, sh, idx)


@pytest.mark.gpu
@pytest.mark.parametrize("eps", [0.0, -1e-5, float("nan"), float("inf"), 1e-50])
def test_bad_eps(eps):
    x, w, sc, sh, idx = gpu_args()
    with pytest.raises(ValueError, match="eps: got"):
        h3kernels.minimax_h3_mlp_fp8_row_stage(x, w, sc, sh, idx, eps=eps)


@pytest.mark.gpu
def test_misaligned_table_base_is_refused():
    x, w, sc, sh, idx = gpu_args()
    wide = torch.zeros(3, 5376 + 8, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="adaln_scale: got base address"):
        h3kernels.minimax_h3_mlp_fp8_row_stage(x, w, wide[:, 1:5377], wide[:, 1:5377], idx)
