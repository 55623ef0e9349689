"""The Numba kernels on the common launch path: each compiled once per (compute capability,
constants) to PTX by numba-cuda, cached on disk beside the NVRTC cubins, loaded by the same
loader (h3kernels._runtime.compiler) and launched like the CUDA C kernels (launcher.Kernel) on
the caller's raw stream. Numba's own dispatcher, its per-launch typing and argument boxing, and
its context handling stay out of the hot path; with a warm disk cache Numba is not even imported.

Each kernel has a fixed signature (SIGNATURES). A Numba kernel takes an array as its fields,
flattened: meminfo, parent, nitems, itemsize, data, shape..., strides... (bytes), each 64-bit;
`array_values` builds them for a C-contiguous array. tests/test_launch.py checks the
flattened parameter list against the .entry that numba-cuda emits.
"""
import hashlib
import re
import threading
from pathlib import Path

from h3kernels._launch.numba import geometry as G
from h3kernels._runtime import compiler

# kernel -> (module under h3kernels/_launch/numba, index in its kernels() tuple or None for
# kernel(), argument types: (dtype, ndim) for a C-contiguous array, (dtype, ndim, "A") for one
# of any strides (cu_seqlens may be a strided view), a dtype name for a scalar)
_U64_1, _U32_1, _F32_1, _I64_2 = ("uint64", 1), ("uint32", 1), ("float32", 1), ("int64", 2)
SIGNATURES = {
    "row_kernel": ("mlp_fp8_row", None, (("uint64", 2), _U64_1, _U64_1, _U64_1, "int64", "int64", ("int64", 1),
                                         "float32", ("uint32", 2), _F32_1, ("int32", 1))),
    "q_kernel": ("varlen_attention_fp8_quant", 0, (_U64_1, _U32_1, _F32_1, "uint64")),
    "kv_block_kernel": ("varlen_attention_fp8_quant", 1, (_U64_1, _U64_1, _I64_2, _F32_1, "uint64", "uint64")),
    "kv_segment_kernel": ("varlen_attention_fp8_quant", 2, (("int32", 1, "A"), ("int32", 1), ("float32", 4),
                                                            ("float32", 3), ("float32", 3))),
    "k_quant_kernel": ("varlen_attention_fp8_quant", 3, (_U64_1, _F32_1, _I64_2, _U32_1, _F32_1, "uint64")),
    "v_quant_kernel": ("varlen_attention_fp8_quant", 4, (_U64_1, _F32_1, _I64_2, _U32_1, "uint64", "uint64")),
    "kv_segment_sums_kernel": ("varlen_attention_fp8_quant", 5, (("int32", 1), ("float32", 4), ("float32", 3),
                                                                 ("float32", 3))),
    "k_quant_given_kernel": ("varlen_attention_fp8_quant", 6, (_U64_1, _F32_1, _I64_2, _U32_1, _F32_1, "uint64")),
    "k_segment_kernel": ("varlen_attention_fp8_quant", 7, (_U64_1, ("int32", 1, "A"), ("int32", 1), _F32_1, _U32_1,
                                                          _F32_1, "uint64")),
    "v_segment_kernel": ("varlen_attention_fp8_quant", 8, (_U64_1, ("int32", 1, "A"), ("int32", 1), _F32_1, _U32_1,
                                                          "uint64", "uint64")),
}
# (threads per CTA, CTAs per SM) for ptxas (.maxntid, .minnctapersm): a register cap that fits
# that many CTAs. The passes are bound by loads in flight per SM; each cap was checked to leave at
# most a few spilled words (ptxas -v on sm_90).
LAUNCH_BOUNDS = {"q_kernel": (G.Q_THREADS, 5), "k_quant_kernel": (G.QUANT_THREADS, 4),
                 "v_quant_kernel": (G.QUANT_THREADS, 4),
                 "k_quant_given_kernel": (G.QUANT_THREADS, 4),
                 "k_segment_kernel": (G.SEGMENT_THREADS, 2), "v_segment_kernel": (G.SEGMENT_THREADS, 2)}
_SCALAR_PARAM = {"int64": "i64", "uint64": "u64", "int32": "i32", "uint32": "u32", "float32": "f32"}
_ITEMSIZE = {"uint64": 8, "int64": 8, "uint32": 4, "int32": 4, "float32": 4, "uint16": 2, "uint8": 1}
_ENTRY = re.compile(r"\.entry\s+(\S+)\s*\(")

