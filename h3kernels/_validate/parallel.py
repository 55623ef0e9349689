"""The checks of h3kernels.parallel, made on each rank before any communication: the local
q, k, v and out, the global segment boundaries, the ranks' token counts, the head split, the
devices the process group's backend can move, the callers' own attention callables, and
attn_forward's arguments in the flash-attention form."""
import torch

from h3kernels import _validate as v
from h3kernels._validate import host_ints  # noqa: F401 (h3kernels.parallel's boundaries)
from h3kernels._validate import varlen_attention_fp8 as attention
from h3kernels._runtime import arrays as adapter
from h3kernels.constants import HEAD_DIM

# the backends whose tensors live on one kind of device
BACKEND_DEVICE = {"nccl": "cuda", "gloo": "cpu"}


def local_arrays(q, k, v_, out):
    """Local q, k, v (and out when given): bf16 torch tensors [tokens, heads >= 1, 128] of one
    shape, contiguous, 8-byte aligned (the quantization passes read bf16 quads; checked here, before
    any message, so that no rank stops alone), on one device. Returns (tokens, heads)."""
    v.arrays(v.TORCH_TENSORS, dict(q=q, k=k, v=v_), dict(out=out))
    attention.qkv(q, k, v_)
    for name, a in (("q", q), ("k", k), ("v", v_)):
        v.aligned(name, a, 8)
    if out is not None:
        v.array("out", out, adapter.BF16, tuple(q.shape))
    v.one_device(dict(q=q, k=k, v=v_, out=out))
    return int(q.shape[0]), int(q.shape[1])


def backend_device(q, backend):
    """q's device is one the backend moves: CUDA tensors with NCCL, CPU tensors with gloo."""
    want = BACKEND_DEVICE.get(str(backend))
    if want is not None and q.device.type != want:
        need = "a CUDA tensor" if want == "cuda" else "a CPU tensor"
        v.fail("q", f"a tensor on {q.device}", f"{need} with the {backend} backend")


def heads_split(heads, world):
    """Ulysses gives each rank heads / world whole heads."""
    if heads % world:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0]
        v.fail("q", f"{heads} heads over {world} ranks",
               f"a world size that divides the heads ({', '.join(map(str, divisors))})")


def tokens_per_rank(counts, world, rank, local_tokens):
    """world counts >= 0, this rank's equal to its q.shape[0]."""
    counts = host_ints("tokens_per_rank", counts)
    if len(counts) != world:
        v.fail("tokens_per_rank", f"{len(counts)} entries", f"{world}, one per rank")
    if any(c < 0 for c in counts):
        v.fail("tokens_per_rank", f"{counts}", "counts >= 0")
    if counts[rank] != local_tokens:
        v.fail("tokens_per_rank", f"{counts[rank]} tokens for rank {rank}", f"q.shape[0] = {local_tokens}")
    return counts


def global_seqlens(cu, total):
    """The packed sequence's segment boundaries over all ranks: from 0, non-decreasing, to the
    total token count."""
    return packed_seqlens(cu, total, "the tokens of all ranks")


def callable_or_none(name, fn, form):
    """A caller's own attention: None (the default) or a callable of the given form."""
    if fn is not None and not callable(fn):
        v.fail(name, v.type_name(fn), f"None or a callable {form}", TypeError)


# attn_forward's input dtypes: the operators take bf16; the half and single precision tensors
# that frameworks also pass are cast to it (the FP8 quantization follows either way)
FORWARD_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def forward_arrays(q, k, v_):
    """attn_forward's q, k, v: torch tensors [batch, seqlen, heads >= 1, 128] of one shape and one
    dtype of FORWARD_DTYPES, on one device, any strides (they are copied into packed bf16).
    Returns (batch, seqlen, heads)."""
    v.arrays(v.TORCH_TENSORS, dict(q=q, k=k, v=v_))
    if q.dtype not in FORWARD_DTYPES:
        v.fail("q", q.dtype, "torch.bfloat16 (torch.float16 and torch.float32 are cast to it)", TypeError)
    for name, a in (("k", k), ("v", v_)):
        if a.dtype != q.dtype:
            v.fail(name, a.dtype, f"q's dtype {q.dtype}", TypeError)
    shape = tuple(q.shape)
    if len(shape) != 4 or shape[3] != HEAD_DIM or shape[2] < 1:
        v.fail("q", f"shape {shape}", f"shape (batch, seqlen, heads >= 1, {HEAD_DIM})")
    for name, a in (("k", k), ("v", v_)):
        if tuple(a.shape) != shape:
            v.fail(name, f"shape {tuple(a.shape)}", f"q's shape {shape}")
    v.one_device(dict(q=q, k=k, v=v_))
    return shape[:3]


def packed_seqlens(cu_seqlens, tokens, of="batch x seqlen of q"):
    """cu_seqlens as host ints over `tokens` packed tokens (`of` says whose): from 0,
    non-decreasing, to `tokens` (attn_forward's, and the ranks' packed sequence)."""
    cu = host_ints("cu_seqlens", cu_seqlens)
    if not cu:
        v.fail("cu_seqlens", "0 entries", "segments + 1 >= 1 entries")
    return attention.segment_bounds("cu_seqlens", cu, tokens, of)


def plain_attention(dropout_p, causal, window_size, softcap, alibi_slopes, return_softmax):
    """attn_forward serves non-causal attention without dropout, window, softcap or ALiBi."""
    if dropout_p != 0:
        v.fail("dropout_p", repr(dropout_p), "0.0 (inference attention)")
    if causal:
        v.fail("causal", repr(causal), "False (the H3 DiT's attention is bidirectional)")
    if not isinstance(window_size, (tuple, list)) or tuple(window_size) != (-1, -1):
        v.fail("window_size", repr(window_size), "(-1, -1)")
    if softcap:
        v.fail("softcap", repr(softcap), "0.0")
    if alibi_slopes is not None:
        v.fail("alibi_slopes", "a tensor", "None")
    if return_softmax:
        v.fail("return_softmax", repr(return_softmax), "False")
