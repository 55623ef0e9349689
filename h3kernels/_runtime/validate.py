"""Argument checks that run before any launch. Each failure names the argument, what it got and
what it needs, as TypeError (wrong kind or dtype) or ValueError (wrong shape, device, value)."""
import math
import numbers

import numpy as np

from h3kernels._runtime import arrays as dispatch


def fail(name, got, need, exc=ValueError):
    raise exc(f"{name}: got {got}; need {need}")


def array(name, a, dtype, shape, contiguous=True):
    """A torch/CuPy array of the contract dtype `dtype` and exactly `shape`."""
    dt = dispatch.logical_dtype(a)
    if dt != dtype:
        fail(name, a.dtype, dtype, TypeError)
    if tuple(a.shape) != tuple(shape):
        fail(name, f"shape {tuple(a.shape)}", f"shape {tuple(shape)}")
    if contiguous and not is_contiguous(a):
        fail(name, f"strides {dispatch.strides_elems(a)}", "a contiguous array")


def is_contiguous(a):
    if dispatch.kind_of(a) == "torch":
        return a.is_contiguous()
    return a.flags.c_contiguous


def table(name, a, cols):
    """A [rows, cols] bf16 table view: unit column stride, 16-byte-aligned base and row pitch."""
    if dispatch.logical_dtype(a) != dispatch.BF16:
        fail(name, a.dtype, dispatch.BF16, TypeError)
    if a.ndim != 2 or a.shape[1] != cols or a.shape[0] < 1:
        fail(name, f"shape {tuple(a.shape)}", f"shape (rows >= 1, {cols})")
    rs, cs = dispatch.strides_elems(a)
    if cs != 1:
        fail(name, f"column stride {cs}", "column stride 1")
    if (rs * 2) % 16 or rs < cols:
        fail(name, f"row pitch {rs * 2} bytes", "a row pitch that is a multiple of 16 bytes, >= one row")
    if dispatch.data_ptr(a) % 16:
        fail(name, f"base address {dispatch.data_ptr(a):#x}", "a 16-byte-aligned base")


def aligned(name, a, nbytes):
    """The kernels read whole 4- or 8-byte words: the base address must allow it."""
    if dispatch.data_ptr(a) % nbytes:
        article = "an" if nbytes == 8 else "a"
        fail(name, f"base address {dispatch.data_ptr(a):#x}", f"{article} {nbytes}-byte-aligned base")


def positive_finite(name, v):
    """A float that stays positive and finite in FP32 (the kernels use it as float32)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        fail(name, repr(v), "a positive finite float", TypeError)
    f = float(v)
    if not (math.isfinite(f) and f > 0 and 0 < float(np.float32(f)) < math.inf):
        fail(name, repr(v), "a positive float, finite and nonzero in FP32")
    return f


def int_in(name, v, lo, hi):
    if isinstance(v, bool) or not isinstance(v, int):
        fail(name, repr(v), f"an int in [{lo}, {hi}]", TypeError)
    if not lo <= v <= hi:
        fail(name, v, f"an int in [{lo}, {hi}]")
