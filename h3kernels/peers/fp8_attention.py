"""The FP8 attention kernels a user would compare ours with, where installed: FlashAttention-3's
forward (the `fa3-fwd` wheel, module `fa3_fwd_interface`) in bf16 and in FP8, and cuDNN's FP8
SDPA (the `nvidia-cudnn-frontend` package, module `cudnn`, its graph API). Each FP8 peer is
timed as its kernel alone: its operands are quantized beforehand, untimed, with the scales its
API takes (FA3: one per segment and head; cuDNN: one per tensor). Neither smooths K nor scales V
per channel, which is what our contract adds (docs/spec.md).

Every function returns a callable that runs the peer on the prepared operands, or raises
PeerUnavailable saying why it cannot run here (not installed, a shape it does not take).
prepared() goes through PEERS for the benches (bench/bench_attention.py, `python -m h3kernels
bench`) and the accuracy figures (h3kernels.testing.fp8_accuracy), so that all of them prepare
and skip a peer the same way; values() reads a peer's output as numbers.
"""
import math

import torch

from h3kernels.constants import E4M3_MAX
from h3kernels.quantize import div, e4m3


class PeerUnavailable(RuntimeError):
    """The peer cannot run here: not installed, or not for these shapes."""


def _fa3():
    try:
        import fa3_fwd_interface
    except Exception as err:  # absent, or its CUDA library does not load here
        raise PeerUnavailable(f"FlashAttention-3 (fa3-fwd) not importable: {type(err).__name__}: {err}") from None
    return fa3_fwd_interface


def _first(result):
    """FA3's functions return out, or (out, lse, ...) depending on the release."""
    return result[0] if isinstance(result, (tuple, list)) else result


def segment_head_quantize(x, cu_host):
    """x [tokens, heads, 128] -> (e4m3 x / scale, f32 scale [segments, heads]): one scale per
    segment and head, RN(amax / 448) (1 where the amax is 0), the granularity FA3's descales take."""
    segments, heads = len(cu_host) - 1, x.shape[1]
    scale = torch.ones((segments, heads), dtype=torch.float32, device=x.device)
    q8 = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    for i, (a, b) in enumerate(zip(cu_host, cu_host[1:])):
        if b > a:
            part = x[a:b].float()
            amax = part.abs().amax(dim=(0, 2))
            s = torch.where(amax > 0, div(amax, E4M3_MAX), torch.ones_like(amax))
            scale[i] = s
            q8[a:b] = e4m3(part / s[None, :, None])
    return q8, scale


def fa3_bf16(q, k, v, cu_host, softmax_scale):
    """FA3's varlen forward on the packed bf16 tensors."""
    fa3 = _fa3()
    cu = torch.tensor(cu_host, dtype=torch.int32, device=q.device)
    longest = max(b - a for a, b in zip(cu_host, cu_host[1:]))
    return lambda: _first(fa3.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, softmax_scale=softmax_scale))


def fa3_fp8(q, k, v, cu_host, softmax_scale):
    """FA3's varlen forward in FP8: q, k, v quantized per segment and head (untimed), their
    scales passed as descales; the output is bf16."""
    fa3 = _fa3()
    cu = torch.tensor(cu_host, dtype=torch.int32, device=q.device)
    longest = max(b - a for a, b in zip(cu_host, cu_host[1:]))
    (q8, sq), (k8, sk), (v8, sv) = (segment_head_quantize(t, cu_host) for t in (q, k, v))
    return lambda: _first(fa3.flash_attn_varlen_func(q8, k8, v8, cu, cu, longest, longest,
                                                     softmax_scale=softmax_scale, q_descale=sq, k_descale=sk,
                                                     v_descale=sv))


