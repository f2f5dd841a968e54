"""Exact nearest neighbours with FAISS brute-force L2 search (CPU, or GPU for CuPy inputs).

FAISS ranks in float32 through ``|q|^2 + |b|^2 - 2 q.b``, which can mis-order near ties. So this
module asks FAISS for a few candidates per query, re-ranks them by the exact float64 squared
distance, and proves the winner with an error bound on FAISS's float32 distances: where the bound
cannot rule out a closer point outside the candidates, that query is answered by an exact float64
brute-force scan instead. The result is a true nearest neighbour, like the k-d tree's.
"""

from __future__ import annotations

import functools

import numpy as np

from ..errors import BackendUnavailableError
from .nn_cupy import array_module, is_cupy

#: Candidates FAISS returns per query before the exact float64 re-ranking.
CANDIDATES = 8

# Bound on |FAISS float32 sqdist - exact sqdist| in units of eps32 * (|q| + max|b|)^2 (coordinates
# centred first). The float32 rounding of the coordinates and the expansion's cancellation each
# contribute a few units; 16 leaves a wide margin, and a too-large bound only costs extra scans.
_BOUND_UNITS = 16.0
_EPS32 = float(np.finfo(np.float32).eps)
# Float64 elements one block of the brute-force fallback may hold (about 48 MiB).
_SCAN_ELEMENTS = 6_000_000


def _faiss():
    try:
        import faiss
    except ImportError as exc:
        raise BackendUnavailableError(
            "backend='faiss' needs the faiss package, which is not installed: "
            "run `pip install faiss-cpu` (or `pip install \"xmesh-p2mpp[faiss]\"`), or use backend='scipy'"
        ) from exc
    return faiss


def available() -> bool:
    """True when faiss can be imported."""
    try:
        _faiss()
    except BackendUnavailableError:
        return False
    return True


def gpu_available() -> bool:
    """True when the installed faiss is a GPU build that sees at least one GPU."""
    faiss = _faiss()
    return hasattr(faiss, "bfKnn") and getattr(faiss, "get_num_gpus", lambda: 0)() > 0


def nearest_index(a, b, candidates: int = CANDIDATES):
    """Index into ``b`` of the nearest point for each row of ``a``.

    ``a`` (N,3) and ``b`` (M,3) are validated float64 arrays, both NumPy or both CuPy. CuPy inputs run
    on FAISS's GPU brute force when faiss is a GPU build, else they are copied to the host. Returns
    int64 (N,) on the device that computed it.
    """
    faiss = _faiss()
    if is_cupy(a) and not gpu_available():
        a, b = a.get(), b.get()
    xp = array_module(a)
    # FAISS searches centred float32 copies (smaller norms, smaller rounding errors); the re-ranking
    # uses the original float64 coordinates, which centring could round together.
    centre = b.mean(axis=0)
    a_c, b_c = a - centre, b - centre
    k = min(int(candidates), b.shape[0])
    q32 = xp.ascontiguousarray(a_c, dtype=xp.float32)
    b32 = xp.ascontiguousarray(b_c, dtype=xp.float32)
    if xp is np:
        approx, cand = faiss.knn(q32, b32, k)
    else:
        approx, cand = _gpu_knn(faiss, q32, b32, k)
    reach = xp.sqrt((a_c**2).sum(axis=1)) + float(xp.sqrt((b_c**2).sum(axis=1).max()))
    return _refine(xp, a, b, approx, cand, _BOUND_UNITS * _EPS32 * reach**2)


def _refine(xp, a, b, approx, cand, bound):
    """Exact re-ranking of FAISS's candidates, with a brute-force scan where the bound is not met.

    ``approx``/``cand`` (N,k) are FAISS's distances and indices, ``bound`` (N,) bounds the error of
    each query's FAISS distances.
    """
    exact = ((a[:, None, :] - b[cand]) ** 2).sum(axis=-1)  # (N, k) float64
    best = exact.argmin(axis=1)
    rows = xp.arange(a.shape[0])
    index = cand[rows, best]
    if cand.shape[1] == b.shape[0]:  # every point of b was a candidate
        return index
    # Anything outside the candidates has a FAISS distance >= the last candidate's, hence an exact
    # distance >= that minus the bound; if that exceeds the best exact candidate, nothing beats it.
    unsure = xp.nonzero(approx[:, -1].astype(xp.float64) - bound <= exact[rows, best])[0]
    if unsure.size:
        index[unsure] = _scan(xp, a[unsure], b)
    return index


def _scan(xp, a, b):
    """Exact float64 brute-force nearest index for each row of ``a`` (block by block)."""
    step = max(1, _SCAN_ELEMENTS // (3 * b.shape[0]))
    out = xp.empty(a.shape[0], dtype=xp.int64)
    for start in range(0, a.shape[0], step):
        block = a[start : start + step]
        out[start : start + step] = ((block[:, None, :] - b[None, :, :]) ** 2).sum(axis=-1).argmin(axis=1)
    return out


@functools.cache
def _gpu_resources(device: int):
    return _faiss().StandardGpuResources()


def _gpu_knn(faiss, q32, b32, k):
    """FAISS GPU brute-force kNN on CuPy arrays, on CuPy's current device and stream."""
    import cupy

    device = cupy.cuda.Device().id
    distances = cupy.empty((q32.shape[0], k), dtype=cupy.float32)
    indices = cupy.empty((q32.shape[0], k), dtype=cupy.int64)

    params = faiss.GpuDistanceParams()
    params.metric = faiss.METRIC_L2
    params.k = k
    params.dims = 3
    params.vectors = faiss.cast_integer_to_float_ptr(b32.data.ptr)
    params.vectorsRowMajor = True
    params.vectorType = faiss.DistanceDataType_F32
    params.numVectors = b32.shape[0]
    params.queries = faiss.cast_integer_to_float_ptr(q32.data.ptr)
    params.queriesRowMajor = True
    params.queryType = faiss.DistanceDataType_F32
    params.numQueries = q32.shape[0]
    params.outDistances = faiss.cast_integer_to_float_ptr(distances.data.ptr)
    params.outIndices = faiss.cast_integer_to_idx_t_ptr(indices.data.ptr)
    params.outIndicesType = faiss.IndicesDataType_I64
    params.device = device

    res = _gpu_resources(device)
    previous = res.getDefaultStream(device)
    res.setDefaultStream(device, faiss.cast_integer_to_cudastream_t(cupy.cuda.get_current_stream().ptr))
    try:
        faiss.bfKnn(res, params)
    finally:
        res.setDefaultStream(device, previous)
    return distances, indices
