"""The attention's memory model (h3kernels/_runtime/workspace.py): a call's scratch comes from
the caller's allocator on the caller's stream and goes back to it, so calls on many streams, from
many threads, hold nothing of ours afterwards but the device's segment plans (one here, bounded
per device); the results are the serial call's bits."""
import types

import numpy as np
import pytest
import torch

import h3kernels
from h3kernels._runtime import workspace
from h3kernels.testing.checks import same_bits
from h3kernels.testing.inputs import make_attention_inputs
from h3kernels.testing.threads import run_threads


@pytest.fixture
def host_only(monkeypatch):
    """The plan cache without a GPU: device memory as host bytes, copies and events recorded
    (an event is done once `finish` says so)."""
    import cupy
    from cupy_backends.cuda.api import runtime

    copies, events, synced, current = [], [], [], [None]

    class Event:
        def __init__(self, **kw):
            self.ptr, self.done = len(events), False
            events.append(self)

    class Memory(bytearray):
        ptr = 1 << 20

    class Stream:
        ptr = 7

        def __init__(self, **kw):
            pass

        def synchronize(self):
            synced.append(len(copies))

        def __enter__(self):
            current[0] = self

        def __exit__(self, *exc):
            current[0] = None

    def alloc(n):
        assert isinstance(current[0], Stream), "plan memory from the copy stream's pool"
        return Memory(n)

    monkeypatch.setattr(cupy.cuda, "alloc", alloc)
    monkeypatch.setattr(cupy.cuda, "Stream", Stream)
    monkeypatch.setattr(cupy.cuda, "Event", Event)
    monkeypatch.setattr(runtime, "memcpyAsync", lambda dst, src, n, kind, stream: copies.append((dst, n, stream)))
    monkeypatch.setattr(runtime, "eventRecord", lambda event, stream: setattr(events[event], "done", False))
    monkeypatch.setattr(workspace, "PLANS_PER_DEVICE", 3)
    return types.SimpleNamespace(copies=copies, events=events, synced=synced,
                                 finish=lambda: [setattr(e, "done", True) for e in events])


def test_plans_are_copied_once_bounded_and_freed_once_idle_without_waiting(host_only):
    cache = workspace.PlanCache()
    plan = lambda i: (np.arange(i + 1, dtype=np.int32), np.zeros(2, np.int64))  # noqa: E731
    taken = [cache.take(i, lambda i=i: plan(i), False, "advice") for i in range(5)]
    assert host_only.copies == [(1 << 20, 512, 7)] * 5 and host_only.synced == [1, 2, 3, 4, 5]  # each once, waited
    assert list(cache.plans) == [2, 3, 4] and cache.retired == taken[:2]  # evicted while taken
    assert taken[4].rows == (5, 2) and taken[4].ptrs == (1 << 20, (1 << 20) + 256) and taken[4].nbytes == 512
    assert cache.take(4, None, False, "advice") is taken[4] and len(host_only.copies) == 5  # no copy per call
    cache.release(taken[4], 9, False)
    cache.release(taken[0], 9, False)
    cache.release(taken[1], 9, False, launched=False)
    assert taken[0].users == 0 and not taken[0].idle() and taken[1].idle()
    cache.take(5, lambda: plan(5), False, "advice")  # taken[1] is idle: freed; taken[0]'s launches run on
    assert cache.retired == [taken[0], taken[2]]
    assert cache.nbytes() == 5 * 512  # three cached, two retired
    host_only.finish()
    cache.take(6, lambda: plan(6), False, "advice")
    assert cache.retired == [taken[2], taken[3]]  # still taken, both
    assert cache.take(6, None, True, "advice") is cache.plans[6]  # an existing plan under capture
    with pytest.raises(RuntimeError, match="advice"):
        cache.take(7, lambda: plan(7), True, "advice")  # a new one would need building
    cache.release(cache.plans[6], 9, True)
    assert cache.plans[6].captured and not cache.plans[6].idle()
    for i in range(8, 12):  # a captured plan is never evicted
        cache.release(cache.take(i, lambda i=i: plan(i), False, "advice"), 9, False, launched=False)
    assert 6 in cache.plans and len(cache.plans) == 3


