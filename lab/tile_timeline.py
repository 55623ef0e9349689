"""Where a work tile of the attention spends its cycles outside the stage loop's stages: the
shipped kernel with clock64 read at 8 points of each tile (patched_builds.tile_timeline: lane 0
of each consumer warpgroup, a CTA's first 64 tiles), timed against the unprobed kernel; then the
cycles between consecutive points, medians over every CTA's interior tiles, per consumer.

    python lab/tile_timeline.py 64x256 [16x1024 4x4096 ...] [--first-s | --epilogue]   (finer about the
    first S, or about the epilogue)
"""
import statistics
import sys

import numpy as np

import patched_builds as pb


def timeline(name, build, points):
    t_plain, t_probed, t = pb.probed_run(name, build)
    print(f"\n{name}: kernel alone {t_plain:.3f} ms, with the probes {t_probed:.3f} ms ({t_probed / t_plain:.3f}x)")
    for wg in range(2):
        phases = {k: [] for k in range(8)}
        for cta in range(132):
            pb.interior_phases(t, cta, wg, phases, 7)
        if not phases[1]:
            print("no interior tiles probed")
            return
        whole = [sum(v) for v in zip(*(phases[k] for k in range(8)))]
        print(f" consumer {wg}: {len(phases[1])} tiles, cycles a tile: median {statistics.median(whole):.0f}")
        for k in range(1, 8):
            v = phases[k]
            print(f"  {points[k - 1]:>17} -> {points[k]:<17} median {statistics.median(v):6.0f}  "
                  f"p10 {np.percentile(v, 10):6.0f}  p90 {np.percentile(v, 90):6.0f}")
        v = phases[0]
        print(f"  {points[7]:>17} -> {'next tile':<17} median {statistics.median(v):6.0f}  "
              f"p10 {np.percentile(v, 10):6.0f}  p90 {np.percentile(v, 90):6.0f}")


def main():
    args = sys.argv[1:]
    patch, points = "tile_timeline", pb.TILE_POINTS
    if "--first-s" in args:
        patch, points = "tile_timeline_s", pb.TILE_POINTS_S
    if "--epilogue" in args:
        patch, points = "tile_timeline_e", pb.TILE_POINTS_E
    build = pb.LabAttentionBuild(patch=patch)
    for name in [a for a in args if not a.startswith("--")] or ["64x256"]:
        timeline(name, build, points)


if __name__ == "__main__":
    main()
