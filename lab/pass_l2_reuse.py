"""Would the attention's K/V passes read K and V from L2 the second time if they ran one head
group at a time? A stand-in for their traffic: a statistics pass that reads K and V
([2, tokens, heads, 128] bf16) and a quantization pass that reads them again and writes half as
many bytes, over all heads at once or group after group (each group's two passes back to back,
every configuration one CUDA graph, L2 flushed before each run), beside a copy.

    python3 lab/pass_l2_reuse.py [tokens]   (default 16384; 56 heads)
"""
import sys

import cupy as cp

SOURCE = r"""
__device__ __forceinline__ long long element(long long i, int tokens, int heads, int h0, int hg) {
  const long long lane = i % 32, r = i / 32, h = h0 + r % hg, tok = (r / hg) % tokens, t = r / hg / tokens;
  return ((t * tokens + tok) * heads + h) * 32 + lane;  // 8 bytes (4 bf16) per lane, a row per 32 lanes
}
extern "C" __global__ void stats(const unsigned long long* x, float* sink, int tokens, int heads, int h0, int hg) {
  const long long n = 2LL * tokens * hg * 32;
  float s = 0.f;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const unsigned long long w = x[element(i, tokens, heads, h0, hg)];
    s += __uint_as_float((unsigned)(w << 16)) + __uint_as_float((unsigned)(w & 0xffff0000u));
  }
  if (s == 123.f) sink[0] = s;  // keeps the loads
}
extern "C" __global__ void quant(const unsigned long long* x, unsigned* y, int tokens, int heads, int h0, int hg) {
  const long long n = 2LL * tokens * hg * 32;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const long long at = element(i, tokens, heads, h0, hg);
    const unsigned long long w = x[at];
    y[at] = (unsigned)(w >> 8) ^ (unsigned)w;
  }
}
"""


def main():
    tokens, heads = (int(sys.argv[1]) if len(sys.argv) > 1 else 16384), 56
    module = cp.RawModule(code=SOURCE)
    stats, quant = module.get_function("stats"), module.get_function("quant")
    x = cp.random.randint(0, 2**62, size=2 * tokens * heads * 32, dtype=cp.uint64)
    y = cp.zeros(x.size, dtype=cp.uint32)
    sink = cp.zeros(1, cp.float32)
    flush = cp.zeros(256 * 2**20 // 4, cp.float32)  # larger than L2
    grid = (cp.cuda.Device().attributes["MultiProcessorCount"] * 8,)
    stream = cp.cuda.Stream(non_blocking=True)

    def passes(group):
        for h0 in range(0, heads, group):
            g = cp.int32(min(group, heads - h0))
            stats(grid, (256,), (x, sink, cp.int32(tokens), cp.int32(heads), cp.int32(h0), g))
            quant(grid, (256,), (x, y, cp.int32(tokens), cp.int32(heads), cp.int32(h0), g))

    def median_ms(run, reps=20):
        start, end, times = cp.cuda.Event(), cp.cuda.Event(), []
        for _ in range(reps):
            flush.fill(1.0)
            start.record(stream)
            run()
            end.record(stream)
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end))
        return sorted(times)[reps // 2]

    moved = (2 * x.nbytes + y.nbytes) / 1e9  # two reads and one write
    with stream:
        for group in (heads, 16, 8, 4, 2, 1):
            passes(group)
            stream.synchronize()
            stream.begin_capture()
            passes(group)
            graph = stream.end_capture()
            ms = median_ms(lambda: graph.launch(stream))
            footprint = 2 * tokens * min(group, heads) * 256 / 2**20
            print(f"{tokens} tokens, heads {group:2d} at a time (K and V {footprint:6.0f} MiB): {ms:.4f} ms, "
                  f"{moved / ms:.2f} TB/s of {moved:.2f} GB moved as if both reads came from memory", flush=True)
        copy = cp.empty_like(x)
        ms = median_ms(lambda: copy.__setitem__(slice(None), x))
    print(f"copy of {x.nbytes / 1e9:.2f} GB: {ms:.4f} ms, {2 * x.nbytes / 1e9 / ms:.2f} TB/s")


if __name__ == "__main__":
    main()
