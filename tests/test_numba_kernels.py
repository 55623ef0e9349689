"""Every Numba kernel compiles for real (sm_90 and sm_120 PTX), not only in the CUDA simulator: the
simulator accepts code that real Numba typing rejects (seen: a shared-array shape that was not a
literal). The test runs this file as a script in a subprocess with the simulator off (it is set
for the whole test process when there is no GPU); no GPU is needed. Argument types mirror the
launches (raw-bit views, C-contiguous)."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.slow  # test_launch compiles each kernel for sm_120 too, by the path the launches take
def test_numba_kernels_compile_to_ptx_outside_the_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]
    assert out.stdout.count(": ok") == 10, out.stdout


def compile_every_kernel():
    """Compiles each kernel to PTX for sm_90 and sm_120; prints '<name>: ok' for each."""
    import numba
    from numba import cuda

    from h3kernels._launch.numba import mlp_fp8_row
    from h3kernels._launch.numba import varlen_attention_fp8_quant as quant

    # Device functions called from a kernel compile for the current device's compute capability;
    # there is none here, so name the one being checked.
    from numba.cuda import dispatcher

    target = {}
    dispatcher.get_current_device = lambda: type("Device", (), {"compute_capability": target["cc"]})()
    u32, u64, i32, i64, f32 = np.uint32, np.uint64, np.int32, np.int64, np.float32
    z = np.zeros
    t, h, blocks = 5, 2, 3
    cases = {"mlp_fp8_row": (mlp_fp8_row.kernel(), (
        z((2, 1344), u64), z(1344, u64), z(9000, u64), z(9000, u64), 4032, 3, z(2, i64), 1e-5,
        z((2, 1344), u32), z(2, f32), z(3, i32)))}
    qk, kv_block, kv_segment, kq, vq, kv_sums, kq_given, k_seg, v_seg = quant.kernels()
    cases.update({
        "q_kernel": (qk, (z(t * h * 32, u64), z(t * h * 32, u32), z(t * h, f32), u64(t * h))),
        "kv_block_kernel": (kv_block, (z(t * h * 32, u64), z(t * h * 32, u64), z((blocks, 3), i64),
                                       z(2 * blocks * h * 128, f32), u64(h), u64(blocks))),
        "kv_segment_kernel": (kv_segment, (z(3, i32), z(3, i32), z((2, blocks, h, 128), f32), z((2, h, 128), f32),
                                           z((2, h, 128), f32))),
        "k_quant_kernel": (kq, (z(t * h * 32, u64), z(2 * h * 128, f32), z((blocks, 3), i64), z(t * h * 32, u32),
                                z(blocks * h, f32), u64(h))),
        "v_quant_kernel": (vq, (z(t * h * 32, u64), z(2 * h * 128, f32), z((blocks, 3), i64),
                                z(h * 128 * blocks * 32, u32), u64(h), u64(blocks))),
        "kv_segment_sums_kernel": (kv_sums, (z(3, i32), z((2, blocks, h, 128), f32), z((2, h, 128), f32),
                                             z((2, h, 128), f32))),
        "k_quant_given_kernel": (kq_given, (z(t * h * 32, u64), z(2 * h * 128, f32), z((blocks, 3), i64),
                                            z(t * h * 32, u32), z(blocks * h, f32), u64(h))),
        "k_segment_kernel": (k_seg, (z(t * h * 32, u64), z(3, i32), z(3, i32), z(2 * h * 128, f32), z(t * h * 32, u32),
                                     z(blocks * h, f32), u64(h))),
        "v_segment_kernel": (v_seg, (z(t * h * 32, u64), z(3, i32), z(3, i32), z(2 * h * 128, f32),
                                     z(h * 128 * blocks * 32, u32), u64(h), u64(blocks))),
    })
    for name, (kernel, args) in cases.items():
        sig = tuple(numba.typeof(a) for a in args)
        for cc in ((9, 0), (12, 0)):
            target["cc"] = cc
            ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=cc)
            assert ".entry" in ptx, name
        print(f"{name}: ok")



if __name__ == "__main__":
    compile_every_kernel()
