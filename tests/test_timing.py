"""h3kernels.testing.timing's host-side pieces, on the CPU: the attention kernel's launch recorded
and replayed (with both families' launch functions stubbed), and the passes' byte counts."""
import pytest

from h3kernels._launch import varlen_attention_fp8 as mma_sync
from h3kernels._launch import varlen_attention_fp8_sm90a as hopper
from h3kernels.testing.timing import attention_kernel_alone, attention_quant_least_bytes, attention_quant_pass_bytes


def test_kernel_alone_replays_the_hopper_launch_and_restores_it(monkeypatch):
    calls = []
    monkeypatch.setattr(hopper, "launch", lambda *a: calls.append(a))
    original = hopper.launch
    replay = attention_kernel_alone(lambda: hopper.launch("call", 7, "maps", ("values",), ()))
    assert hopper.launch is original and calls == [("call", 7, "maps", ("values",), ())]
    replay()
    assert calls == [("call", 7, "maps", ("values",), ())] * 2


def test_kernel_alone_replays_the_mma_sync_launch_and_restores_it(monkeypatch):
    launches = []

    class Kernel:
        def launch(self, *a):
            launches.append(a)

    monkeypatch.setattr(mma_sync, "attention_kernel", lambda device_id, form: (Kernel(), 132))
    original = mma_sync.attention_kernel

    def call():
        f, _ = mma_sync.attention_kernel(0, 0)
        f.launch("stream", (132, 1), 256, ("args",))

    replay = attention_kernel_alone(call)
    assert mma_sync.attention_kernel is original and len(launches) == 1
    replay()
    assert launches == [("stream", (132, 1), 256, ("args",))] * 2


def test_kernel_alone_restores_the_launches_when_the_call_raises(monkeypatch):
    monkeypatch.setattr(hopper, "launch", lambda *a: None)
    before = (hopper.launch, mma_sync.attention_kernel)

    def call():
        raise ValueError("q: bad")

    with pytest.raises(ValueError):
        attention_kernel_alone(call)
    assert (hopper.launch, mma_sync.attention_kernel) == before
    with pytest.raises(RuntimeError, match="no attention kernel"):
        attention_kernel_alone(lambda: None)


def test_quant_pass_bytes_count_what_each_pass_moves():
    b = attention_quant_pass_bytes([4096] * 4, 56)
    e = 16384 * 56 * 128
    least = attention_quant_least_bytes([4096] * 4, 56)
    assert least == 9 * e  # q, k, v read once as bf16, written once as e4m3
    assert b["q_kernel"] == 3 * e + 4 * 16384 * 56
    assert b["kv_block_kernel"] == 4 * e + 2 * 128 * 56 * 128 * 4
    assert sum(b.values()) > least
