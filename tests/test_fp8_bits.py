"""The raw-bit conversions of the Numba kernels, exhaustively against torch (the reference's)."""
import numpy as np
import pytest
import torch

from h3kernels import reference as R
from h3kernels.fp8_bits import host


def torch_bf16_bits(f32):
    return torch.from_numpy(f32).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def torch_e4m3_bits(f32):
    return R.e4m3(torch.from_numpy(f32)).view(torch.uint8).numpy()


def run(fn, f32):
    return np.array([fn(v) for v in f32], dtype=np.int64)


def test_bf16_every_pattern_decodes_and_reencodes():
    bits = np.arange(1 << 16, dtype=np.uint32)
    f = (bits << 16).view(np.float32)
    decoded = np.array([host.f32_from_bf16(b) for b in bits.astype(np.uint16)], dtype=np.float32)
    assert np.array_equal(decoded.view(np.uint32), bits << 16)
    mine = run(host.bf16_from_f32, f)
    nan = np.isnan(f)
    assert np.array_equal(mine[~nan], bits[~nan])
    assert np.isnan((mine[nan].astype(np.uint32) << 16).view(np.float32)).all()


def test_bf16_rounding_at_midpoints_and_neighbours_matches_torch():
    base = np.arange(1 << 16, dtype=np.uint32) << 16
    cand = np.concatenate([base | 0x8000, (base | 0x8000) - 1, (base | 0x8000) + 1, base | 0x7FFF,
                           base | 0x0001, base | 0xFFFF,
                           np.random.default_rng().integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32)])
    f = cand.view(np.float32)
    keep = ~np.isnan(f)
    f = f[keep]
    assert np.array_equal(run(host.bf16_from_f32, f), torch_bf16_bits(f).astype(np.int64))


E4M3_VALUES = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()


def test_e4m3_every_code_round_trips():
    codes = np.arange(256)
    finite = ~np.isnan(E4M3_VALUES)
    assert np.array_equal(run(host.e4m3_from_f32, E4M3_VALUES[finite]), codes[finite])
    assert np.array_equal(torch_e4m3_bits(E4M3_VALUES[finite]).astype(np.int64), codes[finite])
    nan_codes = run(host.e4m3_from_f32, E4M3_VALUES[~finite])
    assert set(nan_codes & 0x7F) == {0x7F}


def test_e4m3_midpoints_round_to_even_and_neighbours_to_nearest():
    pos = E4M3_VALUES[:0x7F]  # codes 0x00..0x7E: +0 up to 448, ascending
    lo, hi = pos[:-1], pos[1:]
    mid = ((lo.astype(np.float64) + hi) / 2).astype(np.float32)  # exact in f32
    below, above = np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(1000))
    for sign in (1, -1):
        for vals in (mid, below, above):
            v = (sign * vals).astype(np.float32)
            mine = run(host.e4m3_from_f32, v)
            assert np.array_equal(mine, torch_e4m3_bits(v).astype(np.int64))
    lo_code = run(host.e4m3_from_f32, lo)
    got = run(host.e4m3_from_f32, mid)
    even = np.where(lo_code % 2 == 0, lo_code, lo_code + 1)
    assert np.array_equal(got, even)
    assert np.array_equal(run(host.e4m3_from_f32, below), lo_code)
    assert np.array_equal(run(host.e4m3_from_f32, above), lo_code + 1)


@pytest.mark.parametrize("value,code", [
    (448.0, 0x7E), (449.0, 0x7E), (463.99, 0x7E), (464.0, 0x7E), (480.0, 0x7E), (1e30, 0x7E),
    (float("inf"), 0x7E), (-448.0, 0xFE), (-1e30, 0xFE), (float("-inf"), 0xFE),
    (0.0, 0x00), (-0.0, 0x80),
    (2.0 ** -9, 0x01), (2.0 ** -10, 0x00), (3 * 2.0 ** -10, 0x02), (2.0 ** -10 * 1.0001, 0x01),
    (7 * 2.0 ** -9, 0x07), (7.5 * 2.0 ** -9, 0x08), (2.0 ** -6, 0x08), (1e-40, 0x00), (-1e-45, 0x80),
])
def test_e4m3_saturation_zero_and_subnormals(value, code):
    v = np.array([value], dtype=np.float32)
    assert host.e4m3_from_f32(v[0]) == code
    assert int(torch_e4m3_bits(v)[0]) == code


def test_e4m3_random_values_match_torch():
    rng = np.random.default_rng()
    v = (rng.standard_normal(100_000) * 2.0 ** rng.integers(-14, 10, 100_000)).astype(np.float32)
    assert np.array_equal(run(host.e4m3_from_f32, v), torch_e4m3_bits(v).astype(np.int64))


def test_reciprocal_fast_path_gives_the_same_e4m3_codes():
    """The row kernel converts a * RN(1/s) instead of RN(a / s) unless near_e4m3_midpoint says
    the two could differ. Check the claim on 4M random (a, s) pairs of the kernel's kind."""
    from h3kernels.fp8_bits import near_e4m3_midpoint

    rng = np.random.default_rng()
    a = torch.from_numpy(rng.standard_normal((512, 8192)).astype(np.float32) * 3).bfloat16().float()
    s = a.abs().amax(dim=1, keepdim=True) / 448.0
    exact = a / s
    inv = torch.ones_like(s) / s
    fast = a * inv
    ulps = (exact.view(torch.int32).long() - fast.view(torch.int32).long()).abs()
    assert ulps[exact != 0].max() <= 3
    qf = fast.numpy().ravel()
    unsure = np.array([near_e4m3_midpoint(v) for v in qf[:200_000]])
    bits = fast.view(torch.int32).numpy().ravel()
    vec_unsure = (((bits - 0x7FFFC) & 0xFFFFF) <= 8) | (np.abs(qf) < 2.0 ** -6)
    assert np.array_equal(vec_unsure[:200_000], unsure)
    # How often the kernel falls back to division: bf16 values have 8-bit mantissas, so a row's
    # quotients take few distinct mantissas and some sit exactly on e4m3 midpoints. Over all 4M
    # values the rate is 0.48% (max 0.61% over 20 seeds); a 200k prefix swings past 1%.
    assert vec_unsure.mean() < 0.01
    sure = ~vec_unsure
    want = R.e4m3(exact).view(torch.uint8).numpy().ravel()
    got = R.e4m3(fast).view(torch.uint8).numpy().ravel()
    assert np.array_equal(got[sure], want[sure])
