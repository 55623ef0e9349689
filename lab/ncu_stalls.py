"""Sums the warp-stall samples of an Nsight Compute SASS export (lab/ncu_attention.sh writes
$OUT/ncu_<set>_sass.csv) by stall reason and by opcode: where a kernel's warps wait, and on what.

python lab/ncu_stalls.py $OUT/ncu_4x4096_sass.csv [--top 16]"""
import argparse
import collections
import csv
import re


def main():
    p = argparse.ArgumentParser()
    p.add_argument("csv")
    p.add_argument("--top", type=int, default=16)
    args = p.parse_args()
    rows = list(csv.reader(open(args.csv)))
    header = next(r for r in rows if "Source" in r and "Address" in r)
    col = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    by_reason, by_op = collections.Counter(), collections.defaultdict(collections.Counter)
    for r in rows[rows.index(header) + 1:]:
        if len(r) < len(header):
            continue
        m = re.match(r"\s*(@!?U?P\w+\s+)?([A-Z0-9_]+)", r[col["Source"]])
        op = m.group(2) if m else "?"
        for reason in reasons:
            n = int(r[col[reason]] or 0)
            by_reason[reason[6:]] += n
            by_op[op][reason[6:]] += n
    total = sum(by_reason.values()) or 1
    print(f"{total} samples")
    for reason, n in by_reason.most_common():
        if n:
            print(f"  {reason:20s} {100 * n / total:5.1f}%")
    ops = sorted(by_op.items(), key=lambda kv: -sum(kv[1].values()))[:args.top]
    for op, c in ops:
        top = ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in c.most_common(3) if v)
        print(f"{op:12s} {100 * sum(c.values()) / total:5.1f}%  ({top})")


if __name__ == "__main__":
    main()
