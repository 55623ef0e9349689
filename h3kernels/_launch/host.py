"""The Numba kernels on host numpy arrays, outside the operators: under NUMBA_ENABLE_CUDASIM=1
(CI) they run in Numba's CUDA simulator on the arrays themselves; with a GPU, on device copies
through Numba's own launcher. h3kernels.testing.simulator checks them against the reference."""


def simulated():
    from numba.cuda import config

    return bool(config.ENABLE_CUDASIM)


def _on_runner(launch, arrays):
    if simulated():
        launch(**arrays)
        return arrays
    from numba import cuda

    dev = {name: cuda.to_device(a) for name, a in arrays.items()}
    launch(**dev)
    return {name: d.copy_to_host() for name, d in dev.items()}


def row_stage(x_quads, norm_w_quads, scale_flat, shift_flat, tab_stride_quads, rows, index, eps, a_q_quads,
              a_scale):
    """The row kernel (mlp_fp8_row.row_kernel's arguments, numpy): returns (a_q_quads, a_scale)."""
    from h3kernels._launch.numba import mlp_fp8_row

    arrays = dict(x_quads=x_quads, norm_w_quads=norm_w_quads, scale_flat=scale_flat, shift_flat=shift_flat,
                  index=index, a_q_quads=a_q_quads, a_scale=a_scale)
    out = _on_runner(lambda **a: mlp_fp8_row.launch(a["x_quads"], a["norm_w_quads"], a["scale_flat"],
                                                    a["shift_flat"], tab_stride_quads, rows, a["index"], eps,
                                                    a["a_q_quads"], a["a_scale"]), arrays)
    return out["a_q_quads"], out["a_scale"]


def attention_passes(arrays, one_read=False):
    """The attention's quantization passes on numpy arrays named as
    varlen_attention_fp8_quant.launch's arguments (one_read: its one-read K and V passes);
    returns them all after the run."""
    from h3kernels._launch.numba import varlen_attention_fp8_quant

    return _on_runner(lambda **a: varlen_attention_fp8_quant.launch(**a, one_read=one_read), arrays)


def quant_passes(passes, arrays):
    """Runs the passes that passes(**arrays) gives (a (name, thunk) list builder of
    varlen_attention_fp8_quant: kv_quant_passes, segment_sum_passes, k_scale_passes,
    k_given_scale_passes) on numpy arrays; returns them all after the run."""
    return _on_runner(lambda **a: [run() for _, run in passes(**a)], arrays)


def v_transposed(v8, cu_seqlens_host):
    """numpy v8t (the V pass's layout) from v8 uint8 [tokens, heads, 128]."""
    from h3kernels._launch.numba import varlen_attention_fp8_quant

    return varlen_attention_fp8_quant.v_transposed(v8, cu_seqlens_host)
