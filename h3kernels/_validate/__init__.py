"""Argument checks that run before any work. Each failure names the argument, what it got and
what it needs, as TypeError (not an array of an accepted kind, wrong dtype or Python type) or
ValueError (wrong shape, layout, value or device).

The order is the same everywhere: first whether every argument is an array of a kind the
operator accepts at all (`arrays`), then dtypes, shapes and layout, and only then the devices
(`_runtime.arrays.Call` for the GPU operators, `one_device` for the reference), so that a
wrong dtype or shape is reported as such wherever the arrays live. The per-operator checks are
in mlp_fp8.py and varlen_attention_fp8.py beside this module; the GPU operators and
h3kernels.reference both call them.
"""
import math
import numbers

import numpy as np

from h3kernels._errors import fail  # noqa: F401 (the checks' one way to refuse)
from h3kernels._runtime import arrays as adapter


class Accepted:
    """The array kinds an operator takes ('torch', 'cupy') and how its messages name them."""

    def __init__(self, kinds, need):
        self.kinds, self.need = tuple(kinds), need


GPU_ARRAYS = Accepted(("torch", "cupy"), "a torch CUDA tensor or a CuPy array")
TORCH_TENSORS = Accepted(("torch",), "a torch tensor")


def type_name(v):
    """How a message names a non-array argument: None, list, numpy.ndarray, ..."""
    if v is None:
        return "None"
    t = type(v)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__name__}"


_kinds = adapter._kind_by_type  # type -> kind, as adapter.kind_of fills it: the checks ask it often
_torch_dtype_names = adapter._torch_dtype_names  # torch dtype -> contract name, filled on first use


def arrays(accepted, required, optional=None):
    """Every value of `required` ({name: value}) is an array of an accepted kind; every value of
    `optional` is one or None. Returns their kind. (The two dicts name different arguments.)"""
    kinds = accepted.kinds
    first = first_kind = None
    for group, may_be_none in ((required, False), (optional or {}, True)):
        for name, a in group.items():
            if a is None and may_be_none:
                continue
            kind = _kinds.get(type(a)) or adapter.kind_of(a)
            if kind not in kinds:
                fail(name, type_name(a), accepted.need, TypeError)
            if first is None:
                first, first_kind = name, kind
            elif kind != first_kind:  # one call runs on one kind's streams and allocator
                fail(name, f"a {kind} array while {first} is a {first_kind} array",
                     f"arrays of one kind ({first_kind})", TypeError)
    return first_kind


def dtype(name, a, want):
    if adapter.logical_dtype(a) != want:
        _bad_dtype(name, a, want)


def array(name, a, dtype_, shape, contiguous=True):
    """An array of the contract dtype `dtype_` and exactly `shape` (a tuple)."""
    array_of(name, a, facts(a), dtype_, shape, contiguous)


def contiguous_(name, a):
    if not is_contiguous(a):
        _not_contiguous(name, a)


def is_contiguous(a):
    if (_kinds.get(type(a)) or adapter.kind_of(a)) == "torch":
        return a.is_contiguous()
    return a.flags.c_contiguous


def table(name, a, cols):
    """A [rows, cols] bf16 table view: unit column stride, 16-byte-aligned base and row pitch."""
    table_of(name, a, facts(a), cols)


def aligned(name, a, nbytes):
    """The kernels read whole 4-, 8- or 16-byte words: the base address must allow it."""
    aligned_of(name, facts(a), nbytes)


# The same checks on an array's facts, read once per call by reader(kind) (after `arrays`, so the
# kind is known): (contract dtype name or None, shape, C-contiguous, base address). Each check of
# a call's arguments then costs a few comparisons instead of several calls into the array.


def _torch_facts(a):
    return (_torch_dtype_names or adapter._torch_dtypes()).get(a.dtype), a.shape, a.is_contiguous(), a.data_ptr()


def _cupy_facts(a):
    return adapter.logical_dtype(a), a.shape, a.flags.c_contiguous, a.data.ptr


def reader(kind):
    """The function that reads an array's facts, for arrays of `kind` ('torch' or 'cupy')."""
    return _torch_facts if kind == "torch" else _cupy_facts


def facts(a):
    """a's facts, for a torch tensor or CuPy array checked on its own."""
    return reader(adapter.kind_of(a))(a)


def array_of(name, a, facts, dtype_, shape, contiguous=True):
    """array() on a's facts."""
    if facts[0] != dtype_:
        _bad_dtype(name, a, dtype_)
    got = facts[1]
    if got != shape and tuple(got) != tuple(shape):
        _bad_shape(name, got, shape)
    if contiguous and not facts[2]:
        _not_contiguous(name, a)


def table_of(name, a, facts, cols):
    """table() on a's facts; returns the row stride (elements)."""
    if facts[0] != adapter.BF16:
        _bad_dtype(name, a, adapter.BF16)
    shape = facts[1]
    if len(shape) != 2 or shape[1] != cols or shape[0] < 1:
        fail(name, f"shape {tuple(shape)}", f"shape (rows >= 1, {cols})")
    rs, cs = adapter.strides_elems(a)
    if cs != 1:
        fail(name, f"column stride {cs}", "column stride 1")
    if (rs * 2) % 16 or rs < cols:
        fail(name, f"row pitch {rs * 2} bytes", "a row pitch that is a multiple of 16 bytes, >= one row")
    ptr = facts[3]
    if ptr % 16:
        fail(name, f"base address {ptr:#x}", "a 16-byte-aligned base")
    return rs


def aligned_of(name, facts, nbytes):
    """aligned() on an array's facts."""
    if facts[3] % nbytes:
        _misaligned(name, facts[3], nbytes)


