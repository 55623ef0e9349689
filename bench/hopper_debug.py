"""Isolates a failure of the wgmma family: each stage in its own process (CUDA_LAUNCH_BLOCKING=1,
a timeout), so one fault or hang does not hide the others.

python bench/hopper_debug.py            # every stage
python bench/hopper_debug.py STAGE      # one stage (what the driver runs)"""
import os
import subprocess
import sys
import time

STAGES = ["probe_regs", "probe_tma", "op0", "quant", "fc1:DBG_NO_TMA,DBG_NO_MMA", "fc1:DBG_NO_MMA", "fc1:DBG_NO_TMA",
          "fc1:DBG_NO_REGS", "fc1", "fc2", "op3"]

PROBE = r'''
#include "hopper_common.cuh"
extern "C" __global__ void __launch_bounds__(384, 1) probe_regs(int* out) {
  const int wg = threadIdx.x >> 7;
  if (wg == 0) {
    regs_dealloc<40>();
    out[threadIdx.x] = 1;
  } else {
    regs_alloc<232>();
    out[threadIdx.x] = 2;
  }
}
extern "C" __global__ void probe_tma(const __grid_constant__ TmaMap map, u8* out, int row0) {
  extern __shared__ u8 smem_raw[];
  __shared__ __align__(8) u64 bar;
  const u32 raw = smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
  if (threadIdx.x == 0) { mbar_init(&bar, 1); mbar_init_fence(); }
  __syncthreads();
  if (threadIdx.x == 0) { mbar_arrive_expect_tx(&bar, 128 * 128); tma_load_2d(base, &map, 0, row0, &bar); }
  mbar_wait(&bar, 0);
  for (int i = threadIdx.x; i < 128 * 128; i += blockDim.x) out[i] = smem_raw[base - raw + i];
}
'''


