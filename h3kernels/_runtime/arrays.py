"""The one bridge between the caller's arrays (torch or CuPy) and our kernels.

A `Call` is opened on the named arguments of one operator call. It checks that they are all
of one kind and on one device, reads the caller's current stream (a raw handle: every launch
goes on it), allocates results of the caller's kind, and makes the call's device current for
the launches only where it is not already. Nothing here synchronizes the host.
"""
import contextlib
import functools

BF16, E4M3, F32, I64, I32 = "bfloat16", "float8_e4m3fn", "float32", "int64", "int32"
RAW = {BF16: "uint16", E4M3: "uint8", F32: "float32", I64: "int64", I32: "int32"}
ITEMSIZE = {BF16: 2, E4M3: 1, F32: 4, I64: 8, I32: 4}


def _torch():
    import torch

    return torch


def _cupy():
    import cupy

    return cupy


_kind_by_type = {}


def kind_of(a):
    """'torch' or 'cupy', without importing a framework the caller did not use."""
    t = type(a)
    try:
        return _kind_by_type[t]  # every call asks this dozens of times: once per type
    except KeyError:
        pass
    mod = t.__module__.split(".")[0]
    kind = None
    if mod == "torch" and isinstance(a, _torch().Tensor):
        kind = "torch"
    elif mod == "cupy" and isinstance(a, _cupy().ndarray):
        kind = "cupy"
    _kind_by_type[t] = kind
    return kind


_torch_dtype_names = {}


def _torch_dtypes():
    if not _torch_dtype_names:
        t = _torch()
        _torch_dtype_names.update({t.bfloat16: BF16, t.float8_e4m3fn: E4M3, t.float32: F32, t.int64: I64,
                                   t.int32: I32})
    return _torch_dtype_names


_CUPY_DTYPES = {"bfloat16": BF16, "uint16": BF16, "float8_e4m3fn": E4M3, "uint8": E4M3, "float32": F32,
                "int64": I64, "int32": I32}


def logical_dtype(a):
    """The contract's dtype name of a torch tensor or CuPy array, or None if it has none."""
    if (_kind_by_type.get(type(a)) or kind_of(a)) == "torch":
        return (_torch_dtype_names or _torch_dtypes()).get(a.dtype)
    return _CUPY_DTYPES.get(a.dtype.name)


