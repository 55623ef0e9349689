"""The attention's argument checks, shared by h3kernels.varlen_attention_fp8 and
h3kernels.reference: arrays (check_args), the segment boundaries (host_seqlens), the scalars
(softmax_scale, fp8_mma_form, return_lse), workspace_bytes' device argument (device), and the
partial attention's arrays and boundaries (check_partial_args)."""
import math
import operator

from h3kernels import _validate as v
from h3kernels._runtime import arrays as adapter
from h3kernels.constants import HEAD_DIM, K_BLOCK

FP8_MMA_FORMS = (-1, 0, 2, 3)


def check_args(q, k, v_, cu_seqlens, out, accepted=v.GPU_ARRAYS):
    """Kinds, dtypes, shapes and layout; returns (tokens, heads). Devices are the caller's to check."""
    read = v.reader(v.arrays(accepted, dict(q=q, k=k, v=v_, cu_seqlens=cu_seqlens), dict(out=out)))
    fq, fk, fv = read(q), read(k), read(v_)
    _qkv(q, k, v_, fq, fk, fv)
    for name, f in (("q", fq), ("k", fk), ("v", fv)):
        v.aligned_of(name, f, 8)  # the quantization passes read bf16 quads
    f = read(cu_seqlens)
    if f[0] != adapter.I32:
        v.dtype("cu_seqlens", cu_seqlens, adapter.I32)
    shape = f[1]
    if len(shape) != 1 or shape[0] < 1:
        v.fail("cu_seqlens", f"shape {tuple(shape)}", "shape (segments + 1,)")
    shape = fq[1]
    if out is not None:
        f = read(out)
        v.array_of("out", out, f, adapter.BF16, tuple(shape))
        v.aligned_of("out", f, 4)  # written as pairs of bf16
    return int(shape[0]), int(shape[1])


def qkv(q, k, v_):
    """q, k, v: bf16 [tokens, heads >= 1, 128], one shape, contiguous (also h3kernels.parallel's
    local arrays)."""
    read = v.reader(adapter.kind_of(q))
    _qkv(q, k, v_, read(q), read(k), read(v_))


def _qkv(q, k, v_, fq, fk, fv):
    """qkv() on the arrays' facts (v.reader)."""
    for name, a, f in (("q", q, fq), ("k", k, fk), ("v", v_, fv)):
        if f[0] != adapter.BF16:
            v.dtype(name, a, adapter.BF16)
    shape = fq[1]
    if len(shape) != 3 or shape[2] != HEAD_DIM or shape[1] < 1:
        v.fail("q", f"shape {tuple(shape)}", f"shape (tokens, heads >= 1, {HEAD_DIM})")
    for name, f in (("k", fk), ("v", fv)):
        if f[1] != shape and tuple(f[1]) != tuple(shape):
            v.fail(name, f"shape {tuple(f[1])}", f"q's shape {tuple(shape)}")
    for name, a, f in (("q", q, fq), ("k", k, fk), ("v", v_, fv)):
        if not f[2]:
            v.contiguous_(name, a)


def softmax_scale(scale):
    """None (1 / sqrt(128)) or a positive float, finite in FP32; returned as a float."""
    if scale is None:
        return 1.0 / math.sqrt(HEAD_DIM)
    return v.positive_finite("softmax_scale", scale)


def fp8_mma_form(form):
    """-1 (the board's), 0 (legacy e4m3 mma), 2 (kind::f8f6f4) or 3 (the wgmma family); whether
    the board has the form is the launcher's to check, once the device is known."""
    return v.one_of("fp8_mma_form", form, FP8_MMA_FORMS)


def return_lse(flag):
    """True or False (a bool: 0 and 1 are refused, a mistyped positional argument would pass)."""
    return boolean("return_lse", flag)


def boolean(name, flag):
    """The keyword flag `name`: True or False, as return_lse."""
    if not isinstance(flag, bool):
        v.fail(name, repr(flag), "True or False", TypeError)
    return flag


