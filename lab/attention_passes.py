"""The attention's quantization passes against the HBM bandwidth of the same run: each pass alone
and all passes together, the bytes each moves, GB/s, and that over a torch device-to-device copy
of the same bytes (the figure; testing.timing.QUANT_PASSES_OF_COPY_WANTED is the share wanted),
timed on the operator's launch path (_launch.varlen_attention_fp8.quant_launches into a workspace
of our own).

Before timing, the workspace's outputs of a checked set (ragged segments, partial key blocks, a K
offset, zero channels and rows) are compared bitwise with h3kernels.reference on the CPU; a
difference exits with status 1 after the timings.

Each timed run queues its launches behind a spin kernel (testing.timing.occupy_gpu) long enough
to cover their host work, so that a short pass is timed on the GPU, not at the host's launch rate.

python lab/attention_passes.py [--bounds-ab] [SET ...]   (bench_attention's set names; default 4x4096 1x16384)
  --bounds-ab: then again without numba_ptx.LAUNCH_BOUNDS (no register caps), in the same run
"""
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from h3kernels import reference as R
from h3kernels._launch.varlen_attention_fp8_plan import key_blocks
from h3kernels.testing.inputs import make_attention_inputs
from h3kernels.testing.timing import (QUANT_PASSES_OF_COPY_WANTED as WANTED, QuantPasses, attention_quant_pass_bytes,
                                      copy_bandwidth_gbs, occupy_gpu)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # the benchmarks' segment sets
from bench_attention import SETS  # noqa: E402
from bench_common import log  # noqa: E402

HEADS = 56
CHECK_SET = [4096, 1000, 0, 130, 1, 255]  # checked bitwise: ragged, empty and one-key segments


class Passes(QuantPasses):
    """QuantPasses on one device for the process's life, with its outputs and bytes."""

    def __init__(self, q, k, v, cu, cu_host):
        super().__init__(q, k, v, cu, cu_host)
        self.call.make_current()  # for the process's life: a benchmark on one device

    def out(self, name):
        off, shape, dt = self.parts[name]
        size = int(np.prod(shape)) * np.dtype(dt).itemsize
        return self.mem[off:off + size].view(getattr(torch, dt)).view(shape).cpu()

    def bytes_moved(self):
        """{pass: bytes read + written}, each array counted once (the plan's small arrays left out)."""
        return attention_quant_pass_bytes([b - a for a, b in zip(self.cu_host, self.cu_host[1:])], self.heads)


def gpu_ms(fn, batch, reps=7):
    """Median ms per fn() over `reps` runs of `batch` back-to-back calls between one event pair,
    each run queued behind a spin kernel that outlasts the host time of its launches."""
    host = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    host_ms = (time.perf_counter() - host) * 1e3
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        occupy_gpu(max(5.0, 2.0 * batch * host_ms))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(batch):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / batch)
    return statistics.median(times)


def check():
    """Names of the workspace outputs that differ from the reference's on CHECK_SET ([] if none)."""
    from h3kernels._launch.numba.varlen_attention_fp8_quant import v_transposed
    from h3kernels.testing.simulator import same_codes, same_scales

    q, k, v, _, cu_host = make_attention_inputs(CHECK_SET, HEADS, device="cpu", seed=7, k_offset=40.0)
    q[7], v[:, 0, 5] = 0, 0  # a zero Q row, a zero V channel
    cu_host = tuple(int(c) for c in cu_host)
    dev = torch.device("cuda")
    p = Passes(q.to(dev), k.to(dev), v.to(dev), torch.tensor(cu_host, dtype=torch.int32, device=dev), cu_host)
    p.mem.fill_(0x7F)  # poison: NaN codes, and scales of 3.4e38 that no input here gives
    p.run()
    torch.cuda.synchronize()
    q8, s_q, k8, s_k, v8, s_v = R.quantize_attention_inputs(q, k, v, cu_host)
    u8 = lambda t: t.view(torch.uint8).numpy()
    blocks = key_blocks(cu_host)
    live = [s for s in range(len(cu_host) - 1) if cu_host[s + 1] > cu_host[s]]
    got = {name: p.out(name).numpy() for name in ("q8", "s_q", "k8", "s_k", "v8t", "s_v")}
    checks = (("q8", same_codes(got["q8"], u8(q8))), ("s_q", same_scales(got["s_q"], s_q.numpy())),
              ("k8", same_codes(got["k8"], u8(k8))),
              ("s_k", same_scales(np.repeat(got["s_k"], blocks[:, 2], axis=0), s_k.numpy())),
              ("v8t", same_codes(got["v8t"], v_transposed(u8(v8), cu_host))),
              ("s_v", same_scales(got["s_v"][live], s_v[[cu_host[s] for s in live]].numpy())))
    return [name for name, ok in checks if not ok]


