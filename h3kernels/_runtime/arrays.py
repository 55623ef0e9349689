"""The one bridge between the caller's arrays (torch or CuPy) and our kernels.

A `Call` is opened on the named arguments of one operator call. It checks that they are all
of one kind and on one device, hands out raw-bit Numba views of them (bf16 as uint16, e4m3 as
uint8) built from pointer, shape and strides alone, allocates results of the caller's kind,
and gives the caller's current stream to the launches. Nothing here synchronizes the host.
"""
import contextlib
import functools

BF16, E4M3, F32, I64, I32 = "bfloat16", "float8_e4m3fn", "float32", "int64", "int32"
_RAW = {BF16: "uint16", E4M3: "uint8", F32: "float32", I64: "int64", I32: "int32"}


def _torch():
    import torch

    return torch


def _cupy():
    import cupy

    return cupy


def kind_of(a):
    """'torch' or 'cupy', without importing a framework the caller did not use."""
    mod = type(a).__module__.split(".")[0]
    if mod == "torch" and isinstance(a, _torch().Tensor):
        return "torch"
    if mod == "cupy" and isinstance(a, _cupy().ndarray):
        return "cupy"
    return None


def logical_dtype(a):
    """The contract's dtype name of a torch tensor or CuPy array, or None if it has none."""
    if kind_of(a) == "torch":
        t = _torch()
        return {t.bfloat16: BF16, t.float8_e4m3fn: E4M3, t.float32: F32, t.int64: I64,
                t.int32: I32}.get(a.dtype)
    name = a.dtype.name
    return {"bfloat16": BF16, "uint16": BF16, "float8_e4m3fn": E4M3, "uint8": E4M3,
            "float32": F32, "int64": I64, "int32": I32}.get(name)


def strides_elems(a):
    if kind_of(a) == "torch":
        return tuple(a.stride())
    return tuple(s // a.itemsize for s in a.strides)


def data_ptr(a):
    return a.data_ptr() if kind_of(a) == "torch" else a.data.ptr


class Call:
    """One operator call's view of its arguments: kind, device, stream."""

    def __init__(self, named):
        kinds = {}
        for name, a in named.items():
            if a is None:
                continue
            k = kind_of(a)
            if k is None:
                raise TypeError(f"{name}: got {type(a).__module__}.{type(a).__name__}; "
                                "need a torch CUDA tensor or a CuPy array")
            kinds.setdefault(k, name)
        if len(kinds) > 1:
            (ka, na), (kb, nb) = list(kinds.items())[:2]
            raise TypeError(f"{nb}: got a {kb} array while {na} is a {ka} array; "
                            "need every array of one call to be of one kind")
        if not kinds:
            raise TypeError("no array arguments")
        self.kind = next(iter(kinds))
        self.device_id = None
        first = None
        for name, a in named.items():
            if a is None:
                continue
            if self.kind == "torch" and a.device.type != "cuda":
                raise ValueError(f"{name}: got a tensor on {a.device}; need a CUDA tensor")
            dev = a.device.index if self.kind == "torch" else a.device.id
            if self.device_id is None:
                self.device_id, first = dev, name
            elif dev != self.device_id:
                raise ValueError(f"{name}: got an array on cuda:{dev} while {first} is on "
                                 f"cuda:{self.device_id}; need one device")
        if self.kind == "torch":
            self.stream_ptr = _torch().cuda.current_stream(self.device_id).cuda_stream
        else:
            with _cupy().cuda.Device(self.device_id):
                self.stream_ptr = _cupy().cuda.get_current_stream().ptr

    @functools.cached_property
    def capturing(self):
        """Whether the call's stream is capturing a CUDA graph: then nothing may synchronize,
        allocate outside the graph's pool, or upload from pageable host memory."""
        return _cupy().cuda.runtime.streamIsCapturing(self.stream_ptr) != 0

    @contextlib.contextmanager
    def active(self):
        """Makes this call's device and stream CuPy's current ones (allocations are stream-ordered)."""
        with _cupy().cuda.Device(self.device_id), cupy_stream(self.stream_ptr, self.device_id):
            yield

    def numba(self, a, view=None):
        """A Numba device view of `a` in raw bits, reinterpreted as `view` if given (e.g. 'uint64'
        for bf16 quads along the last axis). Built from the pointer, shape and strides alone, and
        imported without a host sync."""
        raw = _RAW[logical_dtype(a)]
        return _numba_view(data_ptr(a), tuple(a.shape), strides_elems(a), raw, view, owner=a)

    def numba_span(self, a, view=None):
        """A flat 1-D Numba view from a's first element through its last (strided rows, no copy)."""
        last = sum((n - 1) * s for n, s in zip(a.shape, strides_elems(a)))
        return _numba_view(data_ptr(a), (last + 1,), (1,), _RAW[logical_dtype(a)], view, owner=a)

    def numba_stream(self):
        from numba import cuda

        return cuda.external_stream(self.stream_ptr)

    @contextlib.contextmanager
    def numba_device(self):
        from numba import cuda

        with cuda.gpus[self.device_id]:
            yield

    def empty(self, shape, dtype):
        """A new array of the caller's kind on the call's device, stream-ordered."""
        if self.kind == "torch":
            t = _torch()
            tdt = {BF16: t.bfloat16, E4M3: t.float8_e4m3fn, F32: t.float32, I64: t.int64, I32: t.int32}[dtype]
            return t.empty(shape, dtype=tdt, device=f"cuda:{self.device_id}")
        cp = _cupy()
        with self.active():
            return cp.empty(shape, dtype=cupy_dtype(dtype))


def _numba_view(ptr, shape, strides, raw, view, owner):
    """Numba array over device memory at ptr; `view` reinterprets the (unit-stride) last axis."""
    import numpy as np
    from numba import cuda

    item = np.dtype(raw).itemsize
    dt = np.dtype(view or raw)
    if dt.itemsize != item:
        ratio = dt.itemsize // item
        shape = shape[:-1] + (shape[-1] // ratio,)
        strides = tuple(s // ratio for s in strides[:-1]) + (1,)
        item = dt.itemsize
    desc = dict(shape=shape, strides=tuple(s * item for s in strides), typestr=dt.str,
                data=(ptr, False), version=3)
    return cuda.from_cuda_array_interface(desc, owner=owner, sync=False)


def numba_buffer(ptr, shape, raw, owner):
    """A C-contiguous Numba view of `shape` elements of dtype `raw` at device address ptr."""
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= int(n)
    return _numba_view(ptr, tuple(shape), tuple(reversed(strides)), raw, None, owner)


class _StreamHandle:
    """A raw CUDA stream in the CUDA stream protocol, for CuPy's Stream.from_external."""

    def __init__(self, ptr):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


def cupy_stream(ptr, device_id):
    """A CuPy stream object for a raw handle (CuPy 14: from_external; CuPy 13: ExternalStream)."""
    cp = _cupy()
    if hasattr(cp.cuda.Stream, "from_external"):
        with cp.cuda.Device(device_id):
            return cp.cuda.Stream.from_external(_StreamHandle(ptr))
    return cp.cuda.ExternalStream(ptr, device_id)


@functools.lru_cache(maxsize=None)
def cupy_dtype(dtype):
    """CuPy dtype for new arrays: ml_dtypes types where CuPy and ml_dtypes know them, else raw bits."""
    if dtype in (BF16, E4M3):
        try:
            import ml_dtypes

            cp = _cupy()
            want = ml_dtypes.bfloat16 if dtype == BF16 else ml_dtypes.float8_e4m3fn
            cp.empty(0, dtype=want)
            return want
        except Exception:
            pass
    return _RAW[dtype]
