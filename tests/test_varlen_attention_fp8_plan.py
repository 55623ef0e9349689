"""The attention segment plan: every (query tile, head) once, longest segments first, each row with
its segment's query end and first key block, cached."""
import numpy as np

from h3kernels._launch import varlen_attention_fp8_plan as P


def test_plan_covers_every_query_tile_and_head_once_longest_first():
    cu = [0, 0, 1, 128, 256, 385, 4481, 4481]  # lengths 0, 1, 127, 128, 129, 4096, 0
    tiles, block_offset = P.plan_host(cu, 3)
    lens = np.diff(cu)
    want = sum(-(-int(n) // 128) for n in lens) * 3
    assert tiles.shape == (want, P.TILE_COLS) and tiles.dtype == np.int32
    assert len({tuple(r) for r in tiles.tolist()}) == want
    assert list(tiles[:, 1]) == sorted(tiles[:, 1], reverse=True)
    segments = {(a, b - a) for a, b in zip(cu, cu[1:])}
    assert block_offset.tolist() == [0, 0, 1, 2, 3, 5, 37, 37]
    for start, length, q0, head, seg, end, kb0 in tiles.tolist():
        assert (start, length) in segments and (cu[seg], cu[seg + 1]) == (start, start + length)
        assert start <= q0 < start + length and 0 <= head < 3
        assert end == cu[seg + 1] and kb0 == block_offset[seg]
    # within a segment, a head's query tiles are consecutive (they share its K and V in L2)
    long = tiles[tiles[:, 1] == 4096]
    assert long[:32, 3].tolist() == [0] * 32 and long[:32, 2].tolist() == list(range(385, 4481, 128))


def test_plan_is_cached_per_content_and_heads():
    a = P.plan_host([0, 10, 300], 56)
    assert P.plan_host((0, 10, 300), 56) is a
    assert P.plan_host([0, 10, 300], 8) is not a


def test_empty_input_gives_an_empty_plan():
    tiles, block_offset = P.plan_host([0], 56)
    assert tiles.shape == (0, P.TILE_COLS) and block_offset.tolist() == [0]