def strides_elems(a):
    if (_kind_by_type.get(type(a)) or kind_of(a)) == "torch":
        return a.stride()  # a tuple already
    return tuple(s // a.itemsize for s in a.strides)


def data_ptr(a):
    kind = _kind_by_type.get(type(a)) or kind_of(a)
    if kind == "torch":
        return a.data_ptr()
    if kind == "cupy":
        return a.data.ptr
    try:  # anything else that offers one of the two
        return a.data_ptr()
    except AttributeError:
        return a.data.ptr


def nbytes(a):
    return a.numel() * a.element_size() if kind_of(a) == "torch" else int(a.nbytes)


def _torch_stream(device_id):
    return _torch_stream_reader()(device_id)


@functools.lru_cache(maxsize=None)
def _torch_stream_reader():
    t = _torch()
    raw = getattr(t._C, "_cuda_getCurrentRawStream", None)  # an int, no Stream object
    if raw is not None:
        return raw
    return lambda device_id: t.cuda.current_stream(device_id).cuda_stream


def _cupy_stream_ptr(device_id):
    cp = _cupy()
    try:
        return cp.cuda.get_current_stream(device_id).ptr
    except TypeError:  # a CuPy without the device argument
        with cp.cuda.Device(device_id):
            return cp.cuda.get_current_stream().ptr


class Call:
    """One operator call's view of its arguments: kind, device, stream."""

    __slots__ = ("kind", "device_id", "stream_ptr", "_capturing")

    def __init__(self, named):
        kind = first = None
        device_id = None
        for name, a in named.items():
            if a is None:
                continue
            k = _kind_by_type.get(type(a)) or kind_of(a)
            if k is None:
                raise TypeError(f"{name}: got {type(a).__module__}.{type(a).__name__}; "
                                "need a torch CUDA tensor or a CuPy array")
            if kind is None:
                kind = k
            elif k != kind:
                raise TypeError(f"{name}: got a {k} array while {first} is a {kind} array; "
                                "need every array of one call to be of one kind")
            if k == "torch":
                dev = a.get_device()
                if dev < 0:
                    raise ValueError(f"{name}: got a tensor on {a.device}; need a CUDA tensor")
            else:
                dev = a.device.id
            if device_id is None:
                device_id, first = dev, name
            elif dev != device_id:
                raise ValueError(f"{name}: got an array on cuda:{dev} while {first} is on "
                                 f"cuda:{device_id}; need one device")
        if kind is None:
            raise TypeError("no array arguments")
        self.kind, self.device_id = kind, device_id
        self.stream_ptr = _torch_stream(device_id) if kind == "torch" else _cupy_stream_ptr(device_id)
        self._capturing = None

    @property
    def capturing(self):
        """Whether the call's stream is capturing a CUDA graph: then nothing may synchronize,
        allocate outside the graph's pool, or upload from pageable host memory."""
        if self._capturing is None:
            self._capturing = _cupy().cuda.runtime.streamIsCapturing(self.stream_ptr) != 0
        return self._capturing

    @contextlib.contextmanager
    def active(self):
        """Makes this call's device and stream CuPy's current ones (for CuPy work off the hot path)."""
        with _cupy().cuda.Device(self.device_id), cupy_stream(self.stream_ptr, self.device_id):
            yield

    def make_current(self):
        """Makes the call's device current if it is not (returns what restore() needs)."""
        return make_current(self.device_id)

    def zero(self, address, count):
        """Stream-ordered memset of `count` bytes at device address `address`."""
        from cupy_backends.cuda.api import runtime

        runtime.memsetAsync(address, 0, count, self.stream_ptr)

    def copy(self, dst, src, count):
        """Stream-ordered copy of `count` bytes between device addresses."""
        from cupy_backends.cuda.api import runtime

        runtime.memcpyAsync(dst, src, count, runtime.memcpyDeviceToDevice, self.stream_ptr)

    def empty(self, shape, dtype):
        """A new array of the caller's kind on the call's device, stream-ordered."""
        if self.kind == "torch":
            return _torch().empty(shape, dtype=torch_dtype(dtype), device=torch_device(self.device_id))
        with self.active():
            return _cupy().empty(shape, dtype=cupy_dtype(dtype))


@functools.lru_cache(maxsize=None)
def torch_device(device_id):
    return _torch().device("cuda", device_id)


@functools.lru_cache(maxsize=None)
def torch_dtype(dtype):
    return {v: k for k, v in _torch_dtypes().items()}[dtype]


@functools.lru_cache(maxsize=None)
def primary_context(device_id):
    """The CUcontext the runtime uses on device `device_id` (its primary context)."""
    cp = _cupy()
    from cupy_backends.cuda.api import driver

    with cp.cuda.Device(device_id):
        cp.cuda.runtime.free(0)  # binds the primary context to this thread if nothing has yet
        return driver.ctxGetCurrent()


def make_current(device_id):
    """Makes device `device_id`'s context current unless it already is; returns the context to
    restore (None: nothing changed). One driver call when nothing changes."""
    from cupy_backends.cuda.api import driver

    want = primary_context(device_id)
    have = driver.ctxGetCurrent()
    if have == want:
        return None
    driver.ctxSetCurrent(want)
    return have


def restore(previous):
    if previous is not None:
        from cupy_backends.cuda.api import driver

        driver.ctxSetCurrent(previous)


class _StreamHandle:
    """A raw CUDA stream in the CUDA stream protocol, for CuPy's Stream.from_external."""

    def __init__(self, ptr):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


_cupy_streams = {}


def cupy_stream(ptr, device_id):
    """The CuPy stream object of a raw handle, made once per (device, handle) (CuPy 14:
    from_external; CuPy 13: ExternalStream). It only wraps the handle: a handle that CUDA hands
    out again for a new stream is the same stream to every launch."""
    s = _cupy_streams.get((device_id, ptr))
    if s is None:
        cp = _cupy()
        if hasattr(cp.cuda.Stream, "from_external"):
            with cp.cuda.Device(device_id):
                s = cp.cuda.Stream.from_external(_StreamHandle(ptr))
        else:
            s = cp.cuda.ExternalStream(ptr, device_id)
        _cupy_streams[(device_id, ptr)] = s
    return s


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
    return RAW[dtype]
