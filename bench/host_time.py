"""Host time per operator call, measured while the GPU is busy (no call can wait on it), beside
that of torch.compile of the FP8 torch MLP at M = 256 in the same run.

    python bench/host_time.py [--json PATH] [--calls N] [--profile]

Host time: h3kernels.testing.timing.host_ms_per_call (median of N calls, time.perf_counter,
after warm-up, each round of calls queued behind a spin kernel). Cases: minimax_h3_mlp_fp8 at
M = 256 and 16384, minimax_h3_varlen_attention_fp8 at 4 x 4096 tokens, 56 heads, with
cu_seqlens_host and without (then each call reads cu_seqlens back: a device sync, so that
figure includes waiting for the GPU). GPU times are bench/bench_mlp.py's and
bench/bench_attention.py's. --profile adds the cProfile top functions of each host-time case.
"""
import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import h3kernels  # noqa: E402
from h3kernels import reference as R  # noqa: E402
from h3kernels.constants import FC1_OUT, FFN, H3_HEADS, HIDDEN  # noqa: E402
from h3kernels.testing import timing  # noqa: E402
from h3kernels.testing.inputs import cu_seqlens_of, make_row_inputs  # noqa: E402

TARGET_MS = {"mlp_m256": 0.10, "mlp_m16384": 0.10, "attention_4x4096_host": 0.15}


def log(msg):
    print(msg, flush=True)


def weights(dev):
    g = torch.Generator(device=dev).manual_seed(1)
    w1 = (torch.randn(FC1_OUT, HIDDEN, generator=g, device=dev) * 0.02).bfloat16()
    w2 = (torch.randn(HIDDEN, FFN, generator=g, device=dev) * 0.02).bfloat16()
    packed = (*h3kernels.prepare_minimax_h3_fc1_weight_fp8(w1), *h3kernels.prepare_minimax_h3_fc2_weight_fp8(w2))
    q1, s1 = R.quantize_rows(w1)  # logical row order, for the torch peer
    q2, s2 = R.quantize_rows(w2)
    return packed, (q1, s1.view(1, -1), q2, s2.view(1, -1))


def mlp_inputs(m, dev):
    x, w, sc, sh, idx = make_row_inputs(m, 50, device=dev)
    idx = idx.clamp(max=49)
    gate = (torch.randn(50, HIDDEN, device=dev) * 0.1).bfloat16()
    res = torch.randn(m, HIDDEN, device=dev).bfloat16()
    return x, w, sc, sh, idx, gate, res


def profile_top(fn, calls=50, lines=14):
    pr = cProfile.Profile()
    timing.occupy_gpu(100.0)  # 50 calls stay well inside the launch queue
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(lines)
    return s.getvalue()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the results here")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--profile", action="store_true")
    a = p.parse_args(argv)
    dev = torch.device("cuda", torch.cuda.current_device())
    t0 = time.time()
    result = dict(device=torch.cuda.get_device_name(dev), host_ms={}, targets_ms=TARGET_MS)
    packed, logical = weights(dev)
    cases = {}
    for m in (256, 16384):
        inp = mlp_inputs(m, dev)
        out = torch.empty(m, HIDDEN, dtype=torch.bfloat16, device=dev)
        cases[f"mlp_m{m}"] = (lambda inp=inp: h3kernels.minimax_h3_mlp_fp8(*inp, *packed),
                              min(a.calls, 100) if m > 1024 else a.calls)
        cases[f"mlp_m{m}_out"] = (lambda inp=inp, out=out: h3kernels.minimax_h3_mlp_fp8(*inp, *packed, out=out),
                                  min(a.calls, 100) if m > 1024 else a.calls)
    seqlens = [4096] * 4
    cu = cu_seqlens_of(seqlens)
    q, k, v = (torch.randn(cu[-1], H3_HEADS, 128, device=dev).bfloat16() for _ in range(3))
    cu_dev = torch.tensor(cu, dtype=torch.int32, device=dev)
    o = torch.empty_like(q)
    attn = h3kernels.minimax_h3_varlen_attention_fp8
    cases["attention_4x4096_host"] = (lambda: attn(q, k, v, cu_dev, cu_seqlens_host=cu), a.calls)
    cases["attention_4x4096_host_out"] = (lambda: attn(q, k, v, cu_dev, o, cu_seqlens_host=cu), a.calls)
    cases["attention_4x4096_sync"] = (lambda: attn(q, k, v, cu_dev), min(a.calls, 50))
    for name, (fn, calls) in cases.items():
        r = timing.host_ms_per_call(fn, calls=calls)
        result["host_ms"][name] = r
        log(f"host {name:<28} median {r['median_ms']:.4f} ms  p90 {r['p90_ms']:.4f}  "
            f"(busy rounds {r['busy_rounds']}/{r['rounds']})")
        if a.profile and not name.endswith("sync"):
            log(profile_top(fn))

    # the host time of torch.compile's FP8 MLP at M = 256, the yardstick of the same run
    from h3kernels.peers import torch_mlp

    inp = mlp_inputs(256, dev)
    try:
        t = time.time()
        peer = torch.compile(torch_mlp.mlp_fp8)
        peer_fn = lambda: peer(*inp, *logical)
        peer_fn()
        torch.cuda.synchronize()
        result["torch_compile_s"] = round(time.time() - t, 1)
        result["host_ms"]["mlp_m256_torch_compile_fp8_peer"] = timing.host_ms_per_call(peer_fn, calls=a.calls)
    except Exception as err:  # the peer is a yardstick: its failure must not lose our figures
        result["torch_compile_error"] = f"{type(err).__name__}: {str(err)[:300]}"
    result["elapsed_s"] = round(time.time() - t0, 1)

    log("\n| case | host ms/call (median) | target |")
    log("| --- | --- | --- |")
    for name, r in result["host_ms"].items():
        log(f"| {name} | {r['median_ms']:.4f} | {TARGET_MS.get(name, '')} |")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
