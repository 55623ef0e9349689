"""Shared fixtures: the seed of each test's random inputs (named in its failure report), the
module-scoped prepared MLP weights, and the array kinds (torch, CuPy) a test body runs for.

Seeds: a test that draws random inputs takes the `seed` fixture and hands it to the generators
of h3kernels.testing.inputs. Each seed is a hash of the test's node id (or fixture's name) and
of $H3KERNELS_TEST_SEED ("" when unset, so the inputs are the same every run; "random" picks a
new base per run, shown in the header). A failing test's report has a "random inputs" section
with its seeds and the base that reproduces them.

Side effects: the session points the kernel cache and the other tools' state directories (see
STATE_DIRS) at a temporary directory of its own, removed at the end, unless the user set them: the
user's ~/.cache/h3kernels and the working directory are left as they were.

Slow tests: `slow` marks the tests that take long without a GPU (CPU reference at MiniMax-H3 sizes,
the Numba simulator, process groups); there they skip unless pytest is given --runslow. A GPU
machine runs them all."""
import contextlib
import os
import shutil
import tempfile
import zlib

import pytest


# Variables naming where a tool keeps state between runs -> the subdirectory of the session's
# temporary directory they name during the tests.
STATE_DIRS = {
    "H3KERNELS_CACHE_DIR": "h3kernels",  # NVRTC cubins and Numba PTX; else ~/.cache/h3kernels
    "HYPOTHESIS_STORAGE_DIRECTORY": "hypothesis",  # its example database; else ./.hypothesis
    "IPYTHONDIR": "ipython",  # the notebook kernels' profile; else ~/.ipython
    "MPLCONFIGDIR": "matplotlib",  # its font cache; else ~/.cache/matplotlib
    "CUPY_CACHE_DIR": "cupy",  # CuPy's compiled elementwise kernels (GPU); else ~/.cupy/kernel_cache
    "TRITON_CACHE_DIR": "triton",  # torch.compile's GPU kernels; else ~/.triton/cache
    "CUDA_CACHE_PATH": "nv",  # the driver's PTX JIT cache (GPU): the Numba kernels; else ~/.nv/ComputeCache
}
# "dir": the session's temporary directory, "set": the variables it set (those the user had not)
_session_state = {"dir": tempfile.mkdtemp(prefix="h3kernels-tests-"), "set": []}
# Set on import, before torch starts CUDA below (the driver reads CUDA_CACHE_PATH then) and before
# any test module is imported; the commands the tests run inherit them.
for _name, _sub in STATE_DIRS.items():
    if not os.environ.get(_name):
        os.environ[_name] = os.path.join(_session_state["dir"], _sub)
        _session_state["set"].append(_name)


def _has_gpu():
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


HAS_GPU = _has_gpu()
if not HAS_GPU:
    # Without a GPU the Numba kernels run in the simulator. Set before numba is imported.
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

SEED_ENV = "H3KERNELS_TEST_SEED"
SEED_BASE = os.environ.get(SEED_ENV, "")
if SEED_BASE == "random":
    SEED_BASE = str(int.from_bytes(os.urandom(4), "little"))


def seed_for(name):
    """The seed (0 <= seed < 2**31) of the random inputs of the test or fixture `name`."""
    return zlib.crc32(f"{SEED_BASE}:{name}".encode()) & 0x7FFFFFFF


_TEST_SEEDS = pytest.StashKey[dict]()
_FIXTURE_SEEDS = {}  # module-scoped fixture name -> the seed of its current value


def pytest_report_header(config):
    return f"random inputs: {SEED_ENV}={SEED_BASE!r}"


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False,
                     help="also run the tests marked slow, which skip by default on a machine without a GPU")


