"""Where one call's GPU time goes: every kernel of a back-to-back series of whole calls, from
the profiler's CUDA activity records (CUPTI sees the CuPy, Numba and torch launches alike).

    python lab/call_timeline.py [--rows 256 4096] [--sets 64x256 16x1024 4x4096] [--calls 30]

Per case: each kernel's mean duration and the idle time before it (from the previous kernel's
end), the call's span (first kernel start to last kernel end, mean over the series) and the
median time per call of a series between CUDA events.
--variants: the MLP again with every loaded kernel at the largest shared-memory carveout (what the
launches between the GEMMs cost)."""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import h3kernels
from h3kernels._runtime import compiler
from h3kernels.testing.inputs import make_attention_inputs
from h3kernels.testing.timing import median_ms_batched

from ab_time import mlp_calls  # lab/: the same calls as the A/B timing


def kernel_events(fn, calls):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted(evs, key=lambda e: e.time_range.start)


def report(label, evs, calls):
    per = len(evs) // calls
    dur, gap = [0.0] * per, [0.0] * per
    spans, busy = [], []
    for c in range(1, calls):
        call = evs[c * per:(c + 1) * per]
        spans.append(call[-1].time_range.end - call[0].time_range.start)
        busy.append(sum(e.time_range.end - e.time_range.start for e in call))
        for i, e in enumerate(call):
            dur[i] += (e.time_range.end - e.time_range.start) / (calls - 1)
            if i:
                gap[i] += (e.time_range.start - call[i - 1].time_range.end) / (calls - 1)
    print(f"== {label}: {per} kernels a call, span {sum(spans) / len(spans):.1f} us, "
          f"kernels {sum(busy) / len(busy):.1f} us")
    for i, e in enumerate(evs[:per]):
        print(f"   {dur[i]:9.2f} us (after {gap[i]:5.2f} idle)  {e.name[:70]}")


def mlp(rows, calls):
    for m, call in mlp_calls(rows):
        report(f"mlp M={m}", kernel_events(call, calls), calls)
        print(f"   series: {median_ms_batched(call, batch=20, warmup=2, reps=7) * 1e3:.1f} us a call")


def attention(sets, calls):
    for name in sets:
        n, length = (int(v) for v in name.split("x"))
        q, k, v, cu_dev, cu = make_attention_inputs([length] * n, 56, device="cuda", seed=5)
        dst = torch.empty_like(q)
        call = lambda: h3kernels.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, dst, cu_seqlens_host=cu,  # noqa: E731
                                                                 fp8_mma_form=3)
        report(f"attention {name}", kernel_events(call, calls), calls)


def max_carveout():
    from cupy_backends.cuda.api import driver

    for k in compiler._kernels.values():
        driver.funcSetAttribute(k.ptr, driver.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="*", default=[256, 4096])
    p.add_argument("--sets", nargs="*", default=["64x256", "16x1024", "4x4096"])
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--variants", action="store_true")
    a = p.parse_args()
    if a.rows:
        mlp(a.rows, a.calls)
        if a.variants:
            print("## carveout")
            max_carveout()
            mlp(a.rows, a.calls)
    if a.sets:
        attention(a.sets, a.calls)


if __name__ == "__main__":
    main()