def stage_main(stage):
    import torch

    import h3kernels
    from h3kernels import reference
    from h3kernels._launch import mlp_fp8_sm90a as H
    from h3kernels._runtime import arrays, compiler
    from h3kernels.constants import FFN, HIDDEN
    from h3kernels.testing.inputs import make_mlp_weights, make_row_inputs

    name, _, variant = stage.partition(":")
    torch.zeros(1, device="cuda")
    arrays.make_current(0)
    call = arrays.Call(dict(a=torch.zeros(1, device="cuda")))
    p = arrays.data_ptr
    if name.startswith("probe"):
        main, headers = compiler.read_with_includes("mlp_fp8_sm90a")
        cubin, logtext = compiler.nvrtc().compile(PROBE, "probe.cu", headers,
                                                  compiler.options_for("sm_90a", {}, ("-Xptxas=-v",)))
        ident = ("probe", len(PROBE))
        if name == "probe_regs":
            k = compiler.load_kernel(ident, lambda: cubin, "probe_regs", 0, ("u64",))
            out = torch.zeros(384, dtype=torch.int32, device="cuda")
            k.launch(call.stream_ptr, (1, 1), 384, (p(out),))
            torch.cuda.synchronize()
            print("probe_regs", out.sum().item(), "(want", 128 + 2 * 256, ")")
        else:
            mk = compiler.load_kernel(ident, lambda: cubin, "probe_tma", 0, ("map", "u64", "i32"), 17 * 1024)
            g = torch.Generator(device="cuda").manual_seed(1)
            src = torch.randint(0, 256, (200, HIDDEN), dtype=torch.uint8, device="cuda", generator=g)
            out = torch.zeros(128 * 128, dtype=torch.uint8, device="cuda")
            mk.launch(call.stream_ptr, (1, 1), 128, (H.tensor_map(p(src), 200, HIDDEN, 128), p(out), 100))
            torch.cuda.synchronize()
            r = torch.arange(128, device="cuda")[:, None]
            c = torch.arange(128, device="cuda")[None, :]
            at = r * 128 + (((c // 16) ^ (r % 8)) * 16) + c % 16
            want = torch.zeros(128, 128, dtype=torch.uint8, device="cuda")
            want[:100] = src[100:200, :128]
            got = out[at.flatten()].view(128, 128)
            print("probe_tma equal:", bool(torch.equal(got, want)), "rows past end zero:", bool((got[100:] == 0).all()))
        return
    m = 200
    gate, residual, w1, w2, q1, s1, q2, s2 = make_mlp_weights(m, 50)
    x, wn, sc, sh, idx = make_row_inputs(m, 50, device="cuda", seed=5)
    if name in ("op0", "op3"):
        out = h3kernels.minimax_h3_mlp_fp8(x, wn, sc, sh, idx, gate, residual, q1, s1, q2, s2,
                                           fp8_mma_form=0 if name == "op0" else 3)
        torch.cuda.synchronize()
        print(name, "ran; finite:", bool(torch.isfinite(out.float()).all()))
        return
    a_q, a_s = h3kernels.minimax_h3_mlp_fp8_row_stage(x, wn, sc, sh, idx)
    torch.cuda.synchronize()
    if name == "quant":
        y = (torch.randn(m, FFN, device="cuda") * 3).bfloat16()
        y_q = torch.empty(m, FFN, dtype=torch.uint8, device="cuda")
        y_s = torch.empty(m, device="cuda")
        H.kernels(0)[2].launch(call.stream_ptr, (m, 1), H.QUANT_THREADS, (p(y), p(y_q), p(y_s)))
        torch.cuda.synchronize()
        q_ref, s_ref = reference.quantize_rows(y)
        print("quant y_q bitwise:", bool(torch.equal(y_q, q_ref.view(torch.uint8))), "y_scale bitwise:",
              bool(torch.equal(y_s, s_ref)))
        return
    if name == "fc1":
        var = tuple(sorted((v, 1) for v in filter(None, variant.split(","))))
        y = torch.full((m, FFN), float("nan"), dtype=torch.bfloat16, device="cuda")
        H.launch_fc1(call, m, p(a_q), p(a_s), p(q1), p(s1), p(y), var)
        torch.cuda.synchronize()
        y_ref = reference.fc1_swiglu(a_q, a_s, q1, s1)
        from h3kernels.testing.checks import bf16_ulps

        u = bf16_ulps(y, y_ref)
        print(stage, "ran; y nonfinite:", int((~torch.isfinite(y.float())).sum()), "max ulp:", int(u.max()),
              ">1ulp frac:", float((u > 1).float().mean()))
        if not variant:
            bad = (u > 1).nonzero()
            print("first bad (row, col):", bad[:10].tolist())
        return
    if name == "fc2":
        y = reference.fc1_swiglu(a_q, a_s, q1, s1)
        y_q, y_s = reference.quantize_rows(y)
        out = torch.full((m, HIDDEN), float("nan"), dtype=torch.bfloat16, device="cuda")
        H.launch_fc2(call, m, p(y), p(y_q), p(y_s), p(q2), p(s2), gate, p(idx), p(residual), p(out))
        torch.cuda.synchronize()
        print("fc2 ran; nonfinite:", int((~torch.isfinite(out.float())).sum()))


def main():
    if len(sys.argv) > 1:
        stage_main(sys.argv[1])
        return
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    for st in os.environ.get("H3_DEBUG_STAGES", ",".join(STAGES)).split(";") if "H3_DEBUG_STAGES" in os.environ \
            else STAGES:
        t = time.time()
        try:
            r = subprocess.run([sys.executable, __file__, st], env=env, capture_output=True, text=True, timeout=45)
            lines = (r.stdout + r.stderr).strip().splitlines()
            interesting = [ln for ln in lines if "Error" in ln or "error" in ln or "ran" in ln or "probe" in ln
                           or "bitwise" in ln or "bad" in ln]
            print(f"[{st}] rc={r.returncode} {time.time() - t:.0f}s :: " + " | ".join(interesting[-4:])[:900],
                  flush=True)
        except subprocess.TimeoutExpired:
            print(f"[{st}] TIMEOUT (hang)", flush=True)


if __name__ == "__main__":
    main()
