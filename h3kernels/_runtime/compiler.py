"""Kernel images and their loader: cuda_src/*.cu -> NVRTC cubin per arch, and the PTX of the
Numba kernels (h3kernels._launch.numba_ptx), both cached on disk, loaded as driver modules once
per device, and handed out as `launcher.Kernel`s.

NVRTC is called directly (CuPy's binding, else cuda-python's), so compiling needs no GPU;
only loading does. The cache key covers the NVRTC version, the options and the text of the
source and of every file it includes. The disk cache lives under $H3KERNELS_CACHE_DIR, else
$XDG_CACHE_HOME/h3kernels, else ~/.cache/h3kernels; nothing is ever written inside the package.
"""
import dataclasses
import hashlib
import os
import re
import tempfile
import threading
from pathlib import Path

from h3kernels._runtime.targets import device_arch

BASE_OPTIONS = ("-std=c++17", "-default-device", "-lineinfo")
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

_lock = threading.RLock()  # kernel() holds it while compile_cubin takes it again
_modules = {}  # (image identity, device id) -> CuPy Module
_kernels = {}  # (image identity, device id, kernel) -> launcher.Kernel
_caches = [_modules, _kernels]  # what clear_caches() empties: these and the launch modules' own


def cache(d):
    """Registers a launch module's cache of kernels (a dict) with clear_caches(); returns it."""
    _caches.append(d)
    return d


def clear_caches():
    """Forgets every loaded module and kernel (the disk cache stays): the next launches load again."""
    with _lock:
        for d in _caches:
            d.clear()


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
        return self._build(text, name, headers, options, "CUBIN")

    def ptx(self, text, name, headers, options):
        """The PTX of a compute_XX build; raises CompileError with the log on failure."""
        ptx, _ = self._build(text, name, headers, options, "PTX")
        ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
        return ptx.rstrip("\0 ")

    def _build(self, text, name, headers, options, output):
        """(the program's CUBIN or PTX, log) from one NVRTC program, destroyed afterwards."""
        if self._cupy is not None:
            nv = self._cupy
            prog = nv.createProgram(text, name, [h.encode() for h in headers.values()],
                                    [h.encode() for h in headers])
            try:
                try:
                    nv.compileProgram(prog, list(options))
                except nv.NVRTCError as err:
                    raise CompileError(f"{name}: {err}\n{nv.getProgramLog(prog)}") from None
                image = getattr(nv, f"get{output}")(prog)
                if output == "CUBIN":  # CuPy's binding drops the image's last byte (a NUL): the
                    image += b"\0"  # driver loads it without, disassemblers call it an invalid ELF
                return image, nv.getProgramLog(prog)
            finally:
                nv.destroyProgram(prog)
        nv = self._cb
        enc = [h.encode() for h in headers.values()], [h.encode() for h in headers]
        err, prog = nv.nvrtcCreateProgram(text.encode(), name.encode(), len(headers), *enc)
        opts = [o.encode() for o in options]
        try:
            (err,) = nv.nvrtcCompileProgram(prog, len(opts), opts)
            _, size = nv.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            nv.nvrtcGetProgramLog(prog, log)
            log = log.rstrip(b"\0 ").decode(errors="replace")
            if err != nv.nvrtcResult.NVRTC_SUCCESS:
                raise CompileError(f"{name}: {err}\n{log}")
            _, size = getattr(nv, f"nvrtcGet{output}Size")(prog)
            image = b" " * size
            getattr(nv, f"nvrtcGet{output}")(prog, image)
            return image, log
        finally:
            nv.nvrtcDestroyProgram(prog)


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


def compile_cubin(name, arch, defines=None, extra=(), use_cache=True, backend=None, appended=""):
    """cuda_src/<name>.cu -> (cubin, log, cache key), through the disk cache. `appended`: text
    added after the source (uncached builds only)."""
    options = options_for(arch, defines, extra)
    key = cache_key(name, options, backend)
    path = cache_dir() / f"{name}-{arch}-{key}.cubin"
    if use_cache and path.is_file():
        return path.read_bytes(), "", key
    assert not (use_cache and appended), "a cached build is the source as it is"
    main, headers = read_with_includes(name)
    cubin, log = nvrtc(backend).compile(main + appended, f"{name}.cu", headers, options)
    if use_cache:
        write_cache(path, cubin)
    return cubin, log, key


