"""Where a stage of the attention's stage loop spends its cycles: the shipped kernel with clock64
read at 8 points of each stage (patched_builds.attention_timeline: lane 0 of each consumer
warpgroup, the work tiles of head 0 of segment 0), timed against the unprobed kernel, then the
cycles between consecutive points (medians over the interior stages of every probed tile) and the
two consumers' phase against each other.

    python lab/attention_timeline.py 4x4096 [1x16384 ...] [--patch NAME]   (NAME: probe a lab build)
"""
import statistics
import sys

import numpy as np

import patched_builds as pb


def timeline(name, build):
    t_plain, t_probed, t = pb.probed_run(name, build)
    print(f"\n{name}: kernel alone {t_plain:.3f} ms, with the probes {t_probed:.3f} ms ({t_probed / t_plain:.3f}x)")
    phases = {k: [] for k in range(8)}
    offsets = []
    for cta in range(132):
        n = [int(np.count_nonzero(t[cta, wg, :, 0])) for wg in range(2)]
        for wg in range(2):
            pb.interior_phases(t, cta, wg, phases, 0)
        for st in range(1, min(n) - 1):
            period = t[cta, 0, st + 1, 0] - t[cta, 0, st, 0]
            if period > 0 and t[cta, 1, st, 0] > 0:
                offsets.append(((t[cta, 1, st, 0] - t[cta, 0, st, 0]) / period) % 1.0)
    if not phases[0]:
        print("no interior stages probed")
        return
    total = statistics.median(phases[0])
    print(f"stages probed: {len(phases[0])}; cycles per stage (one warpgroup, S ready to S ready): "
          f"median {total:.0f}, mean {statistics.mean(phases[0]):.0f}")
    for k in range(1, 8):
        v = phases[k]
        print(f"  {pb.TIMELINE_POINTS[k - 1]:>15} -> {pb.TIMELINE_POINTS[k]:<15} median {statistics.median(v):6.0f}  "
              f"p10 {np.percentile(v, 10):6.0f}  p90 {np.percentile(v, 90):6.0f}  mean {statistics.mean(v):6.0f}")
    hist = np.histogram(offsets, bins=10, range=(0, 1))[0]
    print("consumer 1's stage start after consumer 0's, in stages (10 bins over [0, 1)):", hist.tolist())


def main():
    args = sys.argv[1:]
    extra = ""
    if "--patch" in args:
        i = args.index("--patch")
        extra = args[i + 1] + "+"
        del args[i:i + 2]
    build = pb.LabAttentionBuild(patch=extra + "attention_timeline")
    for name in args or ["4x4096"]:
        timeline(name, build)


if __name__ == "__main__":
    main()
