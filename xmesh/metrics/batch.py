"""Chamfer distance and F-scores of a whole batch, in one pass per direction.

``evaluate_batch`` takes the batch as padded arrays with per-sample lengths, as PyTorch3D's
``knn_points`` does: predictions (B, N, 3) and ground truth (B, M, 3), ``lengths_gt[b]`` valid rows
of sample b (the rest is padding, never read). On CuPy arrays both directions are one launch each of
xmesh's nearest-neighbour kernel, and the distances, means and threshold counts stay on the GPU: the
result is a handful of (B,) arrays, fetched with one copy. On NumPy arrays each sample goes through
SciPy's k-d tree. Either way the squared distances are recomputed in float64 from the nearest indices,
as :func:`xmesh.metrics.evaluate` does, so the batched and per-sample results agree to float64
rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import InputError
from . import nn_cpu, nn_cupy
from .nn_cupy import is_cupy
from .scores import THRESHOLDS, check_thresholds

_F_EPS = 1e-6  # the original's guard in the F-score denominator (P, R in percent)


def _lengths(lengths, batch: int, size: int, name: str) -> np.ndarray:
    if lengths is None:
        return np.full(batch, size, dtype=np.int64)
    host = np.asarray(lengths.get() if is_cupy(lengths) else lengths)
    if host.shape != (batch,) or host.dtype.kind not in "iu":
        raise InputError(f"{name} must be a ({batch},) array of integers; got shape {host.shape}, dtype {host.dtype}")
    if batch and (host.min() < 1 or host.max() > size):
        raise InputError(f"{name} must lie in [1, {size}]; got {host.tolist()}")
    return host.astype(np.int64)


def _check(preds, gts) -> None:
    for name, arr in (("preds", preds), ("gts", gts)):
        if arr.ndim != 3 or arr.shape[-1] != 3 or 0 in arr.shape:
            raise InputError(f"{name} must be a padded (B, N, 3) array with B, N >= 1; got shape {arr.shape}")
    if preds.shape[0] != gts.shape[0]:
        raise InputError(f"preds and gts must hold the same number of samples; got {preds.shape[0]} and {gts.shape[0]}")


def _scores(xp, d1, d2, valid1, valid2, n1, n2, thresholds):
    """Per-sample (chamfer, d1_mean, d2_mean, fscore (B, T)) from masked float64 distances."""
    d1 = xp.where(valid1, d1, 0.0)
    d2 = xp.where(valid2, d2, 0.0)
    d1_mean = d1.sum(axis=1) / n1
    d2_mean = d2.sum(axis=1) / n2
    taus = xp.asarray(thresholds, dtype=xp.float64)
    near1 = ((d1[:, :, None] <= taus) & valid1[:, :, None]).sum(axis=1)
    near2 = ((d2[:, :, None] <= taus) & valid2[:, :, None]).sum(axis=1)
    precision = 100.0 * (near1 / n1[:, None])
    recall = 100.0 * (near2 / n2[:, None])
    fscore = 2.0 * precision * recall / (precision + recall + _F_EPS)
    return d1_mean + d2_mean, d1_mean, d2_mean, fscore


def _sqdist(xp, a, b, index):
    nearest = b[xp.arange(b.shape[0])[:, None], index]
    return ((a - nearest) ** 2).sum(axis=-1)


def _evaluate_gpu(preds, gts, len_p: np.ndarray, len_g: np.ndarray, thresholds):
    cupy = nn_cupy.require_cupy()
    p = cupy.asarray(preds)
    g = cupy.asarray(gts)
    lp, lg = cupy.asarray(len_p), cupy.asarray(len_g)
    rows_p = cupy.arange(p.shape[1])[None, :] < lp[:, None]
    rows_g = cupy.arange(g.shape[1])[None, :] < lg[:, None]
    finite = cupy.where(rows_p[:, :, None], cupy.isfinite(p), True).all(axis=(1, 2))
    # a non-finite prediction gets zeros here (so the kernel sees finite numbers) and is flagged
    p = cupy.where(finite[:, None, None], p, 0)
    _, index1 = nn_cupy.nearest(p, g, len_p, len_g)  # host lengths: no device round trip
    _, index2 = nn_cupy.nearest(g, p, len_g, len_p)
    p64, g64 = p.astype(cupy.float64), g.astype(cupy.float64)
    d1 = _sqdist(cupy, p64, g64, cupy.maximum(index1, 0))
    d2 = _sqdist(cupy, g64, p64, cupy.maximum(index2, 0))
    chamfer, d1_mean, d2_mean, fscore = _scores(
        cupy, d1, d2, rows_p, rows_g, lp.astype(cupy.float64), lg.astype(cupy.float64), thresholds
    )
    return {"chamfer": chamfer, "fscore": fscore, "d1_mean": d1_mean, "d2_mean": d2_mean, "finite": finite}


def _evaluate_cpu(preds, gts, len_p: np.ndarray, len_g: np.ndarray, thresholds):
    batch = preds.shape[0]
    out = {
        "chamfer": np.zeros(batch),
        "fscore": np.zeros((batch, len(thresholds))),
        "d1_mean": np.zeros(batch),
        "d2_mean": np.zeros(batch),
        "finite": np.ones(batch, dtype=bool),
    }
    for b in range(batch):
        p = np.asarray(preds[b, : len_p[b]], dtype=np.float64)
        g = np.asarray(gts[b, : len_g[b]], dtype=np.float64)
        if not np.isfinite(p).all():
            out["finite"][b] = False
            continue
        d1 = ((p - g[nn_cpu.nearest_index(p, g)]) ** 2).sum(axis=1)
        d2 = ((g - p[nn_cpu.nearest_index(g, p)]) ** 2).sum(axis=1)
        ones1, ones2 = np.ones((1, len(d1)), dtype=bool), np.ones((1, len(d2)), dtype=bool)
        chamfer, m1, m2, fscore = _scores(
            np, d1[None], d2[None], ones1, ones2, np.array([float(len(d1))]), np.array([float(len(d2))]), thresholds
        )
        out["chamfer"][b], out["d1_mean"][b], out["d2_mean"][b], out["fscore"][b] = chamfer[0], m1[0], m2[0], fscore[0]
    return out


def evaluate_batch(preds, gts, lengths_pred=None, lengths_gt=None, thresholds: Sequence[float] = THRESHOLDS) -> dict:
    """Chamfer and F-scores of every sample of a padded batch.

    ``preds`` (B, N, 3) and ``gts`` (B, M, 3) are both NumPy or both CuPy arrays; ``lengths_pred`` /
    ``lengths_gt`` (B,) give the valid rows of each sample (default: all). Returns a dict of arrays on
    the inputs' device: ``chamfer``, ``d1_mean``, ``d2_mean`` (B,) float64, ``fscore`` (B, T) float64
    in percent at each threshold, and ``finite`` (B,) bool, False for a prediction holding NaN or
    infinity (its scores are then meaningless: callers report the sample). Ground truth must be finite.
    """
    thresholds = check_thresholds(thresholds)
    _check(preds, gts)
    batch = preds.shape[0]
    len_p = _lengths(lengths_pred, batch, preds.shape[1], "lengths_pred")
    len_g = _lengths(lengths_gt, batch, gts.shape[1], "lengths_gt")
    if is_cupy(preds) != is_cupy(gts):
        raise InputError("preds and gts must both be NumPy arrays or both CuPy arrays")
    if is_cupy(preds):
        return _evaluate_gpu(preds, gts, len_p, len_g, thresholds)
    return _evaluate_cpu(preds, gts, len_p, len_g, thresholds)


def pad_clouds(clouds: Sequence[np.ndarray], size: int | None = None, out: np.ndarray | None = None):
    """(padded (B, size, 3) float32, lengths (B,) int64) of a list of (N_i, 3) clouds; the padding
    repeats each cloud's first point (any finite value would do: it is never read)."""
    lengths = np.array([len(c) for c in clouds], dtype=np.int64)
    size = int(lengths.max()) if size is None else int(size)
    if out is None:
        out = np.empty((len(clouds), size, 3), dtype=np.float32)
    for b, cloud in enumerate(clouds):
        out[b, : len(cloud)] = cloud
        out[b, len(cloud) :] = cloud[0]
    return out, lengths