def compile_ptx(name, arch, defines=None):
    """cuda_src/<name>.cu -> its PTX for `arch` (sm_90a: compute_90a), uncached: for checks that
    read the program before ptxas (h3kernels.testing.ptx_checks)."""
    options = tuple(o.replace("-arch=sm_", "-arch=compute_") for o in options_for(arch, defines))
    main, headers = read_with_includes(name)
    return nvrtc().ptx(main, f"{name}.cu", headers, options)


def write_cache(path, data):
    """Writes a cache file atomically: a concurrent reader sees all of it or nothing."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs a recompile


def load_kernel(ident, image, kernel, device_id, params, dynamic_smem=0):
    """The launcher.Kernel for `kernel` of a module image (cubin, or NUL-terminated PTX), loaded
    once per (ident, device): `image` is a function that returns the bytes, called on the first
    load only. params: the kernel's parameter formats (launcher.Kernel). dynamic_smem: bytes of
    dynamic shared memory its launches ask for; above the default 48 KB the function's limit is
    raised once, here."""
    k = _kernels.get((ident, device_id, kernel))
    if k is not None:
        return k
    import cupy
    from cupy_backends.cuda.api import driver

    from h3kernels._runtime import launcher

    with _lock:
        k = _kernels.get((ident, device_id, kernel))
        if k is not None:
            return k
        with cupy.cuda.Device(device_id):
            mod = _modules.get((ident, device_id))
            if mod is None:
                mod = cupy.cuda.function.Module()
                mod.load(image())
                _modules[(ident, device_id)] = mod
            f = mod.get_function(kernel)
            if dynamic_smem > 48 * 1024:
                driver.funcSetAttribute(f.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic_smem)
            k = launcher.Kernel(f, device_id, params, dynamic_smem)
        _kernels[(ident, device_id, kernel)] = k
        return k


def kernel(source, name, arch, config, device_id):
    """The one loader of the NVRTC kernels: kernel `name` of cuda_src/<source>.cu built for `arch`
    with `config`, loaded on device `device_id` (once; later calls return the same Kernel).

    `config` is a build as a value, hashable (a frozen dataclass): config.defines() gives the -D
    constants of the build, config.kernel_params(name) the kernel's parameters (a
    launcher.ParamStruct, a tuple of formats, or None for a kernel launched through CuPy) and
    config.dynamic_smem(name) its dynamic shared memory bytes."""
    key = (source, name, arch, config, device_id)
    k = _loaded.get(key)
    if k is None:
        defines = config.defines()
        ident = ("nvrtc", source, arch, tuple(sorted(defines.items())))
        k = load_kernel(ident, lambda: compile_cubin(source, arch, defines)[0], name, device_id,
                        config.kernel_params(name), config.dynamic_smem(name))
        _loaded[key] = k
    return k


_loaded = cache({})  # (source, name, arch, config, device id) -> Kernel


@dataclasses.dataclass(frozen=True)
class PlainBuild:
    """A build given by its -D constants alone ((name, value) pairs), of kernels launched
    through CuPy: the peers and the tests of single kernels."""
    constants: tuple = ()

    def defines(self):
        return dict(self.constants)

    def kernel_params(self, name):
        return None

    def dynamic_smem(self, name):
        return 0


def get_function(source, kernel_name, device_id, defines=None):
    """The CuPy Function of `kernel_name` of cuda_src/<source>.cu built for the device's arch
    with the -D constants `defines` (for callers that launch through CuPy)."""
    build = PlainBuild(tuple(sorted((defines or {}).items())))
    return kernel(source, kernel_name, device_arch(device_id), build, device_id).function


def cache_usage():
    """(directory, files, bytes) of the disk cache."""
    d = cache_dir()
    files = [f for f in d.iterdir() if f.suffix in (".cubin", ".ptx")] if d.is_dir() else []
    return d, len(files), sum(f.stat().st_size for f in files)
