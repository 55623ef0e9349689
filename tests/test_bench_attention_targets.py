"""bench/bench_attention.py's goals line, on made-up results (no GPU): the wgmma family against
cuDNN's bf16 SDPA per set, and on long segments its kernel and whole call against the faster
FP8 peer's kernel alone."""
import importlib
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench_attention():
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module("bench_attention")
    finally:
        sys.path.remove(str(BENCH))


def result(name, ours_tf, kernel_tf, cudnn_tf, fa3_fp8_tf=None, cudnn_fp8_tf=None):
    r = dict(name=name, cudnn=dict(tflops=cudnn_tf),
             families={"wgmma": dict(fp8_mma_form=3, tflops=ours_tf, kernel_tflops=kernel_tf)})
    for key, tf in (("fa3_fp8", fa3_fp8_tf), ("cudnn_fp8", cudnn_fp8_tf)):
        if tf:
            r[key] = dict(tflops=tf)
    return r


def test_goals_name_the_faster_fp8_peer_and_the_short_sets():
    b = bench_attention()
    assert "64x256" in dict(b.SETS)
    t = b.targets([result("4x4096", 673, 820, 680, fa3_fp8_tf=818, cudnn_fp8_tf=1003),
                   result("64x256", 36, 95, 104)], {})
    assert t["kernel_x_fp8_4x4096_wgmma"].startswith("0.82x (NOT met, >= 1.0x")  # against cuDNN FP8, the faster
    assert t["call_x_fp8_4x4096_wgmma"].startswith("0.67x (NOT met, >= 0.9x")
    assert t["x_cudnn_64x256_wgmma"].startswith("0.35x (NOT met, >= 0.6x")
    assert "kernel_x_fp8_64x256_wgmma" not in t  # short sets: against cuDNN bf16 only
    met = b.targets([result("1x16384", 900, 1000, 600, fa3_fp8_tf=910)], {})
    assert met["kernel_x_fp8_1x16384_wgmma"].startswith("1.10x (met") and met["call_x_fp8_1x16384_wgmma"].startswith(
        "0.99x (met")
    assert "kernel_x_fp8_4x4096_wgmma" not in b.targets([result("4x4096", 673, 820, 680)], {})  # no FP8 peer ran