def host_seqlens(cu_seqlens, cu_seqlens_host, tokens, read_back):
    """cu_seqlens as a tuple of ints, checked: from cu_seqlens_host when given (compared with
    cu_seqlens only by length: reading it back would sync), else from read_back(), which returns
    cu_seqlens' values (the caller's device-to-host copy)."""
    name = "cu_seqlens_host"
    if cu_seqlens_host is None:
        name, cu_seqlens_host = "cu_seqlens", read_back()
    elif type(cu_seqlens_host) in (list, tuple):  # the usual case: none of the probes below apply
        pass
    elif adapter.kind_of(cu_seqlens_host) == "cupy" or getattr(cu_seqlens_host, "is_cuda", False):
        v.fail(name, f"a {adapter.kind_of(cu_seqlens_host)} device array", "a host sequence of ints", TypeError)
    elif hasattr(cu_seqlens_host, "tolist"):  # numpy array or CPU tensor
        cu_seqlens_host = cu_seqlens_host.tolist()
    try:
        cu = tuple(map(int, cu_seqlens_host))
    except (TypeError, ValueError):
        v.fail(name, type(cu_seqlens_host).__name__, "a sequence of ints", TypeError)
    entries = cu_seqlens.shape[0]
    if len(cu) != entries:
        v.fail(name, f"{len(cu)} entries", f"{entries}, as cu_seqlens")
    return segment_bounds(name, cu, tokens, "q.shape[0]")


def segment_bounds(name, cu, tokens, of):
    """Segment boundaries (a tuple of ints): from 0, non-decreasing, to `tokens` (`of` names where
    that count comes from). Returns cu."""
    if cu[0] != 0:
        v.fail(name, f"first entry {cu[0]}", "0")
    if not all(map(operator.le, cu, cu[1:])):
        i = next(i for i, (a, b) in enumerate(zip(cu, cu[1:])) if b < a)
        v.fail(name, f"entries {cu[i]}, {cu[i + 1]} at {i}, {i + 1}", "non-decreasing entries")
    if cu[-1] != tokens:
        v.fail(name, f"last entry {cu[-1]}", f"tokens = {tokens} ({of})")
    return cu


_DEVICE_NEED = "None, an int >= 0, 'cuda', 'cuda:N', a torch.device or a CuPy Device"


def device(dev):
    """workspace_bytes' device, parsed without touching CUDA: a device index, or None for the
    current device (None, 'cuda', or a CUDA torch.device without an index)."""
    if dev is None:
        return None
    if isinstance(dev, bool):
        v.fail("device", repr(dev), _DEVICE_NEED, TypeError)
    if isinstance(dev, int):
        if dev < 0:
            v.fail("device", repr(dev), _DEVICE_NEED)
        return dev
    if isinstance(dev, str):  # before the attribute probes: str has an .index method
        if dev == "cuda":
            return None
        if dev.startswith("cuda:") and dev[5:].isascii() and dev[5:].isdecimal():
            return int(dev[5:])
        v.fail("device", repr(dev), _DEVICE_NEED, TypeError)
    if type(dev).__module__.split(".")[0] == "torch":  # torch.device
        if getattr(dev, "type", None) != "cuda":
            v.fail("device", repr(dev), _DEVICE_NEED)
        return dev.index
    idx = getattr(dev, "id", None)  # cupy Device
    if isinstance(idx, int) and not isinstance(idx, bool):
        return idx
    v.fail("device", repr(dev), _DEVICE_NEED, TypeError)


