"""Grow-only device workspaces, one per (device, stream), and the host plans uploaded into them.

Everything a call touches is used only in the order of one stream: two streams never share a
buffer, a buffer outgrown on its stream is returned to CuPy's pool, which hands it out again
only to allocations on that same stream, and a plan is uploaded on the stream that reads it.
Each workspace also keeps an event recorded after its last use, which the next call waits on: a
CUDA stream handle can be reused by a new stream once the old one is destroyed, possibly with
work still pending.

Under CUDA graph capture nothing may grow or upload (the capture would point at memory that a
later call frees), and no event may join the graph from outside it; the buffers a captured
graph points at are kept for the life of the process.
"""
import collections
import threading

from h3kernels._errors import fail
from h3kernels._runtime.arrays import cupy_stream

PLANS_PER_STREAM = 16


class DevicePlan:
    """A plan's host arrays uploaded as CuPy arrays (`arrays`), with their addresses (`ptrs`)
    and lengths (`rows`) read once."""

    __slots__ = ("arrays", "ptrs", "rows")

    def __init__(self, arrays):
        self.arrays = arrays
        self.ptrs = tuple(a.data.ptr for a in arrays)
        self.rows = tuple(int(a.shape[0]) for a in arrays)


class Workspace:
    """One stream's buffer (`mem`, grow-only), its uploaded plans, its last-use event, and
    `captured`: what CUDA graphs captured on this stream point at."""

    def __init__(self, device_id, stream_ptr, owner, advice):
        self.device_id, self.stream_ptr, self.owner, self.advice = device_id, stream_ptr, owner, advice
        self.mem = None
        self.nbytes = 0
        self.plans = collections.OrderedDict()
        self.event = None
        self.lock = threading.Lock()
        self.captured = {}

    def capture_error(self, what):
        return RuntimeError(f"{self.owner}: this stream is capturing a CUDA graph, and the call would {what}; "
                            f"{self.advice}")

    def wait(self, capturing):
        """Orders this call after the workspace's last use (not under capture: see the module doc)."""
        if self.event is not None and not capturing:
            from cupy_backends.cuda.api import runtime

            runtime.streamWaitEvent(self.stream_ptr, self.event.ptr, 0)

    def record(self, capturing):
        if capturing:
            return
        from cupy_backends.cuda.api import runtime

        if self.event is None:
            import cupy

            self.event = cupy.cuda.Event(block=False, disable_timing=True)
        runtime.eventRecord(self.event.ptr, self.stream_ptr)

    def plan(self, key, build, capturing):
        """The DevicePlan of `key`, uploaded on first use from build() (host numpy arrays)."""
        hit = self.plans.get(key)
        if hit is not None:
            self.plans.move_to_end(key)
            return hit
        if capturing:
            raise self.capture_error("upload a new segment plan")
        import cupy

        arrays = []
        with cupy.cuda.Device(self.device_id), cupy_stream(self.stream_ptr, self.device_id) as stream:
            for host in build():
                dev = cupy.empty(host.shape, dtype=host.dtype)
                if host.size:
                    # cudaMemcpyAsync on the caller's stream. From pageable memory it returns once
                    # the bytes are staged, and the driver may wait for the stream there: a possible
                    # host wait once per new plan and stream, not per call
                    dev.set(host, stream=stream)
                arrays.append(dev)
        self.plans[key] = hit = DevicePlan(tuple(arrays))
        while len(self.plans) > PLANS_PER_STREAM:
            self.plans.popitem(last=False)  # freed to CuPy's pool for this stream: stream-ordered reuse
        return hit

    def reserve(self, nbytes, capturing, plan):
        """The buffer's address, grown to at least nbytes first (freed to this stream's pool)."""
        if self.nbytes < nbytes:
            if capturing:
                raise self.capture_error("grow the workspace")
            import cupy

            with cupy.cuda.Device(self.device_id), cupy_stream(self.stream_ptr, self.device_id):
                self.mem, self.nbytes = None, 0  # back to the pool before the bigger one is taken
                self.mem, self.nbytes = cupy.cuda.alloc(nbytes), nbytes
        if capturing:  # one entry per buffer set, however many captures use it
            self.captured[(self.mem.ptr, plan.ptrs[0])] = (self.mem, plan)
        return self.mem.ptr


_lock = threading.Lock()
_workspaces = {}  # (device id, stream handle) -> Workspace


def for_stream(device_id, stream_ptr, owner, advice):
    """The workspace of (device, stream). owner and advice word the errors under capture (one
    operator uses workspaces: the attention)."""
    ws = _workspaces.get((device_id, stream_ptr))
    if ws is None:
        with _lock:
            ws = _workspaces.setdefault((device_id, stream_ptr), Workspace(device_id, stream_ptr, owner, advice))
    return ws


def workspace_bytes(device=None):
    """Bytes now held by the workspaces on `device` (an int, 'cuda:N', a torch.device or a CuPy
    Device; None: the current device), summed over its streams."""
    with _lock:
        if not _workspaces:
            return 0
        items = list(_workspaces.items())
    dev = device_id(device)
    return sum(ws.nbytes for (d, _), ws in items if d == dev)


def device_id(device):
    if device is None:
        import cupy

        return cupy.cuda.runtime.getDevice()
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    if isinstance(device, str):  # before the attribute probes: str has an .index method
        if device == "cuda":
            return device_id(None)
        if device.startswith("cuda:") and device[5:].isascii() and device[5:].isdecimal():
            return int(device[5:])
        fail("device", repr(device), "None, an int, 'cuda:N', a torch.device or a CuPy Device", TypeError)
    idx = getattr(device, "index", None)  # torch.device
    if idx is None:
        idx = getattr(device, "id", None)  # cupy Device
    if idx is None:
        if getattr(device, "type", None) == "cuda":
            return device_id(None)
        fail("device", repr(device), "None, an int, 'cuda:N', a torch.device or a CuPy Device", TypeError)
    return int(idx)
