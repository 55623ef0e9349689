"""The segment plan of minimax_h3_varlen_attention_fp8: its work tiles, longest segment first.

A work tile is (segment start, segment length, first query of a 128-query tile, head, segment
index); the index finds the segment's K scale blocks (block_offset), its V columns and s_v. The
persistent attention kernel walks the rows in order, so the longest (most expensive) tiles go
first and the short ones fill the tail. Built on the host from cu_seqlens (no device sync when
the caller passes cu_seqlens_host) and cached per (cu_seqlens content, heads, device).
"""
import functools

import numpy as np

from h3kernels.constants import K_BLOCK

Q_TILE = 128
TILE_COLS = 5  # start, length, first query, head, segment (cuda_src/varlen_attention_fp8.cu TILE_INTS)


@functools.lru_cache(maxsize=256)
def _plan_host(cu, heads):
    cu = np.asarray(cu, dtype=np.int64)
    starts, lens = cu[:-1], np.diff(cu)
    order = np.argsort(-lens, kind="stable")  # longest first; equal lengths keep their order
    rows = []
    for s in order:
        # query tiles fastest: the CTAs in flight read the K and V of one (segment, head) from L2,
        # instead of those of up to 132 heads from memory
        for h in range(heads):
            for q0 in range(0, int(lens[s]), Q_TILE):
                rows.append((starts[s], lens[s], starts[s] + q0, h, s))
    tiles = np.array(rows, dtype=np.int32).reshape(-1, TILE_COLS)
    # first K scale block of each segment: blocks are numbered segment after segment
    blocks = -(-lens // K_BLOCK)
    block_offset = np.concatenate([[0], np.cumsum(blocks)]).astype(np.int32)
    return tiles, block_offset


def plan_host(cu_seqlens_host, heads):
    """(tiles int32 [n, 5], block_offset int32 [segments + 1]) on the host."""
    return _plan_host(tuple(int(c) for c in cu_seqlens_host), int(heads))


@functools.lru_cache(maxsize=256)
def _plan_device(cu, heads, device):
    import torch

    tiles, block_offset = _plan_host(cu, heads)
    return (torch.from_numpy(tiles).to(device, non_blocking=True),
            torch.from_numpy(block_offset).to(device, non_blocking=True))


def plan_on_device(cu_seqlens_host, heads, device):
    """The plan as torch int32 tensors on `device`, uploaded once per distinct plan."""
    return _plan_device(tuple(int(c) for c in cu_seqlens_host), int(heads), str(device))
