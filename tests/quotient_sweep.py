"""The row kernel's division-free quotient (fp8_bits.make_quotient) against RN(a / s), vectorized:
q = RN(a * inv), r = RN(a - s * q) (exact, as an FMA), q' = RN(q + r * inv) (one rounding, as
an FMA), with inv = RN(1 / s), s = RN(amax / 448). For every bf16 amax and every bf16 a with
|a| <= amax, e4m3(q') must equal e4m3(RN(a / s)) wherever s >= MIN_FAST_SCALE.

python tests/quotient_sweep.py   (all 1.04e9 pairs, about a minute; tests use a sample)"""
import numpy as np

F32, F64 = np.float32, np.float64


def rn32_of_sum(x, p):
    """RN32(x + p) of float64 arrays, exactly: TwoSum, then the exact remainder breaks the one
    case where rounding the float64 sum could differ, a sum exactly halfway between floats."""
    t = x + p
    b = t - x
    e = (x - (t - b)) + (p - b)
    r = t.astype(F32)
    lo = np.where(r.astype(F64) <= t, r, np.nextafter(r, F32(-np.inf)))
    hi = np.nextafter(lo, F32(np.inf))
    tie = (t == (lo.astype(F64) + hi.astype(F64)) / 2) & (e != 0) & np.isfinite(hi)
    return np.where(tie, np.where(e > 0, hi, lo), r)


def e4m3_codes(v):
    import torch

    return torch.from_numpy(np.clip(v, -448, 448).astype(F32)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def sweep(amaxes, min_scale):
    """(pairs checked, e4m3 codes that differ) over the given positive bf16 amax values (float32)."""
    mant = np.arange(128, dtype=np.uint32) << 16
    pairs = bad = 0
    for amax in np.asarray(amaxes, dtype=F32):
        s = amax / F32(448)
        if not s >= F32(min_scale):
            continue
        inv = F32(1) / s
        top = int(amax.view(np.uint32) >> 23)
        a = ((np.arange(top + 1, dtype=np.uint32)[:, None] << 23) | mant[None, :]).view(F32).ravel()
        a = a[a <= amax]
        a = np.concatenate([a, -a])
        q = a * inv
        with np.errstate(over="ignore"):
            r = (a.astype(F64) - s.astype(F64) * q.astype(F64)).astype(F32)  # exact before rounding
        fast = np.where(r == 0, q, rn32_of_sum(q.astype(F64), r.astype(F64) * inv.astype(F64)))
        pairs += a.size
        bad += int((e4m3_codes(fast) != e4m3_codes(a / s)).sum())
    return pairs, bad


def all_bf16_amax():
    return (np.arange(0x0001, 0x7F80, dtype=np.uint32) << 16).view(F32)


if __name__ == "__main__":
    from h3kernels._launch.numba.fp8_bits import MIN_FAST_SCALE

    pairs, bad = sweep(all_bf16_amax(), MIN_FAST_SCALE)
    print(f"{pairs} (a, amax) pairs with s >= {MIN_FAST_SCALE}: {bad} e4m3 codes differ from e4m3(RN(a / s))")
    raise SystemExit(1 if bad else 0)
