"""Issue rates of the instructions the attention softmax is made of, on the GPU at hand: clocks a
scheduler (SM sub-partition) spends per warp instruction, with two warps per scheduler as in the
attention kernel's consumer warpgroups, and for pairs or groups run side by side (a group costs
the larger of its parts when they use different pipes, their sum when they share one).

python lab/sm90_pipe_rates.py   (docs/kernels/attention_sm90.md ("Decisions") has the H200's figures)"""
import cupy as cp
import numpy as np

CH, UNROLL = 4, 8  # independent chains per array and operation, rounds of them per loop trip
SCHEDULERS = 4  # per SM on sm_90
SRC = r'''
#define OP(name, body) __device__ __forceinline__ void name(unsigned& x) { asm volatile(body : "+r"(x)); }
OP(ex2, "ex2.approx.ftz.f32 %0, %0;")
OP(ex2h2, "ex2.approx.f16x2 %0, %0;")
OP(cvt8, "{.reg .b16 t; cvt.rn.satfinite.e4m3x2.f32 t, %0, %0; mov.b32 %0, {t, t};}")
OP(cvth2, "cvt.rn.f16x2.f32 %0, %0, %0;")
OP(ffma, "fma.rn.f32 %0, %0, 0f3F800001, 0f33D6BF95;")
OP(fadd, "add.f32 %0, %0, 0f33D6BF95;")
OP(shf, "shf.l.wrap.b32 %0, %0, %0, 3;")
__device__ __forceinline__ void fmax(unsigned& x, unsigned y) { asm volatile("max.f32 %0, %0, %1;" : "+r"(x) : "r"(y)); }
#define KERNEL(name, GROUP)                                                                          \
  extern "C" __global__ void name(float* out, int iters, float seed) {                               \
    unsigned a[CH], b[CH], c[CH], d[CH], e[CH];                                                      \
    for (int i = 0; i < CH; ++i) {                                                                   \
      a[i] = __float_as_uint(seed + threadIdx.x * 1e-3f + i);                                        \
      b[i] = a[i] + 1; c[i] = a[i] + 2; d[i] = a[i] + 3; e[i] = a[i] + 4;                            \
    }                                                                                                \
    for (int it = 0; it < iters; ++it) {                                                             \
      _Pragma("unroll") for (int r = 0; r < UNROLL; ++r) {                                             \
        _Pragma("unroll") for (int i = 0; i < CH; ++i) { GROUP; }                                    \
      }                                                                                              \
    }                                                                                                \
    unsigned s = 0;                                                                                  \
    for (int i = 0; i < CH; ++i) s ^= a[i] ^ b[i] ^ c[i] ^ d[i] ^ e[i];                              \
    if (s == 0x12345u) out[threadIdx.x] = s;                                                         \
  }
#define NEXT(v) v[(i + 1) % CH]
KERNEL(ex2_f32, ex2(a[i]))
KERNEL(ex2_f16x2, ex2h2(a[i]))
KERNEL(cvt_e4m3x2_f32, cvt8(a[i]))
KERNEL(cvt_f16x2_f32, cvth2(a[i]))
KERNEL(ffma, ffma(a[i]))
KERNEL(fadd, fadd(a[i]))
KERNEL(fmnmx, fmax(a[i], NEXT(a)))
KERNEL(shf, shf(a[i]))
KERNEL(ex2_and_cvt_e4m3x2, ex2(a[i]); cvt8(b[i]))
KERNEL(ex2_and_fmnmx, ex2(a[i]); fmax(b[i], NEXT(b)))
KERNEL(cvt_e4m3x2_and_fmnmx, cvt8(a[i]); fmax(b[i], NEXT(b)))
KERNEL(ffma_and_fmnmx, ffma(a[i]); fmax(b[i], NEXT(b)))
KERNEL(ex2_and_2_ffma, ex2(a[i]); ffma(b[i]); ffma(c[i]))
KERNEL(ex2_and_4_ffma, ex2(a[i]); ffma(b[i]); ffma(c[i]); ffma(d[i]); ffma(e[i]))
KERNEL(ex2_and_4_fmnmx, ex2(a[i]); fmax(b[i], NEXT(b)); fmax(c[i], NEXT(c)); fmax(d[i], NEXT(d)); fmax(e[i], NEXT(e)))
'''
NAMES = [line.split("(")[1].split(",")[0] for line in SRC.splitlines() if line.startswith("KERNEL(")]


def main():
    mod = cp.RawModule(code=SRC, options=("--gpu-architecture=sm_90a", f"-DCH={CH}", f"-DUNROLL={UNROLL}"))
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    clock_hz = cp.cuda.runtime.deviceGetAttribute(cp.cuda.runtime.cudaDevAttrClockRate, 0) * 1e3
    out, threads, iters = cp.zeros(1024, cp.float32), 256, 2000  # 8 warps a SM: 2 per scheduler
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, {sms} SMs, clocks counted at the "
          f"maximum {clock_hz / 1e9:.2f} GHz; clocks per group of warp instructions and scheduler")
    for name in NAMES:
        f = mod.get_function(name)
        f((sms,), (threads,), (out, np.int32(10), np.float32(0.3)))
        best = float("inf")
        for _ in range(3):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            f((sms,), (threads,), (out, np.int32(iters), np.float32(0.3)))
            b.record()
            b.synchronize()
            best = min(best, cp.cuda.get_elapsed_time(a, b) * 1e-3)
        groups_per_scheduler = iters * UNROLL * CH * (threads // 32) / SCHEDULERS
        print(f"{name:24s} {best * 1e3:7.3f} ms  {best * clock_hz / groups_per_scheduler:5.2f} clocks")


if __name__ == "__main__":
    main()
