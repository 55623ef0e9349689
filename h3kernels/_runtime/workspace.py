"""The attention's scratch memory and segment plans.

Scratch: the quantized operands between the passes and the kernel (q8, k8, v8t, their scales,
the passes' partial sums) live in one buffer taken from the caller's own allocator on the
caller's stream (torch's caching allocator for torch tensors, CuPy's memory pool for CuPy
arrays), held until the call's launches are queued and then given back, stream-ordered: the
allocator reuses it for later work on that stream, follows a CUDA-graph capture into the graph's
pool, and counts it in the caller's own memory accounting. No scratch of ours outlives the call,
whatever the number of streams a process uses.

Plans: each segment plan is built once on the host and copied once into device memory of its
own (CuPy's pool), which every stream's calls then read: no copy per call. The plans of a device
are bounded (PlanCache, the most recently used PLANS_PER_DEVICE, whatever the number of
streams). A call records an event on its stream once its launches are queued; an evicted plan's
memory goes back to the pool once no call holds it and every such event has completed (checked
without waiting). A plan a captured graph reads is kept for the life of the process, as is, for
CuPy arrays, any scratch a captured graph points at (CuPy's pool does not follow a capture;
keep_if_captured, which the MLP's scratch takes too).

Under capture nothing may be built or loaded: a plan must have been used on the device before
(the first call of a plan builds it), so a capture needs one call with the same segments first.
"""
import collections
import threading

import numpy as np

PLANS_PER_DEVICE = 64
STREAMS_PER_PLAN = 8  # events a plan keeps before it drops those of streams whose calls are done
ALIGN = 256


class DevicePlan:
    """A plan's host arrays packed into one device buffer of the current device, copied there
    once: `rows` (each array's length), `ptrs` (each array's device address), `nbytes`. `uses`:
    {stream: an event recorded there after the last call's launches on that stream} (a later
    record on a stream completes after the earlier ones, so one event a stream tells when all of
    its calls are done); `users`: calls between taking it and queuing their launches; `captured`:
    a graph reads it at every replay. The PlanCache's lock guards uses, users and captured."""

    __slots__ = ("memory", "rows", "ptrs", "nbytes", "uses", "users", "captured")

    def __init__(self, arrays, copy_stream):
        import cupy
        from cupy_backends.cuda.api import runtime

        offsets, off = [], 0
        for a in arrays:
            offsets.append(off)
            off += -(-a.nbytes // ALIGN) * ALIGN
        self.nbytes = max(off, ALIGN)
        packed = np.zeros(self.nbytes, np.uint8)
        for a, o in zip(arrays, offsets):
            packed[o:o + a.nbytes] = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
        # From the copy stream's own part of CuPy's pool: memory the current stream freed may still
        # be read by its queued kernels, which the copy below would not wait for.
        with copy_stream:
            self.memory = cupy.cuda.alloc(self.nbytes)
        # on a stream that waits for no other work, and waited for here, once per plan: from now
        # on every stream may read it
        runtime.memcpyAsync(self.memory.ptr, packed.ctypes.data, self.nbytes, runtime.memcpyHostToDevice,
                            copy_stream.ptr)
        copy_stream.synchronize()
        self.rows = tuple(int(a.shape[0]) for a in arrays)
        self.ptrs = tuple(self.memory.ptr + o for o in offsets)
        self.uses = {}
        self.users = 0
        self.captured = False

    def idle(self):
        """No call holds it and every launch that reads it has completed: its memory may be reused."""
        return not self.users and not self.captured and all(e.done for e in self.uses.values())


class PlanCache:
    """The device plans of one device: the most recently used PLANS_PER_DEVICE of them, and the
    evicted ones until they are idle (then their memory goes back to CuPy's pool). Nothing here
    waits for the GPU but the one copy of a plan being built."""

    def __init__(self):
        self.plans = collections.OrderedDict()
        self.retired = []
        self.lock = threading.Lock()
        self.copy_stream = None

    def take(self, key, build, capturing, advice):
        """The DevicePlan of key, built from build() (host numpy arrays) on first use on the
        current device, held by the call until release(). Under capture a plan must exist
        already: RuntimeError with `advice` otherwise."""
        with self.lock:
            plan = self.plans.get(key)
            if plan is not None:
                self.plans.move_to_end(key)
                plan.users += 1
                return plan
        if capturing:
            raise RuntimeError(advice)
        with self.lock:
            if self.copy_stream is None:
                import cupy

                self.copy_stream = cupy.cuda.Stream(non_blocking=True)
        built = DevicePlan(build(), self.copy_stream)
        with self.lock:
            plan = self.plans.setdefault(key, built)
            self.plans.move_to_end(key)
            plan.users += 1
            for old_key in [k for k in self.plans if not self.plans[k].captured]:
                if len(self.plans) <= PLANS_PER_DEVICE:
                    break
                self.retired.append(self.plans.pop(old_key))
            self.retired = [p for p in self.retired if not p.idle()]  # the idle ones are freed
        return plan

    def release(self, plan, stream_ptr, capturing, launched=True):
        """The call is done with plan: its launches, if any (launched), are queued on the stream,
        whose event is recorded; under capture the plan is kept for good instead (a graph reads
        it at every replay)."""
        from cupy_backends.cuda.api import runtime

        with self.lock:
            try:
                if not launched:
                    return
                if capturing:
                    plan.captured = True
                    return
                event = plan.uses.get(stream_ptr)
                if event is None:
                    import cupy

                    if len(plan.uses) >= STREAMS_PER_PLAN:  # streams long gone leave done events
                        plan.uses = {s: e for s, e in plan.uses.items() if not e.done}
                    event = plan.uses[stream_ptr] = cupy.cuda.Event(block=False, disable_timing=True)
                runtime.eventRecord(event.ptr, stream_ptr)
            finally:
                plan.users -= 1

    def nbytes(self):
        with self.lock:
            self.retired = [p for p in self.retired if not p.idle()]
            return sum(p.nbytes for p in (*self.plans.values(), *self.retired))


_lock = threading.Lock()
_plans = {}  # device id -> PlanCache
_captured = collections.defaultdict(list)  # device id -> CuPy scratch a captured graph points at


def plans(device_id):
    cache = _plans.get(device_id)
    if cache is None:
        with _lock:
            cache = _plans.setdefault(device_id, PlanCache())
    return cache


def scratch(call, nbytes):
    """A call's scratch (both operators'): nbytes from the caller's allocator on the call's
    stream, to hold until the call's launches are queued (for good under a CuPy capture)."""
    from h3kernels._runtime import arrays

    held = call.empty((nbytes,), arrays.E4M3)
    keep_if_captured(call, held)
    return held


def keep_if_captured(call, held):
    """Keeps a CuPy call's scratch for good while its stream captures a CUDA graph, which points
    at it (CuPy's pool would hand it out again; torch's allocator follows the capture itself)."""
    if call.kind == "cupy" and call.capturing:
        with _lock:
            _captured[call.device_id].append(held)


def workspace_bytes(device_index=None):
    """Device bytes h3kernels holds between calls on a device (None: the current one): the
    attention's segment plans, and the scratch that CUDA graphs captured from CuPy calls point
    at. The scratch of calls in flight belongs to the caller's allocator."""
    with _lock:
        if not _captured and not _plans:  # nothing used yet: answered without touching CUDA
            return 0
    if device_index is None:
        import cupy

        device_index = cupy.cuda.runtime.getDevice()
    with _lock:
        cache = _plans.get(device_index)
        scratch = sum(int(a.nbytes) for a in _captured.get(device_index, ()))
    return scratch + (cache.nbytes() if cache is not None else 0)
