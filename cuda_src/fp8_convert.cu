// FP32 -> e4m3 over an array through the conversion every kernel uses, so that tests can hold
// the hardware instruction against the contract's rounding next to every midpoint.
#include "fp8_common.cuh"

extern "C" __global__ void h3_f32_to_e4m3(const float* __restrict__ in, u8* __restrict__ out, long long n) {
  for (long long i = 2 * (blockIdx.x * (long long)blockDim.x + threadIdx.x); i < n;
       i += 2LL * gridDim.x * blockDim.x) {
    const float lo = in[i], hi = i + 1 < n ? in[i + 1] : 0.f;
    const u16 r = e4m3x2_from_f32(lo, hi);
    out[i] = (u8)(r & 0xFF);
    if (i + 1 < n) out[i + 1] = (u8)(r >> 8);
  }
}