def cudnn_fp8(q, k, v, cu_host, softmax_scale):
    """cuDNN's FP8 SDPA on a batch of equal-length segments, one scale per tensor (untimed
    quantization); on Hopper its output is e4m3, written as out * out_scale: returns a callable
    giving those e4m3 codes as a [tokens, heads, 128] view, with the scale as its `out_scale`
    (values() divides by it where values are compared)."""
    lens = {b - a for a, b in zip(cu_host, cu_host[1:])}
    if len(lens) != 1:
        raise PeerUnavailable("cuDNN FP8 SDPA: segments of one length only (per-tensor scales, a batch)")
    try:
        import cudnn
    except Exception as err:
        raise PeerUnavailable(f"cuDNN frontend (nvidia-cudnn-frontend) not importable: {type(err).__name__}: "
                              f"{err}") from None
    (length,), heads, d = lens, q.shape[1], q.shape[2]
    batch = len(cu_host) - 1
    f32 = dict(dtype=torch.float32, device=q.device)
    scales, ops = {}, {}
    for name, t in (("q", q), ("k", k), ("v", v)):
        amax = t.float().abs().amax().reshape(1, 1, 1, 1)
        scales[name] = torch.where(amax > 0, div(amax, E4M3_MAX), torch.ones_like(amax))
        ops[name] = e4m3(t.float() / scales[name].reshape(())).view(batch, length, heads, d)
    one = torch.ones((1, 1, 1, 1), **f32)
    # P (in [0, 1]) is rounded to e4m3 after multiplying by scale_s: 64 keeps its large values off
    # e4m3's coarse low range, as cuDNN's own FP8 accuracy test scales it
    s_scale, s_descale = torch.full((1, 1, 1, 1), 64.0, **f32), torch.full((1, 1, 1, 1), 1 / 64, **f32)
    # |out| <= amax |v| (each output row is a convex combination of V's rows), so this scale fills
    # e4m3's range without overflow; scale 1 would leave the outputs of unit-variance V over
    # thousands of keys (a few hundredths) among e4m3's subnormals, adding error of its own
    v_amax = float(v.float().abs().amax())
    scale_o = torch.full((1, 1, 1, 1), E4M3_MAX / v_amax if v_amax > 0 else 1.0, **f32)
    out_scale = scale_o.item()  # the f32 value the graph multiplies by
    out = torch.empty((batch, length, heads, d), dtype=torch.float8_e4m3fn, device=q.device)
    amax_s, amax_o = torch.empty((1, 1, 1, 1), **f32), torch.empty((1, 1, 1, 1), **f32)
    handle = cudnn.create_handle()
    graph = cudnn.pygraph(io_data_type=cudnn.data_type.FP8_E4M3, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    # [b, h, s, d] dims over [b, s, h, d] memory: the packed tokens, no copy
    bhsd = lambda t: t.permute(0, 2, 1, 3)  # noqa: E731
    tq, tk, tv = (graph.tensor_like(bhsd(ops[n])) for n in ("q", "k", "v"))
    td = {n: graph.tensor_like(scales[n]) for n in ("q", "k", "v")}
    t_ds, t_ss, t_so = graph.tensor_like(one), graph.tensor_like(one), graph.tensor_like(one)
    o, _, t_amax_s, t_amax_o = graph.sdpa_fp8(q=tq, k=tk, v=tv, descale_q=td["q"], descale_k=td["k"],
                                              descale_v=td["v"], descale_s=t_ds, scale_s=t_ss, scale_o=t_so,
                                              attn_scale=softmax_scale, use_causal_mask=False, generate_stats=False)
    o.set_output(True).set_dim(list(bhsd(out).shape)).set_stride(list(bhsd(out).stride())).set_data_type(
        cudnn.data_type.FP8_E4M3)
    for t in (t_amax_s, t_amax_o):
        t.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(cudnn.data_type.FLOAT)
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A])
    graph.check_support()
    graph.build_plans()
    workspace = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device=q.device)
    pack = {tq: bhsd(ops["q"]), tk: bhsd(ops["k"]), tv: bhsd(ops["v"]), td["q"]: scales["q"], td["k"]: scales["k"],
            td["v"]: scales["v"], t_ds: s_descale, t_ss: s_scale, t_so: scale_o, o: bhsd(out), t_amax_s: amax_s,
            t_amax_o: amax_o}

    def run():
        graph.execute(pack, workspace, handle=handle)
        return out.view(-1, heads, d)  # e4m3 codes of out * out_scale: values() reads them

    run.out_scale = out_scale
    return run


def values(run, out):
    """What a peer's callable `run` returned, as float32 values: cuDNN's e4m3 codes divided by the
    scale they were written with (run.out_scale), the bf16 outputs as they are."""
    return out.float() / getattr(run, "out_scale", 1.0)


# (key, label, make, fp8: operands quantized beforehand, the kernel alone timed)
PEERS = (("fa3", "FA3 bf16", fa3_bf16, False), ("fa3_fp8", "FA3 FP8 kernel", fa3_fp8, True),
         ("cudnn_fp8", "cuDNN FP8 kernel", cudnn_fp8, True))


def prepared(q, k, v, cu_host, softmax_scale=None, fp8_only=False):
    """Yields (key, label, fp8, run, error) for each peer of PEERS in turn (only the FP8 ones with
    fp8_only): run the callable of one prepared on q, k, v, error None; or run None and the
    exception that stopped its preparation (PeerUnavailable: it cannot run here). One at a time,
    so that a caller that drops each run before the next holds one peer's operands at once."""
    scale = 1 / math.sqrt(q.shape[2]) if softmax_scale is None else softmax_scale
    for key, label, make, fp8 in PEERS:
        if fp8_only and not fp8:
            continue
        try:
            run = make(q, k, v, cu_host, scale)
        except Exception as err:  # a peer's failure is its row's, never the bench's
            yield key, label, fp8, None, err
            continue
        yield key, label, fp8, run, None
        del run


def reason(err):
    """The text a bench records for a peer that did not run: PeerUnavailable's own sentence, else
    the exception's type and message (on one line, at most 300 characters)."""
    text = str(err) if isinstance(err, PeerUnavailable) else f"{type(err).__name__}: {err}"
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:300] + " ..."
