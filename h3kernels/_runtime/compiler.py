"""Kernel loader: cuda_src/*.cu -> NVRTC cubin per arch -> CuPy module, cached in memory and on disk.

NVRTC is called directly (CuPy's binding, else cuda-python's), so compiling needs no GPU;
only loading does. The cache key covers the NVRTC version, the options and the text of the
source and of every file it includes. The disk cache lives under $H3KERNELS_CACHE_DIR, else
$XDG_CACHE_HOME/h3kernels, else ~/.cache/h3kernels; nothing is ever written inside the package.
"""
import functools
import hashlib
import os
import re
import tempfile
import threading
from pathlib import Path

ARCH_BY_CC = {(12, 0): "sm_120a", (9, 0): "sm_90", (8, 9): "sm_89"}
MMA_FORMS = {"sm_120a": (0, 1, 2), "sm_90": (0,), "sm_89": (0,)}
BASE_OPTIONS = ("-std=c++17", "-default-device", "-lineinfo")
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

_lock = threading.RLock()  # get_function holds it while compile_cubin takes it again
_modules = {}
_functions = {}  # one CuPy Function per (module, kernel): each get_function is a driver call


class CompileError(RuntimeError):
    pass


def source_dir():
    """cuda_src/ of an installed package (h3kernels/cuda_src) or of a source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "cuda_src", here.parent.parent / "cuda_src"):
        if candidate.is_dir() and any(candidate.glob("*.cu")):
            return candidate
    raise FileNotFoundError(f"no cuda_src/ with .cu files beside {here}")


def sources():
    return sorted(p.stem for p in source_dir().glob("*.cu"))


def cache_dir():
    root = os.environ.get("H3KERNELS_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "h3kernels"


def arch_for(cc):
    cc = tuple(cc)
    if cc in ARCH_BY_CC:  # exact: an sm_120a cubin loads on compute capability 12.0 only
        return ARCH_BY_CC[cc]
    supported = ", ".join(f"sm_{a}{b}" for a, b in ARCH_BY_CC)
    raise ValueError(f"device: compute capability {cc[0]}.{cc[1]} is not supported; need one of {supported}")


def read_with_includes(name):
    """(main text, {include name: text}) for cuda_src/<name>.cu, includes resolved recursively."""
    root = source_dir()
    main = (root / f"{name}.cu").read_text()
    headers, todo = {}, _INCLUDE.findall(main)
    while todo:
        inc = todo.pop()
        if inc in headers:
            continue
        path = root / inc
        if not path.is_file():
            raise CompileError(f"{name}.cu includes {inc!r}, which is not in {root}")
        headers[inc] = path.read_text()
        todo.extend(_INCLUDE.findall(headers[inc]))
    return main, headers


def options_for(arch, defines=None, extra=()):
    opts = [f"-arch={arch}", *BASE_OPTIONS]
    opts += [f"-D{k}={v}" for k, v in sorted((defines or {}).items())]
    return tuple(opts) + tuple(extra)


class _Nvrtc:
    """The smallest NVRTC surface we need: CuPy's binding (the NVRTC that matches the CuPy in
    use) unless backend='cuda-python' asks for cuda-python's, which is also the fallback."""

    def __init__(self, backend=None):
        self._cupy = None
        if backend != "cuda-python":
            try:
                from cupy_backends.cuda.libs import nvrtc

                self._cupy, self.version = nvrtc, tuple(nvrtc.getVersion())
                return
            except Exception:
                pass
        from cuda.bindings import nvrtc

        self._cb = nvrtc
        self.version = tuple(nvrtc.nvrtcVersion()[1:])

    def compile(self, text, name, headers, options):
        """Returns (cubin bytes, log); raises CompileError with the log on failure."""
        if self._cupy is not None:
            nv = self._cupy
            prog = nv.createProgram(text, name, [h.encode() for h in headers.values()],
                                    [h.encode() for h in headers])
            try:
                try:
                    nv.compileProgram(prog, list(options))
                except nv.NVRTCError as err:
                    raise CompileError(f"{name}: {err}\n{nv.getProgramLog(prog)}") from None
                return nv.getCUBIN(prog), nv.getProgramLog(prog)
            finally:
                nv.destroyProgram(prog)
        nv = self._cb
        enc = [h.encode() for h in headers.values()], [h.encode() for h in headers]
        err, prog = nv.nvrtcCreateProgram(text.encode(), name.encode(), len(headers), *enc)
        opts = [o.encode() for o in options]
        (err,) = nv.nvrtcCompileProgram(prog, len(opts), opts)
        _, size = nv.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nv.nvrtcGetProgramLog(prog, log)
        log = log.rstrip(b"\0 ").decode(errors="replace")
        if err != nv.nvrtcResult.NVRTC_SUCCESS:
            nv.nvrtcDestroyProgram(prog)
            raise CompileError(f"{name}: {err}\n{log}")
        _, size = nv.nvrtcGetCUBINSize(prog)
        cubin = b" " * size
        nv.nvrtcGetCUBIN(prog, cubin)
        nv.nvrtcDestroyProgram(prog)
        return cubin, log


