"""The attention's scratch memory and segment plans.

Scratch: the quantized operands between the passes and the kernel (q8, k8, v8t, their scales,
the passes' partial sums) and the call's plan live in one buffer taken from the caller's own
allocator on the caller's stream (torch's caching allocator for torch tensors, CuPy's memory
pool for CuPy arrays), held until the call's launches are queued and then given back, stream-
ordered: the allocator reuses it for later work on that stream, follows a CUDA-graph capture into
the graph's pool, and counts it in the caller's own memory accounting. Nothing of ours outlives
the call, whatever the number of streams a process uses.

Plans: each segment plan is built once on the host into pinned memory (PlanCache, bounded per
device) and copied into the call's scratch on the call's stream, one asynchronous copy. A pinned
plan is freed only when it is evicted and every copy from it has completed; one a captured graph
copies from is kept for the life of the process, as is, for CuPy arrays, the scratch a captured
graph points at (CuPy's pool does not follow a capture).

Under capture nothing may be built or loaded: a plan must have been used on the device before
(the first call of a plan builds it), so a capture needs one call with the same segments first.
"""
import collections
import threading

import numpy as np

from h3kernels._errors import fail

PLANS_PER_DEVICE = 64
ALIGN = 256


class HostPlan:
    """A plan's host arrays packed into one pinned buffer: `rows` (each array's length),
    `offsets` (each array's byte offset in the packed plan), `nbytes`. `copies` holds the events
    of copies from it that may still run; `captured` marks a plan a graph copies from."""

    __slots__ = ("memory", "rows", "offsets", "nbytes", "copies", "captured", "lock")

    def __init__(self, arrays):
        import cupy

        offsets, off = [], 0
        for a in arrays:
            offsets.append(off)
            off += -(-a.nbytes // ALIGN) * ALIGN
        self.nbytes = max(off, ALIGN)
        self.memory = cupy.cuda.alloc_pinned_memory(self.nbytes)
        packed = np.frombuffer(self.memory, np.uint8, self.nbytes)
        for a, o in zip(arrays, offsets):
            packed[o:o + a.nbytes] = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
        self.rows = tuple(int(a.shape[0]) for a in arrays)
        self.offsets = tuple(offsets)
        self.copies = []
        self.captured = False
        self.lock = threading.Lock()

    def copy_to(self, dst, stream_ptr, capturing):
        """One asynchronous copy of the packed plan to device address dst on the stream."""
        from cupy_backends.cuda.api import runtime

        runtime.memcpyAsync(dst, self.memory.ptr, self.nbytes, runtime.memcpyHostToDevice, stream_ptr)
        if capturing:  # the graph copies from this buffer at every replay
            self.captured = True
            return
        with self.lock:  # an event whose copy is done is recorded again, else a new one
            event = next((e for e in self.copies if e.done), None)
            if event is None:
                import cupy

                event = cupy.cuda.Event(block=False, disable_timing=True)
                self.copies.append(event)
            runtime.eventRecord(event.ptr, stream_ptr)

    def release(self):
        """Frees the pinned buffer once every copy from it has completed (an evicted plan's copies
        ended long before, as it is the least recently used)."""
        with self.lock:
            for e in self.copies:
                e.synchronize()
            self.copies = []
            self.memory = None


class PlanCache:
    """The host plans of one device, the most recently used PLANS_PER_DEVICE of them."""

    def __init__(self):
        self.plans = collections.OrderedDict()
        self.lock = threading.Lock()

    def get(self, key, build, capturing, advice):
        """The HostPlan of key, built from build() (host numpy arrays) on first use. Under capture
        a plan must exist already: RuntimeError with `advice` otherwise."""
        with self.lock:
            plan = self.plans.get(key)
            if plan is not None:
                self.plans.move_to_end(key)
                return plan
        if capturing:
            raise RuntimeError(advice)
        plan = HostPlan(build())
        with self.lock:
            plan = self.plans.setdefault(key, plan)
            self.plans.move_to_end(key)
            evicted = []
            for old_key in list(self.plans):
                if len(self.plans) - len(evicted) <= PLANS_PER_DEVICE:
                    break
                if not self.plans[old_key].captured:
                    evicted.append(self.plans.pop(old_key))
        for old in evicted:
            old.release()
        return plan


_lock = threading.Lock()
_plans = {}  # device id -> PlanCache
_captured = collections.defaultdict(list)  # device id -> CuPy scratch a captured graph points at


def plans(device_id):
    cache = _plans.get(device_id)
    if cache is None:
        with _lock:
            cache = _plans.setdefault(device_id, PlanCache())
    return cache


def scratch(call, nbytes, plan):
    """(the buffer to hold until the call's launches are queued, its address, the plan's arrays'
    addresses in it): nbytes of scratch and the plan after them, from the caller's allocator on
    the call's stream, the plan copied in."""
    from h3kernels._runtime import arrays

    head = -(-nbytes // ALIGN) * ALIGN
    held = call.empty((head + plan.nbytes,), arrays.E4M3)
    base = arrays.data_ptr(held)
    capturing = call.capturing
    plan.copy_to(base + head, call.stream_ptr, capturing)
    if capturing and call.kind == "cupy":
        with _lock:
            _captured[call.device_id].append(held)
    return held, base, tuple(base + head + o for o in plan.offsets)


def workspace_bytes(device=None):
    """Device bytes the attention holds between calls on `device` (an int, 'cuda:N', a
    torch.device or a CuPy Device; None: the current device): the scratch that captured graphs
    of CuPy calls point at, else 0. Scratch of calls in flight belongs to the caller's allocator."""
    with _lock:
        if not _captured:  # the usual case, answered without touching CUDA
            return 0
    dev = device_id(device)
    with _lock:
        return sum(int(a.nbytes) for a in _captured.get(dev, ()))


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
