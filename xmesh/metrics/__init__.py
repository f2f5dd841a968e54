"""Pixel2Mesh++ evaluation metrics: Chamfer distance and F-score between a prediction and ground truth.

Both metrics rest on squared nearest-neighbour distances, computed in both directions between the
predicted vertices P (N,3) and the ground-truth points G (M,3)::

    d1[i] = min_j |P_i - G_j|^2        d2[j] = min_i |G_j - P_i|^2

(see :mod:`xmesh.metrics.scores` for the formulas). A backend only finds the nearest index; the
squared distance is then recomputed from it in float64, so float32 inputs give float64-exact results.

Backends (``backend=``):

- ``"scipy"``: SciPy's k-d tree, exact, on the host;
- ``"faiss"``: FAISS brute force with exact float64 re-ranking (GPU FAISS for CuPy inputs when
  installed);
- ``"cupy"``: xmesh's CUDA kernel (:func:`xmesh.metrics.nn_cupy.nearest`);
- ``"auto"`` (default): ``"cupy"`` when an input is a CuPy array, else ``"scipy"``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import InputError
from . import nn_cpu, nn_cupy, nn_faiss
from .nn_cupy import array_module, is_cupy
from .scores import (
    CATEGORIES,
    THRESHOLDS,
    chamfer_from_distances,
    check_thresholds,
    fscore_from_distances,
    summarize,
)

__all__ = [
    "BACKENDS",
    "CATEGORIES",
    "THRESHOLDS",
    "chamfer",
    "chamfer_batch",
    "evaluate",
    "f_score",
    "nn_distances",
    "summarize",
]

BACKENDS = ("auto", "scipy", "faiss", "cupy")


def _to_host(x) -> np.ndarray:
    return x.get() if is_cupy(x) else np.asarray(x)


def _points(x, name: str):
    """``x`` as a validated float64 (N,3) array, N >= 1, finite; on the device it came from."""
    xp = array_module(x)
    try:
        arr = xp.asarray(x)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{name} must be an (N, 3) array of point coordinates; got {type(x).__name__}: {exc}") from exc
    if arr.dtype.kind not in "fiu":
        raise InputError(f"{name} must hold real numbers (float or integer); got dtype {arr.dtype}")
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise InputError(f"{name} must be an (N, 3) array of point coordinates; got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise InputError(f"{name} is empty (shape {arr.shape}); expected at least one point")
    arr = arr.astype(xp.float64, copy=False)
    bad = _to_host(xp.nonzero(~xp.isfinite(arr).all(axis=1))[0])
    if bad.size:
        raise InputError(
            f"{name} has {bad.size} point(s) with NaN or infinite coordinates (first at row {bad[0]}); "
            "expected finite coordinates"
        )
    return arr


def _backend(backend: str, *arrays) -> str:
    if backend not in BACKENDS:
        raise InputError(f"backend must be one of {BACKENDS}; got {backend!r}")
    if backend == "auto":
        return "cupy" if any(is_cupy(a) for a in arrays) else "scipy"
    return backend


def _exact_sqdist(a, b, index):
    """|a - b[index]|^2 in float64, for (N,3) or batched (B,N,3) ``a`` with (.., N) ``index``."""
    xp = array_module(a)
    if a.ndim == 2:
        nearest = b[index]
    else:
        nearest = b[xp.arange(b.shape[0])[:, None], index]
    return ((a - nearest) ** 2).sum(axis=-1)


def _nearest_index(a, b, backend: str):
    if backend == "scipy":
        return nn_cpu.nearest_index(a, b)
    if backend == "faiss":
        return nn_faiss.nearest_index(a, b)
    return nn_cupy.nearest(a, b)[1]


def _device_pair(a, b, backend: str):
    """Both arrays on the backend's device: CuPy for 'cupy', the host for 'scipy' (and for 'faiss'
    unless both are CuPy arrays, which GPU FAISS can take as they are)."""
    if backend == "cupy":
        cupy = nn_cupy.require_cupy()
        return cupy.asarray(a), cupy.asarray(b)
    if backend == "faiss" and is_cupy(a) and is_cupy(b):
        return a, b
    return _to_host(a), _to_host(b)


def _nn(a, b, backend: str):
    """(sqdist, index) for validated ``a``, ``b`` already on the backend's device."""
    index = _nearest_index(a, b, backend)
    if not is_cupy(index):  # computed on the host (FAISS without GPU support moves CuPy inputs there)
        a, b = _to_host(a), _to_host(b)
    return _exact_sqdist(a, b, index), index


def nn_distances(a, b, backend: str = "auto"):
    """Nearest point of ``b`` for each point of ``a`` (like PyTorch3D's ``knn_points`` with K=1).

    ``a`` (N,3) and ``b`` (M,3) are arrays (NumPy, CuPy or nested lists) of finite coordinates.
    Returns ``(sqdist, index)``: float64 (N,) exact squared distances and int64 (N,) indices into
    ``b`` (among equally near points, any one). They are CuPy arrays when the work ran on the GPU
    (backend 'cupy', or 'faiss' on CuPy inputs with a GPU build of FAISS), else NumPy.
    """
    name = _backend(backend, a, b)
    return _nn(*_device_pair(_points(a, "a"), _points(b, "b"), name), name)


def _d1_d2(pred, gt, backend: str):
    """Host float64 (d1, d2) between validated ``pred`` and ``gt``."""
    pred, gt = _device_pair(pred, gt, backend)
    return _to_host(_nn(pred, gt, backend)[0]), _to_host(_nn(gt, pred, backend)[0])


