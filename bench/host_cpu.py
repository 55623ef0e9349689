"""Host time of the operators' Python work on a machine without a GPU, in microseconds per call.

    python bench/host_cpu.py [--repeats N] [--inner N] [--json PATH]

On CPU torch tensors of the real shapes (MLP M = 256 and 16384; attention 4 x 4096 tokens, 56
heads, with cu_seqlens_host), left unfilled: the checks read only dtypes, shapes, strides and
addresses. Two groups of cases:

- validate: the argument checks alone (h3kernels._validate: mlp_args, the attention's check_call),
  as h3kernels.reference also runs them.
- call: the whole operator call as on an H200 (compute capability 9.0, fp8_mma_form=-1), with
  what needs a GPU replaced: arrays.Call (kind, device and stream: it refuses CPU tensors) by a
  stand-in that reports device 0, results taken from a pool instead of the caching allocator,
  and the driver calls (cuLaunchKernel, the memset, the attention workspace's event and upload,
  the TMA map encoding) by no-ops. Parameter packing, the plans and every check run as they do
  on the GPU. Call's own loop over the arguments is therefore not in these figures.

Each figure is the median (and the minimum: on a shared machine the least disturbed) over
`repeats` rounds of the mean of `inner` back-to-back calls (time.perf_counter_ns), after a
warm-up. bench/host_time.py measures the same calls on a GPU.
"""
import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import h3kernels  # noqa: E402
from h3kernels import varlen_attention_fp8 as attention_op  # noqa: E402
from h3kernels._validate import mlp_fp8 as mlp_checks  # noqa: E402
from h3kernels.constants import FC1_OUT, FFN, H3_HEADS, HEAD_DIM, HIDDEN, fc2_flag_count  # noqa: E402

H200 = {"major": 9, "minor": 0, "name": "NVIDIA H200", "multiProcessorCount": 132}


