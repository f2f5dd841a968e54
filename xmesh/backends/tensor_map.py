"""Tensor maps (CUtensorMap) for the Hopper kernels' Tensor Memory Accelerator copies, made by the
CUDA driver's ``cuTensorMapEncodeTiled`` through ctypes (CuPy does not wrap it).

A tensor map describes a global array (its address, sizes, strides) and the box one copy moves into
shared memory, with the swizzle the MMAs' descriptors expect. A kernel takes it by value as a
``__grid_constant__`` parameter (``WgTensorMap`` in kernels/wgmma_common.cuh): here it is a NumPy
scalar of 128 raw bytes, which CuPy passes by value like any other NumPy scalar.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

#: the parameter's NumPy type: the 128 bytes of a CUtensorMap
TENSOR_MAP_DTYPE = np.dtype([("bits", np.uint64, 16)])

# CUtensorMapDataType, CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
# CUtensorMapFloatOOBfill (cuda.h)
DATA_UINT16 = 1
DATA_UINT32 = 2
INTERLEAVE_NONE = 0
SWIZZLE_128B = 3
L2_PROMOTION_256B = 3
OOB_FILL_ZERO = 0


@functools.lru_cache(maxsize=1)
def _encode_tiled():
    try:
        fn = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
    except (OSError, AttributeError) as err:
        raise RuntimeError(
            "the Hopper kernels' tensor maps need the CUDA driver's cuTensorMapEncodeTiled "
            f"(libcuda.so.1 of a CUDA 12 or newer driver): {err}"
        ) from err
    fn.restype = ctypes.c_int
    fn.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_uint32,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ctypes.c_uint32),
        ctypes.POINTER(ctypes.c_uint32),
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
    ]
    return fn


def tiled(address: int, dims, strides_bytes, box, element_bytes: int):
    """The tensor map of an array of 2- or 4-byte elements (copied as raw bits) at device ``address``
    with sizes ``dims`` (innermost first), byte strides ``strides_bytes`` of dims 1.. (multiples of 16),
    copied in boxes of ``box`` elements (the innermost 128 bytes at most) with the 128-byte swizzle;
    elements past the array's ends read as zero. Returns the NumPy scalar a kernel takes by value."""
    rank = len(dims)
    if element_bytes not in (2, 4):
        raise ValueError(f"tensor map: elements of 2 or 4 bytes, got {element_bytes}")
    if len(strides_bytes) != rank - 1 or len(box) != rank:
        raise ValueError(f"tensor map: {rank} sizes need {rank - 1} strides and {rank} box sizes")
    if address % 16 or any(s % 16 for s in strides_bytes) or box[0] * element_bytes > 128:
        raise ValueError(
            f"tensor map: address {address:#x} and strides {tuple(strides_bytes)} must be "
            f"16-byte multiples, and the box's rows ({box[0]} elements of {element_bytes} bytes) "
            f"at most 128 bytes"
        )
    room = (ctypes.c_uint8 * (TENSOR_MAP_DTYPE.itemsize + 64))()  # the driver writes it 64-byte aligned
    at = (ctypes.addressof(room) + 63) & ~63
    u64, u32 = ctypes.c_uint64 * rank, ctypes.c_uint32 * rank
    data_type = DATA_UINT16 if element_bytes == 2 else DATA_UINT32
    status = _encode_tiled()(
        at,
        data_type,
        rank,
        address,
        u64(*dims),
        (ctypes.c_uint64 * max(rank - 1, 1))(*strides_bytes),
        u32(*box),
        u32(*([1] * rank)),
        INTERLEAVE_NONE,
        SWIZZLE_128B,
        L2_PROMOTION_256B,
        OOB_FILL_ZERO,
    )
    if status != 0:
        raise RuntimeError(
            f"cuTensorMapEncodeTiled failed (CUresult {status}) for sizes {tuple(dims)}, "
            f"strides {tuple(strides_bytes)}, box {tuple(box)}"
        )
    return np.frombuffer(ctypes.string_at(at, TENSOR_MAP_DTYPE.itemsize), dtype=TENSOR_MAP_DTYPE)[0]
