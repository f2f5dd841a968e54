"""Nearest neighbours on the GPU with xmesh's own tiled brute-force CUDA kernel (fp32, batched).

The kernel source is ``nn_bruteforce.cu`` in the installed ``xmesh.kernels`` folder; it is compiled
with ``cupy.RawModule`` on first use and kept per device for the life of the process. A block takes
256 queries; where the queries alone make too few blocks to fill the GPU (a training step's 3000
ground-truth points), each block walks one part of the reference cloud and a second launch keeps the
parts' nearest, so the pairs found are one walk's (the lowest index among exact ties).
"""

from __future__ import annotations

import numpy as np

from ..backends.cuda_kernels import get_function
from ..errors import BackendUnavailableError, InputError

KERNEL_FILE = "nn_bruteforce.cu"
KERNEL_NAME = "nn_bruteforce"
MERGE_NAME = "nn_bruteforce_merge"
#: Threads per block; also the number of reference points staged in shared memory per tile.
THREADS = 256
#: blocks a multiprocessor the reference cloud's parts aim for, where the queries alone fill fewer
BLOCKS_PER_SM = 4
_MAX_GRID_Y = 65535
_sm_counts: dict = {}


def require_cupy():
    try:
        import cupy
    except ImportError as exc:
        raise BackendUnavailableError(
            "backend='cupy' needs CuPy, which is not installed: run `pip install cupy-cuda12x` "
            "(or `pip install \"xmesh-p2mpp[cupy]\"`) on a machine with an NVIDIA GPU, or use backend='scipy'"
        ) from exc
    return cupy


def is_cupy(x) -> bool:
    """True for a CuPy array (checked without importing CuPy)."""
    return type(x).__module__.split(".")[0] == "cupy"


def array_module(x):
    """``cupy`` for a CuPy array, else ``numpy``."""
    return require_cupy() if is_cupy(x) else np


def _kernel(name: str = KERNEL_NAME):
    """A compiled kernel of ``nn_bruteforce.cu`` for the current device (compiled once, then cached)."""
    return get_function(KERNEL_FILE, name)


def splits(batch: int, n_max: int, m_max: int) -> int:
    """How many parts the reference clouds are walked in: enough that the blocks fill the GPU (a
    training step's few thousand queries are a dozen blocks), each part at least a tile."""
    cupy = require_cupy()
    device = cupy.cuda.Device().id
    if device not in _sm_counts:
        _sm_counts[device] = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
    blocks = -(-n_max // THREADS) * batch
    return max(1, min(-(-BLOCKS_PER_SM * _sm_counts[device] // blocks), -(-m_max // THREADS)))


def _lengths(lengths, batch: int, size: int, name: str, validate: bool = True):
    """Validated (batch,) int64 lengths in [1, size] on the device; all ``size`` when None. Without
    ``validate`` a (batch,) int64 CuPy array is taken as it is."""
    cupy = require_cupy()
    if lengths is None:
        return cupy.full(batch, size, dtype=cupy.int64)
    if not validate and is_cupy(lengths) and lengths.shape == (batch,) and lengths.dtype == cupy.int64:
        return lengths
    host = cupy.asnumpy(lengths)
    if host.shape != (batch,) or host.dtype.kind not in "iu":
        raise InputError(
            f"{name} must be a ({batch},) array of integers, one length per sample; "
            f"got shape {host.shape} and dtype {host.dtype}"
        )
    if host.min() < 1 or host.max() > size:
        raise InputError(f"{name} must lie in [1, {size}] (1 to the padded size); got {host.tolist()}")
    return cupy.asarray(host, dtype=cupy.int64)


def _cloud(x, name: str):
    cupy = require_cupy()
    arr = cupy.ascontiguousarray(cupy.asarray(x, dtype=cupy.float32))
    if arr.ndim not in (2, 3) or arr.shape[-1] != 3 or 0 in arr.shape:
        raise InputError(f"{name} must be an (N, 3) or (B, N, 3) array of points with B, N >= 1; got shape {arr.shape}")
    return arr


def nearest(a, b, lengths_a=None, lengths_b=None, validate: bool = True):
    """Nearest point of ``b`` for each point of ``a`` on the GPU (fp32 brute force).

    ``a`` is (N,3) or padded (B,N,3), ``b`` (M,3) or (B,M,3) with the same number of axes (NumPy or
    CuPy; copied to the current device as float32). ``lengths_a``/``lengths_b`` (B,) give the valid
    points of each sample (default: all); padding is never read. Coordinates must be finite.

    Returns CuPy arrays ``(sqdist, index)`` of shape (N,) or (B,N): fp32 squared distances (difference
    form, within a few float32 ulps of exact) and int64 indices into the sample's ``b``. Padded query
    slots hold distance 0 and index -1. ``validate=False`` takes lengths that are (B,) int64 CuPy
    arrays as they are, unchecked: no copy to the host, so that a CUDA Graph can hold the call.
    """
    cupy = require_cupy()
    a32, b32 = _cloud(a, "a"), _cloud(b, "b")
    if a32.ndim != b32.ndim or (a32.ndim == 3 and a32.shape[0] != b32.shape[0]):
        raise InputError(
            f"a and b must both be (N, 3) or both (B, ., 3) with the same B; got shapes {a32.shape} and {b32.shape}"
        )
    single = a32.ndim == 2
    if single:
        if lengths_a is not None or lengths_b is not None:
            raise InputError("lengths_a/lengths_b apply only to padded (B, N, 3) inputs; got (N, 3) arrays")
        a32, b32 = a32[None], b32[None]
    batch, n_max, m_max = a32.shape[0], a32.shape[1], b32.shape[1]
    if batch > _MAX_GRID_Y:
        raise InputError(f"a and b hold {batch} samples; at most {_MAX_GRID_Y} per call are supported")
    len_a = _lengths(lengths_a, batch, n_max, "lengths_a", validate)
    len_b = _lengths(lengths_b, batch, m_max, "lengths_b", validate)

    parts = splits(batch, n_max, m_max)
    chunk = -(-m_max // parts)
    part_dist = cupy.empty((parts, batch, n_max), dtype=cupy.float32)
    part_index = cupy.empty((parts, batch, n_max), dtype=cupy.int32)
    _kernel()(
        ((n_max + THREADS - 1) // THREADS, batch, parts),
        (THREADS,),
        (a32, b32, len_a, len_b, np.int32(n_max), np.int32(m_max), np.int32(chunk), part_dist, part_index),
        shared_mem=3 * THREADS * 4,
    )
    sqdist = cupy.empty((batch, n_max), dtype=cupy.float32)
    index = cupy.empty((batch, n_max), dtype=cupy.int64)
    _kernel(MERGE_NAME)(
        (-(-(batch * n_max) // THREADS),),
        (THREADS,),
        (part_dist, part_index, len_a, np.int32(batch), np.int32(n_max), np.int32(parts), sqdist, index),
    )
    if single:
        return sqdist[0], index[0]
    return sqdist, index
