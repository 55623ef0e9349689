"""The one launch path of every kernel, NVRTC-built or Numba-written: cuLaunchKernel on the
caller's raw stream handle, its parameters packed into one buffer (CU_LAUNCH_PARAM_BUFFER_*).

A `Kernel` holds the driver function, its parameter layout (a precompiled struct format with
each parameter at its natural alignment) and the packing buffer, so a launch costs one
`pack_into` and one driver call: no per-launch Python objects beyond the values themselves.
The driver copies the parameters during cuLaunchKernel (also under stream capture), so the
buffer is reused as soon as the call returns; a lock keeps two threads from packing at once.
The caller makes the kernel's device current (arrays.Call.make_current).
"""
import struct
import threading

import numpy as np

# parameter format -> (struct code, bytes): everything a kernel here takes
PARAM_CODES = {"u64": "Q", "i64": "q", "u32": "I", "i32": "i", "f32": "f"}


def pack_format(params):
    """struct format ('<', each parameter at its own size's alignment) of a parameter list."""
    fmt, off = "<", 0
    for p in params:
        code = PARAM_CODES[p]
        size = struct.calcsize("<" + code)
        pad = -off % size
        fmt += "x" * pad + code
        off += pad + size
    return fmt


class Kernel:
    """A loaded kernel: `function` (CuPy Function, keeps its module alive), `ptr` (CUfunction),
    `smem` (its dynamic shared memory bytes); launch() with values in `params` order."""

    def __init__(self, function, device_id, params, dynamic_smem=0):
        self.function = function
        self.ptr = function.ptr
        self.device_id = device_id
        self.smem = dynamic_smem
        self.params = tuple(params) if params is not None else None
        self._caps = {}
        self._lock = threading.Lock()
        if params is not None:
            self._struct = struct.Struct(pack_format(self.params))
            self._buf = np.zeros(max(self._struct.size, 8), np.uint8)
            self._size = np.array([self._struct.size], np.uint64)  # size_t
            # CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END
            self._extra = np.array([1, self._buf.ctypes.data, 2, self._size.ctypes.data, 0], np.uint64)
            self._extra_ptr = self._extra.ctypes.data
            from cupy_backends.cuda.api import driver

            self._launch = driver.launchKernel

    def launch(self, stream_ptr, grid, block, values):
        """grid: (x, y) CTAs; block: threads (x only); values: the parameters, in order."""
        with self._lock:
            self._struct.pack_into(self._buf, 0, *values)
            self._launch(self.ptr, grid[0], grid[1], 1, block, 1, 1, self.smem, stream_ptr, 0, self._extra_ptr)

    def grid_cap(self, threads):
        """SMs x CTAs of `threads` threads resident per SM: the size of a persistent grid."""
        cap = self._caps.get(threads)
        if cap is None:
            from cupy_backends.cuda.api import driver

            from h3kernels._runtime.targets import sm_count

            per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(self.ptr, threads, self.smem)
            cap = self._caps[threads] = max(1, per_sm) * sm_count(self.device_id)
        return cap
