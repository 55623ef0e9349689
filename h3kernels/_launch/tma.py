"""TMA tensor maps of the Hopper (sm_90a) kernels: the 128 bytes of a CUtensorMap made by the
driver's cuTensorMapEncodeTiled (cuda.bindings), passed to a kernel by value as a 'map'
parameter (h3kernels/_runtime/launcher.py)."""
import ctypes
import functools

ROW_BYTES = 128  # a box row: one 128B-swizzled row (128 e4m3 values), what the wgmma descriptors read


@functools.lru_cache(maxsize=512)
def tensor_map(address, rows, pitch, box_rows, row_bytes=ROW_BYTES):
    """The 128 bytes of a TMA map of a byte matrix [rows, pitch] (row-major, pitch bytes per
    row) at `address`: boxes of box_rows x row_bytes, 128 or 64 swizzled over the box row (the
    wgmma operands' 128B or 64B swizzle), 256 unswizzled (a row of 128 bf16 values, staged for
    threads to read), rows past the end read as zeros. The bytes depend only on these arguments,
    so they are cached on them."""
    from cuda.bindings import driver as cu

    swizzle = {128: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
               64: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
               256: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE}[row_bytes]
    err, tmap = cu.cuTensorMapEncodeTiled(
        cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, address,
        [cu.cuuint64_t(pitch), cu.cuuint64_t(rows)], [cu.cuuint64_t(pitch)],
        [cu.cuuint32_t(row_bytes), cu.cuuint32_t(box_rows)], [cu.cuuint32_t(1), cu.cuuint32_t(1)],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled: {err} (address {address:#x}, rows {rows}, pitch {pitch})")
    return ctypes.string_at(tmap.getPtr(), 128)