def pytest_unconfigure(config):
    for name in _session_state["set"]:
        os.environ.pop(name, None)
    shutil.rmtree(_session_state["dir"], ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    slow = pytest.mark.skip(reason="slow without a GPU: --runslow runs it")
    run_slow = config.getoption("--runslow")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(no_gpu)
        elif "slow" in item.keywords and not run_slow:
            item.add_marker(slow)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if rep.failed:
        seeds = dict(item.stash.get(_TEST_SEEDS, {}))
        seeds.update((name, s) for name, s in _FIXTURE_SEEDS.items() if name in item.fixturenames)
        if seeds:
            lines = [f"{name} = {s}" for name, s in seeds.items()]
            lines.append(f"(derived from {SEED_ENV}={SEED_BASE!r}: rerun with it set so to draw the same inputs)")
            rep.sections.append(("random inputs", "\n".join(lines)))
    return rep


@pytest.fixture
def seed(request):
    """This test's seed, reported when it fails."""
    s = seed_for(request.node.nodeid)
    request.node.stash.setdefault(_TEST_SEEDS, {})["seed"] = s
    return s


@pytest.fixture(scope="session")
def seed_of():
    """For fixtures of module or session scope: seed_of(name) is the seed of fixture `name`'s
    random inputs, reported in the failure of every test that uses that fixture."""
    def seed_of(name):
        s = _FIXTURE_SEEDS[name] = seed_for(name)
        return s
    return seed_of


@pytest.fixture
def require_mlp_form():
    """require_mlp_form(form) skips the test where this GPU does not offer that fp8_mma_form of
    the MLP (3, the wgmma family, runs on compute capability 9.0 only); -1 always runs."""
    def require(form):
        import torch

        from h3kernels._runtime import targets

        if form != -1 and form not in targets.offered_forms("mlp", torch.cuda.current_device()):
            pytest.skip(f"fp8_mma_form={form} of the MLP is not offered on this GPU")

    return require


@pytest.fixture(params=[0, 3])
def mlp_form(request, require_mlp_form):
    """The fp8_mma_form an MLP test runs, one per kernel family: mma.sync (0, everywhere), and the
    wgmma family (3, what -1 picks on compute capability 9.0) where this GPU offers it (else that
    instance skips)."""
    require_mlp_form(request.param)
    return request.param


@pytest.fixture(scope="module")
def weights(seed_of):
    """make_fc_weights on the GPU: dict(w1, w2, q1, s1, q2, s2), bf16 w1 [28672, 5376] and w2
    [5376, 14336] and their prepared e4m3 forms (q1, s1 in the prepacked row order)."""
    from h3kernels.testing.inputs import make_fc_weights

    return make_fc_weights(seed=seed_of("weights"), device="cuda")


class ArrayKind:
    """What a test body needs to run for one array kind, from torch CUDA tensors it made."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name

    def to(self, t):
        """Torch CUDA tensor -> this kind, sharing memory (CuPy: bf16 as uint16 bits, e4m3 as uint8)."""
        import torch

        if self.name == "torch":
            return t
        import cupy

        if t.dtype == torch.bfloat16:
            return cupy.from_dlpack(t.view(torch.int16)).view(cupy.uint16)
        return cupy.from_dlpack(t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t)

    def torch(self, a, dtype=None):
        """A result of this kind -> a torch tensor sharing its memory (its raw bits read as `dtype`
        if given), after checking that it is of this kind."""
        import torch

        if self.name == "cupy":
            import cupy

            assert isinstance(a, cupy.ndarray), type(a)
            if dtype is not None:  # bf16 and e4m3 arrive as raw bits or ml_dtypes: read the bits
                a = a.view({1: cupy.uint8, 2: cupy.int16, 4: cupy.int32, 8: cupy.int64}[a.dtype.itemsize])
            a = torch.from_dlpack(a)
        assert isinstance(a, torch.Tensor), type(a)
        return a if dtype is None or a.dtype == dtype else a.view(dtype)

    def ptr(self, a):
        """The device address of an array of this kind."""
        return a.data_ptr() if self.name == "torch" else a.data.ptr

    def nan_like(self, a):
        """A bf16 array of this kind shaped like `a`, all NaN: what a late write shows through."""
        if self.name == "torch":
            import torch

            return torch.full(a.shape, float("nan"), dtype=torch.bfloat16, device=a.device)
        import cupy

        return cupy.full(a.shape, 0x7FC0, dtype=cupy.uint16)  # bf16 NaN bits

    def write(self, dst, src):
        """dst <- src, on this kind's current stream."""
        if self.name == "torch":
            dst.copy_(src)
        else:
            dst[...] = src

    @contextlib.contextmanager
    def side_stream(self):
        """A new non-blocking stream, current for this kind inside the block; synchronized when it
        ends. Work on it waits for what the default stream has queued."""
        import torch

        torch.cuda.synchronize()
        if self.name == "torch":
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                yield
            s.synchronize()
        else:
            import cupy

            with cupy.cuda.Stream(non_blocking=True) as s:
                yield
                s.synchronize()

    def delay(self):
        """Keeps this kind's current stream busy for a while (tens of ms), so that whatever is
        queued after it runs late: a launch on another stream would see inputs not yet written."""
        if self.name == "torch":
            import torch

            torch.cuda._sleep(50_000_000)
        else:
            import cupy

            busy = cupy.ones(1 << 28, dtype=cupy.float32)
            for _ in range(20):
                busy *= 1.0001


@pytest.fixture(params=["torch", pytest.param("cupy", marks=pytest.mark.gpu)])
def array_kind(request):
    """Torch, then CuPy (GPU only): the array kind a test's inputs and results are of."""
    if request.param == "cupy":
        pytest.importorskip("cupy")
    return ArrayKind(request.param)


@pytest.fixture
def stand_in_plan(monkeypatch):
    """The attention's launch layer without a GPU: set(rows) makes every call take a stand-in
    segment plan of those rows (its arrays at addresses 11 .. 14) and a scratch at 1 << 30, with
    no quantization pass; `call` is a torch call on device 0, stream 7, not capturing;
    `released` lists each release's `launched`."""
    import types

    from h3kernels._launch import varlen_attention_fp8 as L
    from h3kernels._runtime import workspace

    state = types.SimpleNamespace(plan=types.SimpleNamespace(rows=None, ptrs=(11, 12, 13, 14)), released=[],
                                  base=1 << 30, call=types.SimpleNamespace(device_id=0, stream_ptr=7, capturing=False,
                                                                           kind="torch"))

    class Plans:
        def take(self, key, build, capturing, advice):
            return state.plan

        def release(self, plan, stream_ptr, capturing, launched=True):
            state.released.append(launched)

    monkeypatch.setattr(workspace, "plans", lambda device_id: Plans())
    monkeypatch.setattr(workspace, "scratch", lambda call, nbytes: "scratch")
    monkeypatch.setattr(L, "data_ptr", lambda a: state.base if isinstance(a, str) else a.data_ptr())
    monkeypatch.setattr(L, "quant_launches", lambda *a: [])
    state.set = lambda rows: setattr(state.plan, "rows", rows)
    return state


@pytest.fixture
def no_peer_modules(monkeypatch):
    """The FP8 attention peers' modules (FA3's, cuDNN's frontend) cannot be imported, whether or
    not this machine has them."""
    import builtins

    real = builtins.__import__

    def refuse(name, *args, **kwargs):
        if name in ("fa3_fwd_interface", "cudnn"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", refuse)


@pytest.fixture
def stub_bench_device(monkeypatch):
    """The bench's view of the device on a machine without one: a GPU named "stub GPU" of
    compute capability 9.0 whose default form is 0, ceilings 400 (mma.sync) and 1600 (wgmma)
    TFLOP/s. Returns the bench module."""
    import torch

    from h3kernels._runtime import targets
    from h3kernels.cli import bench

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev: "stub GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(targets, "device_arch", lambda dev: "sm_90")
    monkeypatch.setattr(targets, "board_form", lambda dev: 0)
    monkeypatch.setattr(bench, "ceiling_tflops", lambda dev, form, on_error: {0: 400.0, 3: 1600.0}[form])
    return bench


# The reasons an FP8 attention peer may give for not running on a GPU machine: not installed (or
# its library not found), or a documented shape it does not take. Anything else is a failure of
# the peer's code, which a GPU test must not take for an absent peer.
PEER_ABSENT_REASONS = ("not importable", "segments of one length only")


def peer_reason_is_expected(reason):
    return any(phrase in reason for phrase in PEER_ABSENT_REASONS)
