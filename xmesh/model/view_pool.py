"""Pooling over views for training: max, mean and std = sqrt(population variance + 1e-6), and its backward.

Both projections pool each point's per-view features this way. TensorFlow's max gradient is split
equally among all the views that tie for the max (ReLU maps and zero samples tie often), so the
backward does the same instead of routing to one argmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from array_api_compat import is_cupy_namespace

from . import view_pool_cupy

STD_EPS = 1e-6


@dataclass
class ViewPoolCache:
    """What the pooling's backward reads: the stacked per-view features, their max, mean and std."""

    stacked: Any  # (V, ..., C)
    maximum: Any
    mean: Any
    std: Any


def pool_views_forward(xp, stacked, outs=None):
    """(max, mean, std) over the leading view axis of ``stacked`` (V, ..., C); returns them and the cache.
    On CuPy one kernel pass (:mod:`.view_pool_cupy`), which writes them into ``outs`` where given
    (three arrays of their shape, e.g. column ranges of the features' array)."""
    if is_cupy_namespace(xp):
        stacked, (maximum, mean, std) = view_pool_cupy.pool_views_forward(stacked, STD_EPS, outs)
        return (maximum, mean, std), ViewPoolCache(stacked, maximum, mean, std)
    mean = xp.mean(stacked, axis=0)
    var = xp.mean((stacked - mean) ** 2, axis=0)
    std = xp.sqrt(var + STD_EPS)
    maximum = xp.max(stacked, axis=0)
    return (maximum, mean, std), ViewPoolCache(stacked, maximum, mean, std)


def pool_views_backward(xp, dmax, dmean, dstd, cache: ViewPoolCache):
    """The gradient of the stacked features from those of (max, mean, std)."""
    if is_cupy_namespace(xp):
        return view_pool_cupy.pool_views_backward(
            dmax, dmean, dstd, cache.stacked, cache.maximum, cache.mean, cache.std
        )
    views = cache.stacked.shape[0]
    ties = xp.astype(cache.stacked == cache.maximum, cache.stacked.dtype)
    share = dmax / xp.sum(ties, axis=0)
    # d std / d f_v = (f_v - mean) / (V std): the path through the mean sums to zero over the views
    spread = dstd / (views * cache.std)
    return ties * share + dmean / views + (cache.stacked - cache.mean) * spread