_lock = threading.RLock()
_ptx = {}  # (kernel, cc) -> PTX text
_kernels = compiler.cache({})  # (kernel, device id) -> launcher.Kernel


def params(name):
    """The launch parameter formats of kernel `name`: its arguments flattened as Numba does."""
    out = []
    for arg in SIGNATURES[name][2]:
        if isinstance(arg, tuple):
            out += ["u64"] * (5 + 2 * arg[1])
        else:
            out.append(_SCALAR_PARAM[arg])
    return tuple(out)


def array_values(ptr, shape, itemsize):
    """A C-contiguous array's flattened fields: meminfo, parent, nitems, itemsize, data,
    shape..., strides in bytes...."""
    strides, acc = [], itemsize
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return (0, 0, acc // itemsize, itemsize, ptr, *shape, *reversed(strides))


def vector(ptr, n, itemsize):
    """array_values of a 1-D array (the common case, without the loop)."""
    return (0, 0, n, itemsize, ptr, n, itemsize)


def _sources():
    here = Path(__file__).resolve().parent
    files = [here / "numba" / "fp8_bits.py", here / "numba" / "mlp_fp8_row.py", here / "numba" / "geometry.py",
             here / "numba" / "varlen_attention_fp8_quant.py", here.parent / "constants.py", Path(__file__)]
    return [f.read_text() for f in files]


def cache_key(name, cc):
    from importlib import metadata

    try:
        version = metadata.version("numba-cuda")
    except metadata.PackageNotFoundError:
        version = "numba-cuda ?"
    h = hashlib.sha256()
    for part in (version, name, repr(SIGNATURES[name]), repr(LAUNCH_BOUNDS.get(name)), repr(tuple(cc)), *_sources()):
        h.update(repr(part).encode())
    return h.hexdigest()[:32]


def py_function(name):
    """The Python function of kernel `name` (what numba-cuda compiles)."""
    import importlib

    module, index, _ = SIGNATURES[name]
    mod = importlib.import_module(f"h3kernels._launch.numba.{module}")
    k = mod.kernel() if index is None else mod.kernels()[index]
    return k.py_func


def numba_signature(name):
    import numba
    import numpy as np

    types = []
    for arg in SIGNATURES[name][2]:
        if isinstance(arg, tuple):
            layout = arg[2] if len(arg) > 2 else "C"
            types.append(numba.types.Array(numba.from_dtype(np.dtype(arg[0])), arg[1], layout))
        else:
            types.append(numba.from_dtype(np.dtype(arg)))
    return tuple(types)


def compile_ptx(name, cc):
    """numba-cuda's PTX of kernel `name` for compute capability cc, no GPU needed. The kernels'
    device functions compile for "the current device"; numba is told it is one of cc."""
    from numba import cuda
    from numba.cuda import dispatcher

    fn, sig = py_function(name), numba_signature(name)
    with _lock:
        saved = dispatcher.get_current_device
        dispatcher.get_current_device = lambda: type("Device", (), {"compute_capability": tuple(cc)})()
        try:
            text, _ = cuda.compile_ptx(fn, sig, cc=tuple(cc), launch_bounds=LAUNCH_BOUNDS.get(name))
        finally:
            dispatcher.get_current_device = saved
    return text


def ptx(name, cc, use_cache=True):
    """PTX text of kernel `name` for cc, through the memory and disk caches."""
    cc = tuple(cc)
    text = _ptx.get((name, cc))
    if text is not None:
        return text
    path = compiler.cache_dir() / f"numba-{name}-sm{cc[0]}{cc[1]}-{cache_key(name, cc)}.ptx"
    if use_cache and path.is_file():
        text = path.read_text()
    else:
        text = compile_ptx(name, cc)
        if use_cache:
            compiler.write_cache(path, text.encode())
    _ptx[(name, cc)] = text
    return text


def entry_name(text):
    return _ENTRY.search(text).group(1)


def kernel(name, device_id):
    """The launcher.Kernel of Numba kernel `name` on device `device_id`."""
    k = _kernels.get((name, device_id))
    if k is None:
        from h3kernels._runtime.targets import device_cc

        cc = device_cc(device_id)
        text = ptx(name, cc)
        k = compiler.load_kernel(("numba", name, cc), lambda: text.encode() + b"\0", entry_name(text), device_id,
                                 params(name))
        _kernels[(name, device_id)] = k
    return k
