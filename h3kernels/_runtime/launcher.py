"""The one launch path of every kernel, NVRTC-built or Numba-written: cuLaunchKernel on the
caller's raw stream handle, its parameters packed into one buffer (CU_LAUNCH_PARAM_BUFFER_*),
or, for a kernel that takes tensor maps by value, the driver's array of parameter addresses
pointing into that buffer: the one buffer was misread for those kernels on the H200 (every
parameter wrong), while per-parameter addresses are what by-value maps were verified with.
A kernel whose parameters are one `__grid_constant__` struct (ParamStruct: the Hopper kernels)
takes the address of that struct's image, the one parameter.

A `Kernel` holds the driver function, its parameter layout (a precompiled struct format with
each parameter at its natural alignment) and the packing buffer, so a launch costs one
`pack_into` (none when the values are the object packed last) and one driver call, and returns
its LaunchRecord (a small tuple: the only per-launch object).
The driver copies the parameters during cuLaunchKernel (also under stream capture), so the
buffer is reused as soon as the call returns; a lock keeps two threads from packing at once.
The caller makes the kernel's device current (arrays.Call.make_current).
"""
import collections
import struct
import threading

import numpy as np

# parameter format -> struct code: everything a kernel here takes. "map": a 128-byte CUtensorMap
# passed by value (a __grid_constant__ parameter, 64-byte aligned)
PARAM_CODES = {"u64": "Q", "i64": "q", "u32": "I", "i32": "i", "f32": "f", "map": "128s"}
PARAM_ALIGN = {"map": 64}  # others: their size


def param_layout(params):
    """(struct format, byte offset of each parameter): '<', each parameter at its alignment."""
    fmt, off, offsets = "<", 0, []
    for p in params:
        code = PARAM_CODES[p]
        size = struct.calcsize("<" + code)
        pad = -off % PARAM_ALIGN.get(p, size)
        fmt += "x" * pad + code
        offsets.append(off + pad)
        off += pad + size
    return fmt, offsets


class ParamStruct:
    """The one `__grid_constant__` parameter of a kernel, a C struct mirrored field by field:
    `fields` are (name, format) pairs in the struct's order, each at its natural alignment (a
    "map", a CUtensorMap, at 64), the size padded to the largest alignment, as the C compiler
    lays it out. Calling it builds the values to launch with, by field name (a namedtuple);
    c_layout_checks() gives the C static_asserts that hold the mirror to the struct."""

    def __init__(self, c_name, fields):
        self.c_name = c_name
        self.fields = tuple(fields)
        self.names = tuple(name for name, _ in self.fields)
        formats = [fmt for _, fmt in self.fields]
        fmt, offsets = param_layout(formats)
        align = max(PARAM_ALIGN.get(f, struct.calcsize("<" + PARAM_CODES[f])) for f in formats)
        size = struct.calcsize(fmt)
        self.format = fmt + "x" * (-size % align)
        self.size = struct.calcsize(self.format)
        self.offsets = dict(zip(self.names, offsets))
        self.values = collections.namedtuple(c_name, self.names)

    def __call__(self, **values):
        return self.values(**values)

    def c_layout_checks(self):
        """C++ static_asserts of the struct's size and of every field's offset (appended to a
        build of the source that declares the struct)."""
        lines = [f'static_assert(sizeof({self.c_name}) == {self.size}, "{self.c_name}: size");']
        lines += [f'static_assert(offsetof({self.c_name}, {n}) == {o}, "{self.c_name}.{n}: offset");'
                  for n, o in self.offsets.items()]
        return "\n".join(lines) + "\n"


class LaunchRecord(collections.namedtuple("LaunchRecord", "kernel stream_ptr grid block values")):
    """One launch as the launcher issued it: replay() issues it again (the same kernel, stream,
    grid and parameter values), which is how a bench times a kernel alone."""

    def replay(self):
        return self.kernel.launch(self.stream_ptr, self.grid, self.block, self.values)


def pack_format(params):
    """struct format ('<', each parameter at its alignment) of a parameter list."""
    return param_layout(params)[0]


class Kernel:
    """A loaded kernel: `function` (CuPy Function, keeps its module alive), `ptr` (CUfunction),
    `smem` (its dynamic shared memory bytes); launch() with values in `params` order (a tuple of
    formats), or the values a ParamStruct built. launch() returns its LaunchRecord."""

    def __init__(self, function, device_id, params, dynamic_smem=0):
        self.function = function
        self.ptr = function.ptr
        self.device_id = device_id
        self.smem = dynamic_smem
        self.params = params if params is None or isinstance(params, ParamStruct) else tuple(params)
        self._caps = {}
        self._lock = threading.Lock()
        self._packed = None  # the tuple whose values the buffer holds
        self._immutable = (tuple, params.values) if isinstance(params, ParamStruct) else (tuple,)
        if isinstance(params, ParamStruct):  # kernelParams: the struct's image, its one parameter
            self._struct = struct.Struct(params.format)
            self._buf = np.zeros(max(self._struct.size, 8), np.uint8)
            self._addrs = np.array([self._buf.ctypes.data], np.uint64)
            self._kernel_params, self._extra_ptr = self._addrs.ctypes.data, 0
        elif params is not None:
            fmt, offsets = param_layout(self.params)
            self._struct = struct.Struct(fmt)
            self._buf = np.zeros(max(self._struct.size, 8), np.uint8)
            if "map" in self.params:  # kernelParams: the address of each parameter in the buffer
                self._addrs = np.array([self._buf.ctypes.data + o for o in offsets], np.uint64)
                self._kernel_params, self._extra_ptr = self._addrs.ctypes.data, 0
            else:
                self._size = np.array([self._struct.size], np.uint64)  # size_t
                # CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END
                self._extra = np.array([1, self._buf.ctypes.data, 2, self._size.ctypes.data, 0], np.uint64)
                self._kernel_params, self._extra_ptr = 0, self._extra.ctypes.data
        if params is not None:
            from cupy_backends.cuda.api import driver

            self._launch = driver.launchKernel

    def launch(self, stream_ptr, grid, block, values):
        """grid: (x, y) CTAs; block: threads (x only); values: the parameters, in order (a
        ParamStruct's values for a struct kernel). Returns the LaunchRecord."""
        with self._lock:
            # The buffer still holds the last tuple packed: a launch with that same tuple (the
            # launch layers reuse the tuples of repeated parameters) skips the packing. A tuple,
            # or a ParamStruct's values, cannot change, and holding it keeps its identity from
            # being reused.
            if values is not self._packed or type(values) not in self._immutable:
                self._packed = None  # a failed packing leaves the buffer matching no tuple
                self._struct.pack_into(self._buf, 0, *values)
                self._packed = values
            self._launch(self.ptr, grid[0], grid[1], 1, block, 1, 1, self.smem, stream_ptr, self._kernel_params,
                         self._extra_ptr)
        return LaunchRecord(self, stream_ptr, grid, block, values)

    def grid_cap(self, threads):
        """SMs x CTAs of `threads` threads resident per SM: the size of a persistent grid."""
        cap = self._caps.get(threads)
        if cap is None:
            from cupy_backends.cuda.api import driver

            from h3kernels._runtime.targets import sm_count

            per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(self.ptr, threads, self.smem)
            cap = self._caps[threads] = max(1, per_sm) * sm_count(self.device_id)
        return cap