def check_partial_args(q, k, v_, cu_seqlens_q, cu_seqlens_k, k_mean, v_scale, k_scale=None):
    """The partial attention's arrays and boundaries (minimax_h3_varlen_attention_fp8_partial):
    q bf16 [q tokens, heads, 128], k and v bf16 [k tokens, heads, 128], contiguous; the two
    boundaries host sequences of ints of one length (segments + 1), each from 0, non-decreasing,
    to its tokens; k_mean and v_scale f32 [segments, heads, 128], contiguous; k_scale None or f32
    [key blocks of cu_seqlens_k, heads], contiguous. Devices are the caller's to check. Returns (q
    tokens, k tokens, heads, cu_q, cu_k) with the boundaries as tuples."""
    read = _reader(dict(q=q, k=k, v=v_, k_mean=k_mean, v_scale=v_scale), dict(k_scale=k_scale))
    tokens_q, heads = _bf16_rows(read, q=q)
    tokens_k, _ = _keys(read, k, v_, heads, "q's")
    cu_q = _host_bounds("cu_seqlens_q", cu_seqlens_q, tokens_q, "q.shape[0]")
    cu_k = _host_bounds("cu_seqlens_k", cu_seqlens_k, tokens_k, "k.shape[0]")
    if len(cu_k) != len(cu_q):
        v.fail("cu_seqlens_k", f"{len(cu_k)} entries", f"{len(cu_q)}, as cu_seqlens_q (one per segment + 1)")
    _segment_planes(read, heads, len(cu_q) - 1, k_mean=k_mean, v_scale=v_scale)
    if k_scale is not None:
        blocks = sum(-(-(b - a) // K_BLOCK) for a, b in zip(cu_k, cu_k[1:]))
        v.array_of("k_scale", k_scale, read(k_scale), adapter.F32, (blocks, heads))
    return tokens_q, tokens_k, heads, cu_q, cu_k


def check_segment_sums_args(k, v_, cu_seqlens_k):
    """minimax_h3_varlen_attention_fp8_segment_sums' arguments: k and v as the partial attention's,
    cu_seqlens_k host boundaries to k's tokens. Returns (heads, cu_k)."""
    read = _reader(dict(k=k, v=v_))
    tokens, heads = _keys(read, k, v_, None, None)
    return heads, _host_bounds("cu_seqlens_k", cu_seqlens_k, tokens, "k.shape[0]")


def check_key_block_scales_args(k, cu_seqlens_k, k_mean, k_first):
    """minimax_h3_varlen_attention_fp8_key_block_scales' arguments: k as the partial attention's,
    cu_seqlens_k host boundaries to its tokens, k_mean f32 [segments, heads, 128], k_first host
    ints >= 0, one per segment. Returns (heads, cu_k, k_first as a tuple)."""
    read = _reader(dict(k=k, k_mean=k_mean))
    tokens, heads = _bf16_rows(read, k=k)
    cu_k = _host_bounds("cu_seqlens_k", cu_seqlens_k, tokens, "k.shape[0]")
    _segment_planes(read, heads, len(cu_k) - 1, k_mean=k_mean)
    firsts = v.host_ints("k_first", k_first)
    if len(firsts) != len(cu_k) - 1:
        v.fail("k_first", f"{len(firsts)} entries", f"{len(cu_k) - 1}, one per segment of cu_seqlens_k")
    if any(f < 0 for f in firsts):
        v.fail("k_first", f"entry {min(firsts)}", "entries >= 0 (a key's position in its whole segment)")
    return heads, cu_k, firsts


def _reader(required, optional=None):
    """The facts reader of the given arrays ({name: array}; optional ones may be None), all of
    one accepted kind."""
    return v.reader(v.arrays(v.GPU_ARRAYS, required, optional))


def _bf16_rows(read, **named):
    """Each named array bf16 [tokens, heads >= 1, 128], contiguous and 8-byte aligned (the
    quantization passes read bf16 quads). Returns the first one's (tokens, heads)."""
    first = None
    for name, a in named.items():
        f = read(a)
        if f[0] != adapter.BF16:
            v.dtype(name, a, adapter.BF16)
        shape = tuple(f[1])
        if len(shape) != 3 or shape[2] != HEAD_DIM or shape[1] < 1:
            v.fail(name, f"shape {shape}", f"shape (tokens, heads >= 1, {HEAD_DIM})")
        if not f[2]:
            v.contiguous_(name, a)
        v.aligned_of(name, f, 8)
        first = first or (int(shape[0]), int(shape[1]))
    return first


def _keys(read, k, v_, heads, whose):
    """k and v: _bf16_rows, one shape, with `heads` heads (`whose` names where that count comes
    from) when given. Returns (k tokens, heads)."""
    tokens_k, heads_k = _bf16_rows(read, k=k, v=v_)
    if heads is not None and heads_k != heads:
        v.fail("k", f"{heads_k} heads", f"{whose} {heads}")
    fk, fv = read(k), read(v_)
    if tuple(fv[1]) != tuple(fk[1]):
        v.fail("v", f"shape {tuple(fv[1])}", f"k's shape {tuple(fk[1])}")
    return tokens_k, heads_k


def _segment_planes(read, heads, segments, **named):
    """Each named array f32 [segments, heads, 128], contiguous."""
    for name, a in named.items():
        v.array_of(name, a, read(a), adapter.F32, (segments, heads, HEAD_DIM))


def _host_bounds(name, values, tokens, of):
    """Segment boundaries given on the host: a sequence of ints from 0, non-decreasing, to tokens."""
    cu = v.host_ints(name, values)
    if len(cu) < 2:
        v.fail(name, f"{len(cu)} entries", "at least 2 (segments + 1)")
    return segment_bounds(name, cu, tokens, of)
