"""The division-free arithmetic of lab/patched_builds.py's q_by_loader, checked on the CPU against
IEEE division (the quantized Q must be the Q pass's bits):

- s = RN(amax / 448) as the product by RN(1 / 448) with one FMA correction: exact on every bf16
  significand (exact rationals; the exponent only scales it while s is normal);
- inv = RN(1 / s) by one Newton step from rcp.approx (at most 1 ulp off, PTX ISA): 1 / s lies far
  enough from every rounding midpoint, on every such significand, for the step's error (about
  2^-45 relative) to round to RN(1 / s);
- div_rn_exact and quotient_rare, the rare rows' integer division, compiled from the patch's own
  text with the host's C compiler: RN(amax / 448) for every finite bf16 amax, and RN(a / s) for
  s = RN(amax / 448) and every bf16 a with |a| <= amax (every amax with --all: about 10^9 pairs,
  minutes; else every 7th), and for an infinite s and every a but a NaN.

    python lab/q_by_loader_check.py [--all]
"""
import math
import subprocess
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from patched_builds import Q_BY_LOADER_C  # noqa: E402


def rn32(x):
    """x (a Fraction in the float32 normal range) rounded to nearest even float32, as a Fraction."""
    if x == 0:
        return Fraction(0)
    sign, x = (1, x) if x > 0 else (-1, -x)
    e = math.floor(math.log2(x))
    e -= Fraction(2) ** e > x
    e += Fraction(2) ** (e + 1) <= x
    ulp = Fraction(2) ** (e - 23)
    q, r = divmod(x, ulp)
    q += r * 2 > ulp or (r * 2 == ulp and q % 2 == 1)
    return sign * q * ulp


def check_scale_and_reciprocal():
    c = rn32(Fraction(1, 448))
    wrong, nearest = 0, 1.0
    for m in range(128, 256):  # every bf16 significand
        amax = Fraction(m, 128)
        s = rn32(amax / 448)
        q = rn32(amax * c)
        wrong += rn32(q + rn32(amax - q * 448) * c) != s
        x = 1 / s
        ulp = Fraction(2) ** (math.floor(math.log2(x)) - 23)
        frac = x / ulp - math.floor(x / ulp)
        nearest = min(nearest, float(abs(frac - Fraction(1, 2)) * ulp / x))
    print(f"s by the product and one correction: {wrong} of 128 significands wrong")
    print(f"1 / s: at least 2^{math.log2(nearest):.1f} (relative) from a rounding midpoint")
    return wrong == 0 and nearest > 2.0 ** -40


HARNESS = r"""
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
typedef uint32_t u32;
#define __device__
#define __forceinline__ static inline
static inline u32 __float_as_uint(float f) { u32 u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(u32 u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __clz(u32 x) { return x ? __builtin_clz(x) : 32; }
static inline int min(int a, int b) { return a < b ? a : b; }
static const float kMinFastScale = 1e-30f;
%(functions)s
static float bf16(u32 h) { return __uint_as_float(h << 16); }
static int same(float a, float b) { return (isnan(a) && isnan(b)) || __float_as_uint(a) == __float_as_uint(b); }
int main(int argc, char** argv) {
  const u32 step = (u32)atoi(argv[1]);
  long long n = 0, wrong_s = 0, wrong = 0;
  for (u32 h = 0; h < 0x7f80; ++h) wrong_s += !same(bf16(h) / 448.0f, div_rn_exact(bf16(h), 448.0f));
  for (u32 hm = 1; hm < 0x7f80; hm += step) {
    const float s = bf16(hm) / 448.0f;
    if (!(s > 0.f)) continue;  /* zero codes, not this path */
    for (u32 ha = 0; ha <= hm; ++ha)
      for (u32 sign = 0; sign <= 0x8000; sign += 0x8000, ++n) {
        const float a = bf16(ha | sign);
        /* RN of the double quotient is RN of the exact one: 53 >= 2 * 24 + 2 */
        wrong += !same((float)((double)a / (double)s), quotient_rare(a, s));
      }
  }
  for (u32 h = 0; h <= 0xffff; ++h)  /* an infinite amax: every a but a NaN (whose row's s is NaN) */
    if (!isnan(bf16(h))) ++n, wrong += !same(bf16(h) / INFINITY, quotient_rare(bf16(h), INFINITY));
  printf("RN(amax / 448): %%lld of 32640 finite bf16 amax wrong\nRN(a / s): %%lld of %%lld pairs wrong\n",
         wrong_s, wrong, n);
  return wrong_s != 0 || wrong != 0;
}
"""


def check_integer_division(every):
    start = Q_BY_LOADER_C.index("// RN(a / s) for a finite a and a normal s > 0")
    end = Q_BY_LOADER_C.index("// e4m3x4_from_bf16x4's codes by quotient_rare")
    source = "#include <stdlib.h>\n" + HARNESS % {"functions": Q_BY_LOADER_C[start:end]}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "check.c").write_text(source)
        subprocess.run(["cc", "-O2", "-o", f"{tmp}/check", f"{tmp}/check.c", "-lm"], check=True)
        return subprocess.run([f"{tmp}/check", str(every)]).returncode == 0


if __name__ == "__main__":
    ok = check_scale_and_reciprocal()
    ok = check_integer_division(1 if "--all" in sys.argv else 7) and ok
    print("ok" if ok else "FAILED")
    sys.exit(0 if ok else 1)
