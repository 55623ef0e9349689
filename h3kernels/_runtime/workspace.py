"""The attention's scratch memory and segment plans.

Scratch: the quantized operands between the passes and the kernel (q8, k8, v8t, their scales,
the passes' partial sums) and the call's plan live in one buffer taken from the caller's own
allocator on the caller's stream (torch's caching allocator for torch tensors, CuPy's memory
pool for CuPy arrays), held until the call's launches are queued and then given back, stream-
ordered: the allocator reuses it for later work on that stream, follows a CUDA-graph capture into
the graph's pool, and counts it in the caller's own memory accounting. Nothing of ours outlives
the call, whatever the number of streams a process uses.

Plans: each segment plan is built once on the host into pinned memory (PlanCache, bounded per
device) and copied into the call's scratch on the call's stream, one asynchronous copy. An
evicted plan's pinned buffer is freed once no call holds it and every copy from it has
completed (checked without waiting); one a captured graph copies from is kept for the life of
the process, as is, for CuPy arrays, any scratch a captured graph points at (CuPy's pool does not
follow a capture; keep_if_captured, which the MLP's scratch takes too).

Under capture nothing may be built or loaded: a plan must have been used on the device before
(the first call of a plan builds it), so a capture needs one call with the same segments first.
"""
import collections
import threading

import numpy as np

PLANS_PER_DEVICE = 64
ALIGN = 256


class HostPlan:
    """A plan's host arrays packed into one pinned buffer: `rows` (each array's length),
    `offsets` (each array's byte offset in the packed plan), `nbytes`. `copies`: the events of
    copies from it, recorded again once done; `users`: calls between taking it and queuing their
    copy; `captured`: a graph copies from it at every replay. The PlanCache's lock guards all."""

    __slots__ = ("memory", "rows", "offsets", "nbytes", "copies", "users", "captured")

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
        self.users = 0
        self.captured = False

    def idle(self):
        """No call holds it and every copy from it has completed: its buffer may be reused."""
        return not self.users and not self.captured and all(e.done for e in self.copies)


class PlanCache:
    """The host plans of one device: the most recently used PLANS_PER_DEVICE of them, and the
    evicted ones until they are idle (then their pinned buffers go back to CuPy's pool). Nothing
    here waits for the GPU."""

    def __init__(self):
        self.plans = collections.OrderedDict()
        self.retired = []
        self.lock = threading.Lock()

    def take(self, key, build, capturing, advice):
        """The HostPlan of key, built from build() (host numpy arrays) on first use, held for one
        copy (put() gives it back). Under capture a plan must exist already: RuntimeError with
        `advice` otherwise."""
        with self.lock:
            plan = self.plans.get(key)
            if plan is not None:
                self.plans.move_to_end(key)
                plan.users += 1
                return plan
        if capturing:
            raise RuntimeError(advice)
        built = HostPlan(build())
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

    def copy(self, plan, dst, stream_ptr, capturing):
        """One asynchronous copy of the packed plan to device address dst on the stream, its
        event recorded (not under capture: the graph copies at every replay, and the plan is kept
        for good); then the plan is given back."""
        from cupy_backends.cuda.api import runtime

        with self.lock:
            try:
                runtime.memcpyAsync(dst, plan.memory.ptr, plan.nbytes, runtime.memcpyHostToDevice, stream_ptr)
                if capturing:
                    plan.captured = True
                    return
                event = next((e for e in plan.copies if e.done), None)
                if event is None:
                    import cupy

                    event = cupy.cuda.Event(block=False, disable_timing=True)
                    plan.copies.append(event)
                runtime.eventRecord(event.ptr, stream_ptr)
            finally:
                plan.users -= 1

    def give_back(self, plan):
        """The plan, taken but not copied (a call that launched nothing)."""
        with self.lock:
            plan.users -= 1


_lock = threading.Lock()
_plans = {}  # device id -> PlanCache
_captured = collections.defaultdict(list)  # device id -> CuPy scratch a captured graph points at


def plans(device_id):
    cache = _plans.get(device_id)
    if cache is None:
        with _lock:
            cache = _plans.setdefault(device_id, PlanCache())
    return cache


def scratch(call, key, build, size, advice):
    """The call's scratch with its plan copied in: (the plan's rows, the buffer to hold until the
    call's launches are queued, its address, the plan's arrays' addresses in it). key and build:
    the plan's (PlanCache.take); size(rows): the scratch's bytes ahead of the plan, or None for a
    call with nothing to launch (then no buffer: (rows, None, 0, None)). From the caller's
    allocator on the call's stream."""
    from h3kernels._runtime import arrays

    capturing = call.capturing
    cache = plans(call.device_id)
    plan = cache.take(key, build, capturing, advice)
    nbytes = size(plan.rows)
    if nbytes is None:
        cache.give_back(plan)
        return plan.rows, None, 0, None
    try:
        head = -(-nbytes // ALIGN) * ALIGN
        held = call.empty((head + plan.nbytes,), arrays.E4M3)
    except BaseException:
        cache.give_back(plan)
        raise
    base = arrays.data_ptr(held)
    cache.copy(plan, base + head, call.stream_ptr, capturing)
    keep_if_captured(call, held)
    return plan.rows, held, base, tuple(base + head + o for o in plan.offsets)


def keep_if_captured(call, held):
    """Keeps a CuPy call's scratch for good while its stream captures a CUDA graph, which points
    at it (CuPy's pool would hand it out again; torch's allocator follows the capture itself)."""
    if call.kind == "cupy" and call.capturing:
        with _lock:
            _captured[call.device_id].append(held)


def workspace_bytes(device_index=None):
    """Device bytes h3kernels holds between calls on a device (None: the current one): the
    scratch that CUDA graphs captured from CuPy calls point at, else 0. The scratch of calls in
    flight belongs to the caller's allocator."""
    with _lock:
        if not _captured:  # the usual case, answered without touching CUDA
            return 0
    if device_index is None:
        import cupy

        device_index = cupy.cuda.runtime.getDevice()
    with _lock:
        return sum(int(a.nbytes) for a in _captured.get(device_index, ()))
