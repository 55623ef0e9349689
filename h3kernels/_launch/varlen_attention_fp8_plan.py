"""The segment plan of minimax_h3_varlen_attention_fp8: its work tiles, longest segment first.

A work tile is (segment start, segment length, first query of a 128-query tile, head, segment
index, the segment's query end, its first 128-key block). The index finds the segment's s_v and
its query bounds (q_bounds); the last two columns are q_bounds[segment + 1] and
block_offset[segment], so that a kernel reads all it needs of a tile in one round of loads. With
two segmentations (queries of one token range against the keys of another, the ring's step) the
start and length are the keys' (cross_plan_arrays). The persistent attention kernel walks the
rows in order, so the longest (most expensive) tiles go first and the short ones fill the tail.
Built on the host from cu_seqlens (no device sync when the caller passes cu_seqlens_host) and
cached per (cu_seqlens content, heads, device).
"""
import functools

import numpy as np

from h3kernels._launch.numba.geometry import SEGMENT_KEYS
from h3kernels.constants import K_BLOCK

Q_TILE = 128
TILE_COLS = 7  # start, length, first query, head, segment, query end, first key block (TILE_INTS in cuda_src)


@functools.lru_cache(maxsize=256)
def _blocks(cu):
    """The one numbering of the 128-key blocks (K scale blocks, V column blocks), segment after
    segment from each segment's start: (block_offset int32 [segments + 1], blocks int64 [n, 3]
    of (segment, first key, keys))."""
    return grid_blocks(cu, (0,) * (len(cu) - 1))


@functools.lru_cache(maxsize=256)
def grid_blocks(cu, firsts):
    """_blocks of keys in segments cu (a tuple of ints) whose key 0 is key firsts[i] of its whole
    segment i (a tuple of ints): blocks cut where the whole segment's are, every 128 keys from its
    start, so a segment's first block here may be short (the statistics a ring gathers on the
    whole segments' grid). All firsts 0: _blocks."""
    cu = np.asarray(cu, dtype=np.int64)
    starts, ends = cu[:-1], cu[1:]
    lead = np.asarray(firsts, dtype=np.int64).reshape(-1) % K_BLOCK  # keys of the first block's grid block before key 0
    counts = np.where(ends > starts, -(-(lead + ends - starts) // K_BLOCK), 0)
    block_offset = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    seg = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    j = np.arange(int(block_offset[-1]), dtype=np.int64) - block_offset[seg]
    first = starts[seg] + np.maximum(j * K_BLOCK - lead[seg], 0)
    end = np.minimum(ends[seg], starts[seg] + (j + 1) * K_BLOCK - lead[seg])
    return block_offset, np.stack([seg, first, end - first], axis=1).reshape(-1, 3)


@functools.lru_cache(maxsize=256)
def _plan_host(cu, heads):
    cu_arr = np.asarray(cu, dtype=np.int64)
    starts, lens = cu_arr[:-1], np.diff(cu_arr)
    order = np.argsort(-lens, kind="stable")  # longest first; equal lengths keep their order
    block_offset = _blocks(cu)[0]
    rows = []
    for s in order:
        # query tiles fastest: the CTAs in flight read the K and V of one (segment, head) from L2,
        # instead of those of up to 132 heads from memory
        for h in range(heads):
            for q0 in range(0, int(lens[s]), Q_TILE):
                rows.append((starts[s], lens[s], starts[s] + q0, h, s, starts[s] + lens[s], block_offset[s]))
    tiles = np.array(rows, dtype=np.int32).reshape(-1, TILE_COLS)
    return tiles, block_offset


def plan_host(cu_seqlens_host, heads):
    """(tiles int32 [n, TILE_COLS], block_offset int32 [segments + 1]) on the host."""
    return _plan_host(tuple(int(c) for c in cu_seqlens_host), int(heads))


@functools.lru_cache(maxsize=256)
def one_read(cu):
    """Whether every segment of cu (a tuple of ints, as plan_arrays takes) has at most SEGMENT_KEYS
    keys: then the K and V passes read each segment's keys once, in a CTA per segment and head
    (varlen_attention_fp8_quant). Cached: a call asks once per launch."""
    return all(b - a <= SEGMENT_KEYS for a, b in zip(cu, cu[1:]))


def key_blocks(cu_seqlens_host):
    """int64 [n, 3]: (segment, first key, keys) of every 128-key block, in block_offset's numbering."""
    return _blocks(tuple(int(c) for c in cu_seqlens_host))[1]


def plan_arrays(cu, heads):
    """(tiles, block_offset, blocks, q_bounds) for a tuple of ints cu: what the attention
    uploads. q_bounds (int32 [segments + 1]) is cu: each segment's
    queries are its keys."""
    tiles, block_offset = _plan_host(cu, heads)
    return tiles, block_offset, _blocks(cu)[1], np.asarray(cu, dtype=np.int32)


@functools.lru_cache(maxsize=256)
def _cross_plan_host(cu_q, cu_k, heads):
    block_offset = _blocks(cu_k)[0]
    lens_k = np.diff(np.asarray(cu_k, dtype=np.int64))
    lens_q = np.diff(np.asarray(cu_q, dtype=np.int64))
    order = np.argsort(-lens_k, kind="stable")  # a tile's cost grows with its keys
    rows = []
    for s in order:
        if lens_k[s] == 0:
            continue
        for h in range(heads):
            for q0 in range(0, int(lens_q[s]), Q_TILE):
                rows.append((cu_k[s], lens_k[s], cu_q[s] + q0, h, s, cu_q[s + 1], block_offset[s]))
    return np.array(rows, dtype=np.int32).reshape(-1, TILE_COLS)


def cross_plan_arrays(cu_q, cu_k, heads):
    """The plan of queries in segments cu_q against keys in segments cu_k (two tuples of ints,
    one segment count): tiles (key start, key count, first query, head, segment, query end, first
    key block) for the segments that have both, the key blocks of cu_k, and q_bounds = cu_q."""
    block_offset, blocks = _blocks(cu_k)
    return _cross_plan_host(cu_q, cu_k, heads), block_offset, blocks, np.asarray(cu_q, dtype=np.int32)
