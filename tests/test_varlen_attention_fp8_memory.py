"""The attention's memory model (h3kernels/_runtime/workspace.py): a call's scratch comes from
the caller's allocator on the caller's stream and goes back to it, so calls on many streams, from
many threads, hold nothing of ours afterwards; the results are the serial call's bits."""
import threading

import pytest
import torch

import h3kernels
from h3kernels.testing.checks import same_bits
from h3kernels.testing.inputs import make_attention_inputs

pytestmark = pytest.mark.gpu


def one_call_bytes(args, out):
    """Device bytes one call takes from torch's allocator at its peak (out given)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    h3kernels.minimax_h3_varlen_attention_fp8(*args[:4], out, cu_seqlens_host=args[4])
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def test_calls_on_sixty_fresh_streams_hold_no_memory_afterwards(seed):
    args = make_attention_inputs([4096, 4096], 56, device="cuda", seed=seed)
    want = h3kernels.minimax_h3_varlen_attention_fp8(*args[:4], cu_seqlens_host=args[4])
    out = torch.empty_like(args[0])
    need = one_call_bytes(args, out)
    assert need > 0
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
    assert h3kernels.workspace_bytes() == 0
    assert torch.cuda.memory_allocated() - allocated <= 1.5 * need
    torch.cuda.empty_cache()  # the allocator's cache of the streams' blocks is the caller's to release
    assert torch.cuda.memory_reserved() - reserved <= 1.5 * need


def test_calls_from_eight_threads_with_their_own_streams(seed):
    args = make_attention_inputs([4096, 4096], 56, device="cuda", seed=seed)
    want = h3kernels.minimax_h3_varlen_attention_fp8(*args[:4], cu_seqlens_host=args[4])
    need = one_call_bytes(args, torch.empty_like(args[0]))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    allocated = torch.cuda.memory_allocated()
    bad, errors = [], []

    def work(i):
        try:
            for _ in range(60 // 8 + (i < 60 % 8)):
                s = torch.cuda.Stream()
                with torch.cuda.stream(s):
                    got = h3kernels.minimax_h3_varlen_attention_fp8(*args[:4], cu_seqlens_host=args[4])
                s.synchronize()
                if not same_bits(got, want):
                    bad.append(i)
        except Exception as err:  # reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and not bad, (errors, bad)
    torch.cuda.synchronize()
    assert h3kernels.workspace_bytes() == 0
    assert torch.cuda.memory_allocated() - allocated <= 1.5 * need


def test_cupy_calls_on_fresh_streams_give_their_scratch_back(seed):
    cupy = pytest.importorskip("cupy")
    q, k, v, cu_dev, cu = make_attention_inputs([1000, 3000], 8, device="cuda", seed=seed)
    want = h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, cu_seqlens_host=cu)
    bits = lambda t: cupy.from_dlpack(t.view(torch.int16)).view(cupy.uint16)  # noqa: E731
    cq, ck, cv, ccu = bits(q), bits(k), bits(v), cupy.from_dlpack(cu_dev)
    torch.cuda.synchronize()
    pool = cupy.get_default_memory_pool()
    for i in range(20):
        with cupy.cuda.Stream(non_blocking=True) as s:
            got = h3kernels.minimax_h3_varlen_attention_fp8(cq, ck, cv, ccu, cu_seqlens_host=cu)
            s.synchronize()
        assert same_bits(torch.from_dlpack(got.view(cupy.int16)).view(torch.bfloat16), want)
        used = pool.used_bytes()
        del got
        if i == 0:
            first = used
    assert pool.used_bytes() <= first and h3kernels.workspace_bytes() == 0