def _both_ways(pred, gt, backend: str):
    """Host float64 (d1, d2) between ``pred`` and ``gt`` after validating both."""
    return _d1_d2(_points(pred, "pred"), _points(gt, "gt"), _backend(backend, pred, gt))


def chamfer(pred, gt, backend: str = "auto") -> float:
    """Chamfer distance mean(d1) + mean(d2) between ``pred`` (N,3) and ``gt`` (M,3)."""
    return chamfer_from_distances(*_both_ways(pred, gt, backend))


def f_score(pred, gt, thresholds: Sequence[float] = THRESHOLDS, backend: str = "auto") -> np.ndarray:
    """F-score in percent at each threshold on squared distance; float64 array of len(thresholds)."""
    thresholds = check_thresholds(thresholds)
    return fscore_from_distances(*_both_ways(pred, gt, backend), thresholds)


def evaluate(pred, gt, thresholds: Sequence[float] = THRESHOLDS, backend: str = "auto") -> dict:
    """Chamfer and F-scores from one pair of nearest-neighbour passes.

    Returns ``{"chamfer": float, "fscore": {tau: F}, "d1_mean": float, "d2_mean": float}`` where
    d1 runs from ``pred`` to ``gt`` and d2 from ``gt`` to ``pred``.
    """
    thresholds = check_thresholds(thresholds)
    d1, d2 = _both_ways(pred, gt, backend)
    scores = fscore_from_distances(d1, d2, thresholds)
    return {
        "chamfer": chamfer_from_distances(d1, d2),
        "fscore": dict(zip(thresholds, (float(f) for f in scores))),
        "d1_mean": float(d1.mean()),
        "d2_mean": float(d2.mean()),
    }


def _is_array(x) -> bool:
    return isinstance(x, np.ndarray) or is_cupy(x)


def _samples(clouds, lengths, name: str) -> list:
    """The valid (N_i, 3) clouds of a padded (B,N,3) array with lengths, or of a list of arrays."""
    if _is_array(clouds):
        if clouds.ndim != 3:
            raise InputError(
                f"{name} must be a padded (B, N, 3) array or a list of (N_i, 3) arrays; got shape {clouds.shape}"
            )
        batch, size = clouds.shape[0], clouds.shape[1]
        counts = np.full(batch, size) if lengths is None else np.asarray(_to_host(lengths))
        if counts.shape != (batch,) or counts.dtype.kind not in "iu":
            raise InputError(
                f"lengths for {name} must be a ({batch},) array of integers; "
                f"got shape {counts.shape}, dtype {counts.dtype}"
            )
        if batch and (counts.min() < 1 or counts.max() > size):
            raise InputError(f"lengths for {name} must lie in [1, {size}]; got {counts.tolist()}")
        return [_points(clouds[i, : counts[i]], f"{name}[{i}]") for i in range(batch)]
    if lengths is not None:
        raise InputError(f"lengths for {name} apply only to a padded (B, N, 3) array; got a {type(clouds).__name__}")
    if not isinstance(clouds, (list, tuple)):
        raise InputError(
            f"{name} must be a padded (B, N, 3) array or a list of (N_i, 3) arrays; got {type(clouds).__name__}"
        )
    return [_points(cloud, f"{name}[{i}]") for i, cloud in enumerate(clouds)]


def chamfer_batch(preds, gts, lengths_pred=None, lengths_gt=None, backend: str = "auto") -> np.ndarray:
    """Chamfer distance of every sample of a batch; float64 (B,).

    ``preds`` and ``gts`` are padded (B,N,3) / (B,M,3) arrays with optional (B,) ``lengths_pred`` /
    ``lengths_gt`` (valid points per sample, like PyTorch3D's ``x_lengths``/``y_lengths``; padding is
    ignored), or lists of (N_i,3) / (M_i,3) arrays. ``.mean()`` of the result is PyTorch3D's
    batch-mean reduction. With backend 'cupy' and padded arrays the whole batch is one kernel launch.
    """
    pred_list = _samples(preds, lengths_pred, "preds")
    gt_list = _samples(gts, lengths_gt, "gts")
    if len(pred_list) != len(gt_list) or not pred_list:
        raise InputError(
            f"preds and gts must hold the same number of samples, at least one; got {len(pred_list)} and {len(gt_list)}"
        )
    name = _backend(backend, *pred_list, *gt_list)
    if name == "cupy" and _is_array(preds) and _is_array(gts):
        return _chamfer_padded_gpu(preds, gts, pred_list, gt_list)
    return np.array([chamfer_from_distances(*_d1_d2(p, g, name)) for p, g in zip(pred_list, gt_list)])


def _chamfer_padded_gpu(preds, gts, pred_list, gt_list) -> np.ndarray:
    """Both passes of a padded batch as single launches of the CUDA kernel (inputs already validated)."""
    cupy = nn_cupy.require_cupy()
    p = cupy.asarray(preds, dtype=cupy.float64)
    g = cupy.asarray(gts, dtype=cupy.float64)
    len_p = cupy.asarray([len(x) for x in pred_list], dtype=cupy.int64)
    len_g = cupy.asarray([len(x) for x in gt_list], dtype=cupy.int64)
    total = cupy.zeros(len(pred_list), dtype=cupy.float64)
    for a, b, len_a, len_b in ((p, g, len_p, len_g), (g, p, len_g, len_p)):
        _, index = nn_cupy.nearest(a, b, len_a, len_b)
        valid = cupy.arange(a.shape[1])[None, :] < len_a[:, None]
        sqdist = cupy.where(valid, _exact_sqdist(a, b, cupy.maximum(index, 0)), 0.0)
        total += sqdist.sum(axis=1) / len_a
    return total.get()
