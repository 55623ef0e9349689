"""`python -m h3kernels check`: the numeric acceptance of both operators on this device.

On a GPU: the MLP at M = 1, 129 and 4096 (a_q and a_scale bitwise, y and out within 1 bf16 ulp
for 99.9% of elements, y_q bitwise from y) and the attention on ragged and H3-sized segment sets
(within varlen_attention_fp8.reference_bound of the reference, and no further from torch's bf16
attention than 1.1x the reference's own). Without a GPU: the Numba row kernel and the
attention's quantization passes in the CUDA simulator, bitwise against the reference. Every
output is poisoned first. Exit status 0 when everything passes, 1 when a check fails.
"""
import os

MLP_ROWS = (1, 129, 4096)
ATTENTION_SETS = (([1, 127, 128, 129, 0, 700], 8), ([4096] * 4, 56))


def run_gpu():
    from h3kernels.cli.demo import check_attention, check_mlp, check_row_stage
    from h3kernels.testing.inputs import make_row_inputs

    results = []
    for m in MLP_ROWS:
        x, w, sc, sh, idx = make_row_inputs(m, rows=8, device="cuda", seed=m)
        row_ok, _, _, row_ref = check_row_stage(x, w, sc, sh, idx)
        results.append((f"MLP row stage M={m}: a_q, a_scale bitwise", row_ok))
        results.append((f"MLP block M={m}: y, y_q, out", check_mlp(x, w, sc, sh, idx, row_ref)[0]))
    for seqlens, heads in ATTENTION_SETS:
        results.append((f"attention {seqlens} x {heads} heads", check_attention(seqlens, heads)[0]))
    return results


def run_simulator():
    """Set before Numba is imported (this is a fresh process without a GPU)."""
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    from h3kernels.testing import simulator as numba_check
    from h3kernels.testing.inputs import make_attention_inputs, make_row_inputs

    m = 8  # row 6 is index-guarded, row 7 zero
    x, w, sc, sh, idx = make_row_inputs(m, rows=4, device="cpu", seed=5)
    x[7] = 0
    row_bad = numba_check.row_stage_mismatches(x, w, sc, sh, idx)
    seqlens, heads = [1, 0, 130], 1
    q, k, v, _, cu = make_attention_inputs(seqlens, heads, device="cpu", seed=6)
    attn_bad = numba_check.attention_pass_mismatches(q, k, v, cu)
    differ = lambda bad: f" (differ: {', '.join(bad)})" if bad else ""
    return [(f"MLP row kernel (simulator) M={m}: a_q, a_scale bitwise{differ(row_bad)}", not row_bad),
            (f"attention quantization passes (simulator), segments {seqlens}: codes and scales bitwise"
             f"{differ(attn_bad)}", not attn_bad)]


def run(gpu, json_path=None):
    from h3kernels.cli.output import finish

    if gpu:
        results = run_gpu()
    else:
        print("No CUDA GPU found: checking the Numba kernels in the CUDA simulator (the GPU checks need an "
              "sm_89, sm_90 or sm_120 GPU).\n")
        results = run_simulator()
    print("\nacceptance:")
    for name, ok in results:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    return finish(json_path, dict(command="check", mode="gpu" if gpu else "simulator",
                                  results=[dict(name=name, ok=bool(passed)) for name, passed in results]),
                  all(ok for _, ok in results))
