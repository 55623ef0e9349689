"""Where the tokens of a packed sequence live when it is spread over ranks: rank r holds the
contiguous global range [starts[r], starts[r] + counts[r]); a segment may cross rank boundaries
and a rank may hold no token."""
import itertools


def starts(counts):
    """Each rank's first global token."""
    return tuple(itertools.accumulate((0, *counts[:-1])))


def local_seqlens(cu, start, count):
    """cu_seqlens of the tokens [start, start + count) with the same number of segments as the
    global cu (segment i of the result is segment i clipped to the range, possibly empty), so
    that segment indices agree across ranks."""
    end = start + count
    return tuple(min(max(c, start), end) - start for c in cu)


def segments_meeting(cu_q, cu_k):
    """Whether any segment has both queries in cu_q and keys in cu_k."""
    return any(qb > qa and kb > ka for qa, qb, ka, kb in zip(cu_q, cu_q[1:], cu_k, cu_k[1:]))


def crossing_segments(cu, counts):
    """Indices of the segments whose tokens lie on more than one rank."""
    bounds = set(itertools.accumulate(counts))
    return tuple(i for i, (a, b) in enumerate(zip(cu, cu[1:])) if any(a < x < b for x in bounds))


def block_bases(cu, block=128):
    """The number of the first 128-key block of each segment when the blocks of every segment
    (from its start) are numbered segment after segment; the last entry is the total."""
    return tuple(itertools.accumulate((0, *(-(-(b - a) // block) for a, b in zip(cu, cu[1:])))))
