"""The command line's size grammar, one for every command that takes segments.

A segment set is comma-separated segment lengths, `4096,4096,4096,4096`; `NxK` stands for K
segments of N tokens, so `4096x4` is the same set and `1024x2,0,512` is [1024, 1024, 0, 512].
Several sets are separated by spaces: `--segments 4096x4 16384`.
"""
import argparse

# The CPU demo runs h3kernels.reference, which is written for clarity, not speed (on two cores:
# 14-20 s for the random weights and their e4m3 forms, 7-10 s per MLP size plus about 60 ms a
# row, 13 s for one 1024-token segment of 56 heads). Beyond these sizes it would take minutes,
# so it refuses them (exit 2).
CPU_MAX_ROWS = 256
CPU_MAX_KEY_PAIRS = 2 * 1024 * 1024  # sum of squared segment lengths: two segments of 1024


def segment_set(text):
    """argparse type: '4096,4096' or '4096x2' -> [4096, 4096]."""
    lengths = []
    for item in text.split(","):
        n, _, count = item.strip().partition("x")
        try:
            n, count = int(n), int(count) if count else 1
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a segment set: give comma-separated lengths such as 4096,4096,0,512, "
                f"NxK for K segments of N (4096x4), and separate sets by spaces") from None
        if n < 0 or count < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: segment lengths must be >= 0 and counts (xK) >= 1")
        lengths += [n] * count
    if not sum(lengths):
        raise argparse.ArgumentTypeError(f"{text!r}: a segment set needs at least one token")
    return lengths


def positive_rows(text):
    """argparse type: MLP rows M, a positive integer."""
    try:
        m = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"rows must be an integer, got {text!r}") from None
    if m < 1:
        raise argparse.ArgumentTypeError(f"rows must be >= 1, got {m}")
    return m


def set_name(lengths):
    """[4096] * 4 -> '4x4096'; ragged sets join their lengths with '+'."""
    if len(set(lengths)) == 1:
        return f"{len(lengths)}x{lengths[0]}"
    return "+".join(str(n) for n in lengths)


def cpu_size_problem(rows, sets):
    """Why these sizes are too large for the CPU reference, or None."""
    if max(rows, default=0) > CPU_MAX_ROWS:
        return (f"--rows {max(rows)} is too large for the CPU reference (at most {CPU_MAX_ROWS} rows without a GPU)")
    for s in sets:
        pairs = sum(n * n for n in s)
        if pairs > CPU_MAX_KEY_PAIRS:
            return (f"--segments {','.join(map(str, s))} is too large for the CPU reference (the sum of squared "
                    f"segment lengths is {pairs}; at most {CPU_MAX_KEY_PAIRS} without a GPU, e.g. 1024x2)")
    return None