def test_a_plan_keeps_one_event_a_stream(host_only):
    """Calls that run ahead of the GPU on one stream re-record that stream's one event (a later
    record completes after the earlier ones); streams whose calls are done drop out once a plan
    has seen STREAMS_PER_PLAN of them."""
    cache = workspace.PlanCache()
    p = cache.take(0, lambda: (np.zeros(4, np.int32),), False, "advice")
    for _ in range(50):
        cache.release(p, 9, False)
        p.users += 1  # taken again
    assert list(p.uses) == [9] and len(host_only.events) == 1
    for stream in range(100, 100 + workspace.STREAMS_PER_PLAN):
        cache.release(p, stream, False)
        p.users += 1
    assert len(p.uses) == workspace.STREAMS_PER_PLAN + 1
    host_only.finish()
    cache.release(p, 500, False)
    assert list(p.uses) == [500] and p.users == 0 and not p.idle()  # its launches still queued
    host_only.finish()
    assert p.idle()


def one_call_bytes(args, out):
    """Device bytes one call takes from torch's allocator at its peak (out given)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    h3kernels.minimax_h3_varlen_attention_fp8(*args[:4], out, cu_seqlens_host=args[4])
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


@pytest.mark.gpu
def test_calls_on_sixty_fresh_streams_hold_no_memory_afterwards(seed):
    args = make_attention_inputs([4096, 4096], 56, device="cuda", seed=seed)
    earlier = h3kernels.workspace_bytes()  # the plans of earlier calls in this process
    want = h3kernels.minimax_h3_varlen_attention_fp8(*args[:4], cu_seqlens_host=args[4])
    out = torch.empty_like(args[0])
    need = one_call_bytes(args, out)
    plans = h3kernels.workspace_bytes()
    assert plans - earlier < 1 << 20 < need  # at most the one plan of these segments, on the device
    torch.cuda.empty_cache()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    for _ in range(60):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            got = h3kernels.minimax_h3_varlen_attention_fp8(*args[:4], cu_seqlens_host=args[4])
        s.synchronize()
        assert same_bits(got, want)
        del got, s
    torch.cuda.synchronize()
    assert h3kernels.workspace_bytes() == plans
    assert torch.cuda.memory_allocated() - allocated <= 1.5 * need
    torch.cuda.empty_cache()  # the allocator's cache of the streams' blocks is the caller's to release
    assert torch.cuda.memory_reserved() - reserved <= 1.5 * need


@pytest.mark.gpu
def test_calls_from_eight_threads_with_their_own_streams(seed):
    args = make_attention_inputs([4096, 4096], 56, device="cuda", seed=seed)
    want = h3kernels.minimax_h3_varlen_attention_fp8(*args[:4], cu_seqlens_host=args[4])
    need = one_call_bytes(args, torch.empty_like(args[0]))
    plans = h3kernels.workspace_bytes()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    allocated = torch.cuda.memory_allocated()
    bad = []

    def work(i):
        for _ in range(60 // 8 + (i < 60 % 8)):
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                got = h3kernels.minimax_h3_varlen_attention_fp8(*args[:4], cu_seqlens_host=args[4])
            s.synchronize()
            if not same_bits(got, want):
                bad.append(i)

    errors = run_threads(work, 8)
    assert not errors and not bad, (errors, bad)
    torch.cuda.synchronize()
    assert h3kernels.workspace_bytes() == plans
    assert torch.cuda.memory_allocated() - allocated <= 1.5 * need


@pytest.mark.gpu
def test_cupy_calls_on_fresh_streams_give_their_scratch_back(seed):
    cupy = pytest.importorskip("cupy")
    q, k, v, cu_dev, cu = make_attention_inputs([1000, 3000], 8, device="cuda", seed=seed)
    want = h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, cu_seqlens_host=cu)
    bits = lambda t: cupy.from_dlpack(t.view(torch.int16)).view(cupy.uint16)  # noqa: E731
    cq, ck, cv, ccu = bits(q), bits(k), bits(v), cupy.from_dlpack(cu_dev)
    torch.cuda.synchronize()
    pool = cupy.get_default_memory_pool()
    plans = h3kernels.workspace_bytes()
    for i in range(20):
        with cupy.cuda.Stream(non_blocking=True) as s:
            got = h3kernels.minimax_h3_varlen_attention_fp8(cq, ck, cv, ccu, cu_seqlens_host=cu)
            s.synchronize()
        assert same_bits(torch.from_dlpack(got.view(cupy.int16)).view(torch.bfloat16), want)
        used = pool.used_bytes()  # with this call's output alive, every call alike
        del got
        if i == 0:
            first = used
        assert used <= first, (i, used, first)
    assert h3kernels.workspace_bytes() == plans
