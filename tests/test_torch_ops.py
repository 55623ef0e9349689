"""The torch.library custom ops (h3kernels.torch_ops): fake implementations (CPU), torch.compile
with fullgraph=True and CUDA graph capture, both bitwise equal to eager (GPU)."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from h3kernels import torch_ops
from h3kernels.testing.checks import same_bits
from h3kernels.testing.inputs import make_attention_inputs, make_fc_weights, make_mlp_inputs, mlp_arguments
from h3kernels.constants import FC1_OUT, FFN, HIDDEN


def meta_mlp_args(m, rows):
    """minimax_h3_mlp_fp8's arguments as meta tensors (shapes, dtypes and strides only)."""
    e = lambda *shape, dtype=torch.bfloat16: torch.empty(*shape, dtype=dtype, device="meta")
    wide = e(rows, 6 * HIDDEN)
    return (e(m, HIDDEN), e(HIDDEN), wide[:, :HIDDEN], wide[:, HIDDEN:2 * HIDDEN], e(m, dtype=torch.int64),
            wide[:, 2 * HIDDEN:3 * HIDDEN], e(m, HIDDEN), e(FC1_OUT, HIDDEN, dtype=torch.float8_e4m3fn),
            e(FC1_OUT, dtype=torch.float32), e(HIDDEN, FFN, dtype=torch.float8_e4m3fn), e(HIDDEN, dtype=torch.float32))


def mlp_args(m, rows, seed):
    """minimax_h3_mlp_fp8's arguments on the GPU, random of that seed."""
    return mlp_arguments(make_mlp_inputs(m, rows, seed=seed), make_fc_weights(seed=seed + 2))


def attention_args(lens, heads, device, seed=0):
    return make_attention_inputs(lens, heads, device=device, seed=seed)


def block(mlp_in, att_in, mlp_form=-1):
    """A toy H3-block step around both operators, with torch work before and after each; exact
    work (scaling by powers of two), so that compiled and eager must agree bitwise."""
    x, *rest = mlp_in
    h = torch_ops.minimax_h3_mlp_fp8((x.float() * 0.5).bfloat16(), *rest, fp8_mma_form=mlp_form)
    q, k, v, cu_dev, cu = att_in
    o = torch_ops.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, cu)
    return (h.float() * 4).bfloat16(), (o.float() * 2).bfloat16()


def test_ops_are_registered_with_fake_implementations():
    assert hasattr(torch.ops.h3kernels, "minimax_h3_mlp_fp8")
    assert hasattr(torch.ops.h3kernels, "minimax_h3_varlen_attention_fp8")
    mlp_in = meta_mlp_args(5, 3)
    att_in = attention_args([7, 0, 9], 2, "meta")
    graph = make_fx(lambda m, a: block(m, a), tracing_mode="fake")(mlp_in, att_in)
    ops = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert "h3kernels.minimax_h3_mlp_fp8.default" in ops
    assert "h3kernels.minimax_h3_varlen_attention_fp8.default" in ops
    h, o = torch.ops.h3kernels.minimax_h3_mlp_fp8(*mlp_in), torch.ops.h3kernels.minimax_h3_varlen_attention_fp8(
        *att_in[:4], att_in[4])
    assert h.shape == (5, HIDDEN) and h.dtype == torch.bfloat16
    assert o.shape == (16, 2, 128) and o.dtype == torch.bfloat16


@pytest.mark.gpu
def test_torch_compile_fullgraph_matches_eager(seed, mlp_form):
    mlp_in = mlp_args(300, 8, seed)
    att_in = attention_args([300, 0, 129, 700], 8, "cuda", seed)
    want = block(mlp_in, att_in, mlp_form)
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    got = compiled(mlp_in, att_in, mlp_form)
    torch.cuda.synchronize()
    assert same_bits(got[0], want[0]) and same_bits(got[1], want[1])


@pytest.mark.gpu
@pytest.mark.parametrize("mlp_form", [0, 3])
def test_cuda_graph_replay_matches_eager(seed, mlp_form, require_mlp_form):
    require_mlp_form(mlp_form)
    mlp_in = mlp_args(129, 8, seed)
    att_in = attention_args([1, 127, 129, 0, 300], 8, "cuda", seed)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up: the segment plan, the modules
        want = block(mlp_in, att_in, mlp_form)
    s.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        static = block(mlp_in, att_in, mlp_form)
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()
    assert same_bits(static[0], want[0]) and same_bits(static[1], want[1])
    # new inputs copied into the captured ones: the replay follows them
    mlp_in[0].copy_(make_mlp_inputs(129, 8, seed=seed + 4)["x"])
    att_in[0].copy_(attention_args([1, 127, 129, 0, 300], 8, "cuda", seed + 1)[0])
    want2 = block(mlp_in, att_in, mlp_form)
    graph.replay()
    torch.cuda.synchronize()
    assert same_bits(static[0], want2[0]) and same_bits(static[1], want2[1])
    assert not same_bits(want2[1], want[1])


@pytest.mark.gpu
# the refused call leaves the capture with no work in it, and torch says so when it ends
@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty:UserWarning")
def test_capture_without_warm_up_is_refused_clearly(seed):
    att_in = attention_args([333, 5], 2, "cuda", seed)
    s = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="call it once with the same cu_seqlens_host before the capture"):
        with torch.cuda.graph(graph, stream=s):
            torch_ops.minimax_h3_varlen_attention_fp8(*att_in[:4], att_in[4])


def test_lse_op_is_registered_with_a_fake_implementation():
    q, k, v, cu_dev, cu = attention_args([7, 0, 9], 2, "meta")
    out, lse = torch.ops.h3kernels.minimax_h3_varlen_attention_fp8_lse(q, k, v, cu_dev, cu)
    assert out.shape == (16, 2, 128) and lse.shape == (2, 16) and lse.dtype == torch.float32
    graph = make_fx(lambda *a: torch_ops.minimax_h3_varlen_attention_fp8(*a, return_lse=True),
                    tracing_mode="fake")(q, k, v, cu_dev, cu)
    ops = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert "h3kernels.minimax_h3_varlen_attention_fp8_lse.default" in ops
    with pytest.raises(TypeError, match="^return_lse: got 1; need True or False"):
        torch_ops.minimax_h3_varlen_attention_fp8(q, k, v, cu_dev, cu, return_lse=1)


@pytest.mark.parametrize("return_lse", [False, True])
def test_attention_wrapper_traces_whole_on_meta_tensors(return_lse):
    """The Python wrapper that picks the op by return_lse traces with fullgraph=True; on meta
    tensors the ops' fake implementations give the shapes (no GPU needed)."""
    import torch

    from h3kernels import torch_ops

    q = torch.empty(8, 2, 128, dtype=torch.bfloat16, device="meta")
    cu = torch.tensor([0, 8], dtype=torch.int32, device="meta")
    f = torch.compile(lambda q, k, v, cu: torch_ops.minimax_h3_varlen_attention_fp8(q, k, v, cu, [0, 8],
                                                                                     return_lse=return_lse),
                      fullgraph=True, backend="eager")
    got = f(q, q.clone(), q.clone(), cu)
    if return_lse:
        out, lse = got
        assert (lse.shape, lse.dtype) == ((2, 8), torch.float32)
    else:
        out = got
    assert (out.shape, out.dtype) == ((8, 2, 128), torch.bfloat16)