_nvrtc = {}


def nvrtc(backend=None):
    with _lock:
        if backend not in _nvrtc:
            _nvrtc[backend] = _Nvrtc(backend)
        return _nvrtc[backend]


def cache_key(name, options, backend=None):
    main, headers = read_with_includes(name)
    h = hashlib.sha256()
    for part in (repr(nvrtc(backend).version), name, repr(options), main, *sorted(headers.items())):
        h.update(repr(part).encode())
    return h.hexdigest()[:32]


def compile_cubin(name, arch, defines=None, extra=(), use_cache=True, backend=None):
    """cuda_src/<name>.cu -> (cubin, log, cache key), through the disk cache."""
    options = options_for(arch, defines, extra)
    key = cache_key(name, options, backend)
    path = cache_dir() / f"{name}-{arch}-{key}.cubin"
    if use_cache and path.is_file():
        return path.read_bytes(), "", key
    main, headers = read_with_includes(name)
    cubin, log = nvrtc(backend).compile(main, f"{name}.cu", headers, options)
    if not use_cache:
        return cubin, log, key
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        os.replace(tmp, path)  # atomic: a concurrent reader sees all or nothing
    except OSError:
        pass  # a read-only cache only costs a recompile
    return cubin, log, key


@functools.lru_cache(maxsize=None)
def device_properties(device_id):
    """cudaGetDeviceProperties, once per device: it is slow and launches need it every call."""
    import cupy

    props = dict(cupy.cuda.runtime.getDeviceProperties(device_id))
    if isinstance(props.get("name"), bytes):
        props["name"] = props["name"].decode()
    return props


def device_cc(device_id):
    props = device_properties(device_id)
    return props["major"], props["minor"]


def get_function(name, kernel, device_id, defines=None, dynamic_smem=0):
    """The CuPy kernel function `kernel` of cuda_src/<name>.cu for device `device_id`, loaded once.
    dynamic_smem: bytes of dynamic shared memory its launches ask for; above the default 48 KB
    the function's limit is raised once, here (a Module function has no attribute setter)."""
    import cupy

    arch = arch_for(device_cc(device_id))
    defines = dict(defines or {})
    ident = (name, arch, tuple(sorted(defines.items())), device_id)
    with _lock:
        f = _functions.get(ident + (kernel,))
        if f is not None:
            return f
        mod = _modules.get(ident)
        if mod is None:
            cubin, _, _ = compile_cubin(name, arch, defines)
            with cupy.cuda.Device(device_id):
                mod = cupy.cuda.function.Module()
                mod.load(cubin)
            _modules[ident] = mod
        f = mod.get_function(kernel)
        if dynamic_smem > 48 * 1024:
            from cupy_backends.cuda.api import driver

            with cupy.cuda.Device(device_id):
                driver.funcSetAttribute(f.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic_smem)
        _functions[ident + (kernel,)] = f
        return f


def cache_usage():
    """(directory, files, bytes) of the disk cache."""
    d = cache_dir()
    files = list(d.glob("*.cubin")) if d.is_dir() else []
    return d, len(files), sum(f.stat().st_size for f in files)
