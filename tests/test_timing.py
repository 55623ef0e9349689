"""h3kernels.testing.timing's host-side pieces, on the CPU: the attention kernel's launch record
replayed and the MLP's GEMMs launched alone (the launch layers stood in for), and the passes'
byte counts."""
import pytest
import torch

import h3kernels.varlen_attention_fp8 as op
from h3kernels._launch import varlen_attention_fp8 as launch
from h3kernels._runtime import arrays, launcher, targets
from h3kernels.testing.timing import attention_kernel_alone, attention_quant_least_bytes, attention_quant_pass_bytes


class FakeCall:
    device_id, stream_ptr = 0, 7

    def __init__(self, named):
        self.named = named

    def empty(self, shape, dtype):
        return torch.zeros(shape, dtype=torch.bfloat16)

    def make_current(self):
        return "previous"


@pytest.fixture
def stand_ins(monkeypatch):
    """The call's checks, arrays, form and launch layer stood in for; run() returns `record[0]`."""
    runs, restored, record = [], [], [None]
    monkeypatch.setattr(op, "check_call", lambda q, k, v, cu, out, cu_host, scale, form: (3, 2, 0.125, (0, 3)))
    monkeypatch.setattr(arrays, "Call", FakeCall)
    monkeypatch.setattr(arrays, "restore", restored.append)
    monkeypatch.setattr(targets, "operator_form", lambda device_id, form: 3 if form == -1 else form)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(launch, "run", lambda *a: runs.append(a) or a[-1].append("scratch") or record[0])
    return runs, restored, record


def test_kernel_alone_replays_the_attention_kernels_launch_record(stand_ins):
    runs, restored, record = stand_ins
    launched = []

    class Kernel:
        def launch(self, *a):
            launched.append(a)
            return "again"

    record[0] = launcher.LaunchRecord(Kernel(), 7, (132, 1), 384, ("values",))
    q = torch.zeros(3, 2, 128, dtype=torch.bfloat16)
    cu = torch.tensor([0, 3], dtype=torch.int32)
    replay = attention_kernel_alone(q, q, q, cu, [0, 3])
    (call, *args, out, form, lse, keep), = runs
    assert isinstance(call, FakeCall) and set(call.named) >= {"q", "k", "v", "cu_seqlens"}
    assert args[:3] == [q, q, q] and args[3] is cu and args[4:] == [(0, 3), 2, 0.125]
    assert out.shape == (3, 2, 128) and form == 3 and lse is None and launched == []
    assert replay() == "again" and launched == [(7, (132, 1), 384, ("values",))]
    assert restored == ["previous", "previous"] and replay.arrays[:2] == (q, out) and replay.arrays[2] == "scratch"
    attention_kernel_alone(q, q, q, torch.tensor([0, 3], dtype=torch.int32), [0, 3], form=0)
    assert runs[-1][-3] == 0  # the form


def test_kernel_alone_raises_when_the_call_launched_no_kernel(stand_ins):
    q = torch.zeros(3, 2, 128, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="no attention kernel"):
        attention_kernel_alone(q, q, q, torch.tensor([0, 3], dtype=torch.int32), [0, 3])


def test_quant_pass_bytes_count_what_each_pass_moves():
    b = attention_quant_pass_bytes([4096] * 4, 56)
    e = 16384 * 56 * 128
    least = attention_quant_least_bytes([4096] * 4, 56)
    assert least == 9 * e  # q, k, v read once as bf16, written once as e4m3
    assert b["q_kernel"] == 3 * e + 4 * 16384 * 56
    assert b["kv_block_kernel"] == 4 * e + 2 * 128 * 56 * 128 * 4
    assert sum(b.values()) > least
    short = attention_quant_pass_bytes([256] * 64, 56)  # one read of K and V
    assert set(short) == {"q_kernel", "k_segment_kernel", "v_segment_kernel"}
    assert short["k_segment_kernel"] == 3 * e + 64 * 56 * 128 * 4 + 4 * 128 * 56  # codes, mu, s_k of 128 blocks
    assert sum(short.values()) < sum(b.values()) - 4 * e
    hopper = attention_quant_pass_bytes([256] * 64, 56, with_q=False)  # the Hopper kernel quantizes Q itself
    assert set(hopper) == {"k_segment_kernel", "v_segment_kernel"} and hopper["k_segment_kernel"] == short["k_segment_kernel"]


def test_mlp_gemms_alone_launches_each_gemm_on_the_calls_operands(monkeypatch):
    import h3kernels
    from h3kernels._launch import mlp_fp8_sm90a as hopper
    from h3kernels.testing.timing import mlp_gemms_alone

    calls, launched, restored = [], [], []
    monkeypatch.setattr(h3kernels, "minimax_h3_mlp_fp8", lambda *a, **kw: calls.append((a, kw)))
    monkeypatch.setattr(arrays, "Call", FakeCall)
    monkeypatch.setattr(arrays, "restore", restored.append)
    monkeypatch.setattr(arrays, "data_ptr", lambda t: id(t))
    monkeypatch.setattr(hopper, "workspace", lambda call, m, width: "split")
    monkeypatch.setattr(hopper, "launch_fc1",
                        lambda call, *a, split, build: launched.append(("fc1", a, split, build)) or "r1")
    monkeypatch.setattr(hopper, "launch_fc2_gemm",
                        lambda call, *a, split, build: launched.append(("fc2", a, split, build)) or "r2")
    named = "x wn sc sh idx gate resid q1 s1 q2 s2".split()
    t = {n: torch.zeros(5, 4) if n in ("x", "resid") else torch.zeros(1) for n in named}
    ws = {k: torch.zeros(1) for k in ("workspace_a_q", "workspace_a_scale", "workspace_y", "workspace_y_q",
                                      "workspace_y_scale")}
    fc1, fc2 = mlp_gemms_alone(*t.values(), ws)
    (args, kw), = calls  # one call of the operator, form 3, into the workspaces
    assert args == tuple(t.values()) and kw == dict(fp8_mma_form=3, **ws) and launched == []
    assert fc1() == "r1" and fc2() == "r2" and restored == ["previous", "previous"]
    (n1, a1, s1, b1), (n2, a2, s2, b2) = launched
    assert (n1, s1, n2, s2) == ("fc1", id("split"), "fc2", id("split")) and b1 is b2 is hopper.SHIPPED
    ptr = {k: id(v) for k, v in ws.items()}
    assert a1 == (5, ptr["workspace_a_q"], ptr["workspace_a_scale"], id(t["q1"]), id(t["s1"]), ptr["workspace_y"])
    assert a2[:5] == (5, ptr["workspace_y_q"], ptr["workspace_y_scale"], id(t["q2"]), id(t["s2"]))
    assert a2[5] is t["gate"] and a2[6:8] == (id(t["idx"]), id(t["resid"])) and fc2.arrays[1].shape == (5, 4)
    assert a2[8] == id(fc2.arrays[1])  # out: a tensor of the function's own
    other = hopper.MlpBuild(group_m=8)  # a build given is the one both launch
    fc1, fc2 = mlp_gemms_alone(*t.values(), ws, build=other)
    fc1(), fc2()
    assert launched[-2][3] is launched[-1][3] is other