def _bad_dtype(name, a, want):
    fail(name, a.dtype, want, TypeError)


def _bad_shape(name, got, shape):
    fail(name, f"shape {tuple(got)}", f"shape {tuple(shape)}")


def _not_contiguous(name, a):
    fail(name, f"strides {adapter.strides_elems(a)}", "a contiguous array")


def _misaligned(name, ptr, nbytes):
    article = "an" if nbytes == 8 else "a"
    fail(name, f"base address {ptr:#x}", f"{article} {nbytes}-byte-aligned base")


# the smallest double that rounds to FP32 infinity: FP32's max plus half its ulp (a tie, which
# rounds to the even neighbour, infinity)
FP32_MAX_ROUNDING_DOWN = float(np.finfo(np.float32).max) + 2.0 ** 103
FP32_MIN_NORMAL = 2.0 ** -126  # at and above it a double rounds to a normal FP32, never to zero


def positive_finite(name, v):
    """A float that stays positive and finite in FP32 (the kernels use it as float32)."""
    if type(v) is not float and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
        fail(name, repr(v), "a positive finite float", TypeError)
    f = float(v)
    if FP32_MIN_NORMAL <= f < FP32_MAX_ROUNDING_DOWN:  # FP32 keeps it positive and finite: no cast needed
        return f
    # compared with FP32's range before the cast, which would warn of the overflow it reports
    if not (math.isfinite(f) and f > 0 and f < FP32_MAX_ROUNDING_DOWN and float(np.float32(f)) > 0):
        fail(name, repr(v), "a positive float, finite and nonzero in FP32")
    return f


def int_in(name, v, lo, hi):
    """An int (or numpy integer; not a bool) in [lo, hi], returned as int."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        fail(name, repr(v), f"an int in [{lo}, {hi}]", TypeError)
    if not lo <= v <= hi:
        fail(name, v, f"an int in [{lo}, {hi}]")
    return int(v)


def one_of(name, v, allowed):
    """v is one of the ints `allowed` (a bool is not an int here)."""
    if type(v) is int and v in allowed:  # the common case, without the ABC checks
        return v
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or int(v) not in allowed:
        words = ", ".join(str(a) for a in allowed[:-1]) + f" or {allowed[-1]}"
        fail(name, repr(v), words)
    return int(v)


def one_device(named):
    """The reference's device rule: torch tensors, all on one device (the CPU is where it is
    checked; a CUDA device serves the GPU tests' oracle). None values are skipped."""
    first = None
    for name, a in named.items():
        if a is None:
            continue
        if first is None:
            first = (name, a.device)
        elif a.device != first[1]:
            fail(name, f"a tensor on {a.device} while {first[0]} is on {first[1]}", "one device")


def _device_key(a):
    return ("torch", str(a.device)) if adapter.kind_of(a) == "torch" else ("cupy", a.device.id)


def span(a):
    """[first byte, one past the last byte) of the memory a's elements occupy; None if it has none."""
    if (_kinds.get(type(a)) or adapter.kind_of(a)) == "torch":
        if a.is_contiguous():  # most arrays here: no walk over the strides
            nbytes = a.nbytes
            if not nbytes:
                return None
            lo = a.data_ptr()
            return lo, lo + nbytes
        shape = a.shape
        if 0 in shape:
            return None
        itemsize, lo, strides = a.element_size(), a.data_ptr(), a.stride()
    else:
        shape = tuple(a.shape)
        if 0 in shape:
            return None
        itemsize, lo = a.itemsize, a.data.ptr
        strides = [s // itemsize for s in a.strides]
    last = 0
    for n, st in zip(shape, strides):
        last += (n - 1) * st
    return lo, lo + itemsize * (1 + last)


def no_overlap(written, read, may_alias=()):
    """Every array an operator writes must not share memory with another array of the call,
    except pairs (written, other) of `may_alias`, which may be exactly the same array (the MLP
    epilogue reads a residual element before it writes that element). Arrays on different
    devices never overlap."""
    if written:
        everything = {**written, **read}
        spans_overlap(written, everything, {name: span(a) for name, a in everything.items()}, may_alias)


def spans_overlap(written, everything, spans, may_alias=()):
    """no_overlap() with each array's span() given: spans {name: span}, in the order of
    `everything` ({**written, **read}), which decides which overlap is reported."""
    for wn in written:
        ws = spans[wn]
        if ws is None:
            continue
        w_lo, w_hi = ws
        for other, os_ in spans.items():
            if os_ is None or not (w_lo < os_[1] and os_[0] < w_hi) or other == wn:
                continue
            w, o = everything[wn], everything[other]
            if _device_key(o) != _device_key(w):
                continue
            if (wn, other) in may_alias and ws == os_ and tuple(w.shape) == tuple(o.shape):
                continue
            alias = sorted(b for a, b in may_alias if a == wn)
            fail(wn, f"memory that overlaps {other}",
                 "its own memory" + (f" ({wn} may be {' or '.join(alias)})" if alias else ""))


def host_ints(name, values):
    """A host sequence of ints (list, tuple, numpy array or CPU tensor) as a tuple."""
    if adapter.kind_of(values) == "cupy" or getattr(values, "is_cuda", False):
        fail(name, "a device array", "a host sequence of ints", TypeError)
    if hasattr(values, "tolist"):
        values = values.tolist()
    try:
        out = tuple(values)
    except TypeError:
        fail(name, type_name(values), "a sequence of ints", TypeError)
    if not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in out):
        fail(name, type(values).__name__, "a sequence of ints", TypeError)
    return tuple(int(x) for x in out)