def measure(name, lens, label=""):
    q, k, v, cu, cu_host = make_attention_inputs(lens, HEADS, device="cuda", seed=0)
    p = Passes(q, k, v, cu, cu_host)
    moved = p.bytes_moved()
    total_bytes = sum(moved.values())
    p.run()
    torch.cuda.synchronize()
    each = {one[0]: gpu_ms(lambda one=one: p.run([one]), batch=10) for one in p.launches}
    together = gpu_ms(p.run, batch=5)
    copy_gbs, copy_ms = copy_bandwidth_gbs(total_bytes)
    gbs = lambda b, ms: b / (ms * 1e-3) / 1e9
    from h3kernels._launch import numba_ptx
    from h3kernels._runtime.targets import device_cc

    cc = device_cc(p.call.device_id)
    capped = [k for k in ("q_kernel", "k_quant_kernel", "v_quant_kernel") if ".maxntid" in numba_ptx.ptx(k, cc)]
    name = name + label
    log(f"{name}: launch bounds in the PTX of: {', '.join(capped) or 'none'}")
    log(f"{name}: torch copy of {total_bytes / 1e6:.0f} MB: {copy_ms:.3f} ms, {copy_gbs:.0f} GB/s")
    rows = []
    for pname, ms in each.items():
        rows.append((pname, ms, moved[pname], gbs(moved[pname], ms)))
    rows.append(("all passes", together, total_bytes, gbs(total_bytes, together)))
    rows.append(("sum of passes", sum(each.values()), total_bytes, gbs(total_bytes, sum(each.values()))))
    log(f"{name}: | pass | ms | MB | GB/s | of copy |")
    for pname, ms, b, g in rows:
        flag = "" if g / copy_gbs >= WANTED or pname == "kv_segment_kernel" else f" (< {WANTED:.2f})"
        log(f"{name}: | {pname} | {ms:.4f} | {b / 1e6:.1f} | {g:.0f} | {g / copy_gbs:.2f}{flag} |")
    return rows, copy_gbs


def drop_launch_bounds():
    """Recompiles the Numba passes without register caps (the disk cache keys them apart)."""
    from h3kernels._launch import numba_ptx
    from h3kernels._runtime import compiler

    numba_ptx.LAUNCH_BOUNDS.clear()
    numba_ptx._ptx.clear()
    compiler.clear_caches()
    for loaded in (compiler._kernels, compiler._modules):  # keyed by ("numba", name, cc), not by the PTX
        for key in [key for key in loaded if isinstance(key[0], tuple) and key[0][0] == "numba"]:
            del loaded[key]


def main():
    args = sys.argv[1:]
    ab = "--bounds-ab" in args
    names = [a for a in args if a != "--bounds-ab"] or ["4x4096", "1x16384"]
    log(f"{torch.cuda.get_device_name()}, heads {HEADS}")
    bad = check()
    log(f"bitwise against the reference on {CHECK_SET} x {HEADS} heads: "
        + ("all outputs equal" if not bad else "DIFFER: " + ", ".join(bad)))
    for name in names:
        measure(name, dict(SETS)[name])
    if ab:
        drop_launch_bounds()
        for name in names:
            measure(name, dict(SETS)[name], " (no launch bounds)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
