"""Prints, per Numba kernel, the .param widths (bits) of the PTX .entry numba-cuda emits and the
widths of the flattened launch parameters h3kernels._launch.numba_ptx builds, as JSON. Run by
tests/test_launch.py in a subprocess with the CUDA simulator off; needs NVVM, no GPU."""
import json
import re
import sys

from h3kernels._launch import numba_ptx
from h3kernels._runtime.launcher import PARAM_CODES

_PARAM = re.compile(r"\.param\s+\.(?:align\s+\d+\s+)?\.?([busf])(\d+)")
_WIDTH = {"u64": 64, "i64": 64, "u32": 32, "i32": 32, "f32": 32, "map": 1024}


def entry_params(ptx):
    start = ptx.index(".entry")
    body = ptx[start:ptx.index(")", start)]
    return [int(bits) for _, bits in _PARAM.findall(body)]


def main():
    assert set(_WIDTH) == set(PARAM_CODES)
    out = {}
    for name in numba_ptx.SIGNATURES:
        text = numba_ptx.ptx(name, (12, 0))
        out[name] = dict(ptx=entry_params(text), ours=[_WIDTH[p] for p in numba_ptx.params(name)],
                         entry=numba_ptx.entry_name(text)[:40])
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