def per_call_us(fn, inner, repeats):
    for _ in range(max(inner // 4, 10)):
        fn()
    rounds = []
    for _ in range(repeats):
        t = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        rounds.append((time.perf_counter_ns() - t) / inner / 1e3)
    return statistics.median(rounds), min(rounds)


def mlp_arrays(m):
    bf16, e4m3 = torch.bfloat16, torch.float8_e4m3fn
    mod = torch.empty(50, 6 * HIDDEN, dtype=bf16)  # AdaLN tables as column chunks, as make_row_inputs
    inputs = dict(x=torch.empty(m, HIDDEN, dtype=bf16), x_norm_weight=torch.empty(HIDDEN, dtype=bf16),
                  adaln_scale=mod[:, HIDDEN:2 * HIDDEN], adaln_shift=mod[:, 3 * HIDDEN:4 * HIDDEN],
                  adaln_index=torch.zeros(m, dtype=torch.int64), gate=torch.empty(50, HIDDEN, dtype=bf16),
                  residual=torch.empty(m, HIDDEN, dtype=bf16), fc1_weight_q=torch.empty(FC1_OUT, HIDDEN, dtype=e4m3),
                  fc1_weight_scale=torch.empty(FC1_OUT), fc2_weight_q=torch.empty(HIDDEN, FFN, dtype=e4m3),
                  fc2_weight_scale=torch.empty(HIDDEN))
    workspaces = dict(workspace_a_q=torch.empty(m, HIDDEN, dtype=e4m3), workspace_a_scale=torch.empty(m),
                      workspace_y=torch.empty(m, FFN, dtype=bf16), workspace_y_q=torch.empty(m, FFN, dtype=e4m3),
                      workspace_y_scale=torch.empty(m), workspace_flags=torch.zeros(fc2_flag_count(m),
                                                                                    dtype=torch.int32))
    return inputs, torch.empty(m, HIDDEN, dtype=bf16), workspaces


def given_of(out=None, **workspaces):
    names = ("out", "workspace_a_q", "workspace_a_scale", "workspace_y", "workspace_y_q", "workspace_y_scale",
             "workspace_flags")
    return {n: (out if n == "out" else workspaces.get(n)) for n in names}


class _Pool:
    """Results of the stand-in Call: one CPU tensor per (shape, dtype), as a warm caching
    allocator hands back a block without touching memory."""

    def __init__(self):
        self.tensors = {}

    def empty(self, shape, dtype):
        key = (tuple(shape), dtype)
        t = self.tensors.get(key)
        if t is None:
            from h3kernels._runtime import arrays

            t = self.tensors[key] = torch.empty(shape, dtype=arrays.torch_dtype(dtype))
        return t


class _Workspace:
    """The attention workspace without the driver: plans kept as host arrays, a fixed base address."""

    def __init__(self):
        self.lock = threading.Lock()
        self.plans = {}

    def wait(self, capturing):
        pass

    def record(self, capturing):
        pass

    def plan(self, key, build, capturing):
        hit = self.plans.get(key)
        if hit is None:
            host = tuple(np.ascontiguousarray(a) for a in build())
            hit = self.plans[key] = SimpleNamespace(arrays=host, ptrs=tuple(a.ctypes.data for a in host),
                                                    rows=tuple(int(a.shape[0]) for a in host))
        return hit

    def reserve(self, nbytes, capturing, plan):
        return 1 << 40


def without_gpu():
    """Replaces what needs a GPU on the operators' call path (see the module doc)."""
    from cupy_backends.cuda.api import runtime

    from h3kernels._launch import mlp_fp8 as mlp_launch
    from h3kernels._launch import numba_ptx
    from h3kernels._launch import varlen_attention_fp8 as attention_launch
    from h3kernels._launch import varlen_attention_fp8_sm90a as attention_hopper
    from h3kernels._runtime import arrays, launcher, targets, workspace

    pool, ws = _Pool(), _Workspace()

    class CpuCall:
        kind, device_id, stream_ptr, capturing = "torch", 0, 0, False

        def __init__(self, named):
            pass

        def make_current(self):
            return None

        def empty(self, shape, dtype):
            return pool.empty(shape, dtype)

    def kernel(params, smem=0):
        k = launcher.Kernel(SimpleNamespace(ptr=0), 0, params, smem)
        k._launch = lambda *a: None
        return k

    arrays.Call = CpuCall
    targets.device_properties = lambda device_id: H200
    runtime.memsetAsync = lambda *a: None
    workspace.for_stream = lambda *a: ws
    attention_hopper.tensor_map = lambda *a: bytes(128)
    for name in numba_ptx.SIGNATURES:
        numba_ptx._kernels[(name, 0)] = kernel(numba_ptx.params(name))
    mlp_launch._gemms[(0, 0)] = (kernel(mlp_launch.FC1_PARAMS), kernel(mlp_launch.FC2_PARAMS), 132)
    attention_launch._kernels[(0, 0)] = (kernel(attention_launch.PARAMS), 264)
    attention_hopper._kernels[(0, ())] = (kernel(attention_hopper.PARAMS), 132)


def cases():
    out = {}
    for m in (256, 16384):
        inputs, res, ws = mlp_arrays(m)
        args = tuple(inputs.values())
        plain, with_out = given_of(), given_of(res)
        out[f"validate mlp_m{m}"] = lambda i=inputs, g=plain: mlp_checks.mlp_args(i, g)
        out[f"validate mlp_m{m}_out"] = lambda i=inputs, g=with_out: mlp_checks.mlp_args(i, g)
        if m == 256:
            every = given_of(res, **ws)
            out["validate mlp_m256_workspaces"] = lambda i=inputs, g=every: mlp_checks.mlp_args(i, g)
        out[f"call mlp_m{m}"] = lambda a=args: h3kernels.minimax_h3_mlp_fp8(*a)
        out[f"call mlp_m{m}_out"] = lambda a=args, o=res: h3kernels.minimax_h3_mlp_fp8(*a, out=o)
        if m == 256:
            out["call mlp_m256_workspaces"] = lambda a=args, o=res, w=ws: h3kernels.minimax_h3_mlp_fp8(*a, out=o,
                                                                                                       **w)
    cu = [0, 4096, 8192, 12288, 16384]
    q, k, v, o = (torch.empty(cu[-1], H3_HEADS, HEAD_DIM, dtype=torch.bfloat16) for _ in range(4))
    cu_dev = torch.tensor(cu, dtype=torch.int32)
    out["validate attention_4x4096_host"] = lambda: attention_op.check_call(q, k, v, cu_dev, None, cu, None)
    out["validate attention_4x4096_host_out"] = lambda: attention_op.check_call(q, k, v, cu_dev, o, cu, None)
    attn = h3kernels.minimax_h3_varlen_attention_fp8
    out["call attention_4x4096_host"] = lambda: attn(q, k, v, cu_dev, cu_seqlens_host=cu)
    out["call attention_4x4096_host_out"] = lambda: attn(q, k, v, cu_dev, o, cu_seqlens_host=cu)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=41)
    p.add_argument("--inner", type=int, default=200)
    p.add_argument("-k", default="", help="only the cases whose name contains this")
    p.add_argument("--json", help="write {case: {median_us, min_us}} here")
    a = p.parse_args(argv)
    without_gpu()
    result = {}
    for name, fn in cases().items():
        if a.k in name:
            med, low = per_call_us(fn, a.inner, a.repeats)
            result[name] = dict(median_us=med, min_us=low)
            print(f"{name:<40} median {med:8.2f} us   min {low:8.2f} us", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
