"""The pooling over views on CuPy: max, mean and std of each point's features in one pass over the
views, and its backward in one more, instead of the array-API code's ten or so passes over the
(V, ..., C) stack (4.6 GB for a DRB's hypotheses at batch 32).

The forward sums the views in their order and divides as NumPy's mean does; the backward splits the
max's gradient equally among tied views, as TensorFlow does (:mod:`.view_pool`).
"""

from __future__ import annotations

import functools

import numpy as np


@functools.cache
def _kernels():
    import cupy

    forward = cupy.ElementwiseKernel(
        "raw T stacked, int32 views, int64 size, T eps",
        "T maximum, T mean, T std",
        """
        T top = stacked[i], total = stacked[i];
        for (int v = 1; v < views; ++v) {
            const T s = stacked[v * size + i];
            top = s > top ? s : top;
            total = total + s;
        }
        const T mu = total / (T)views;
        T square = 0;
        for (int v = 0; v < views; ++v) {
            const T d = stacked[v * size + i] - mu;
            square = square + d * d;
        }
        maximum = top;
        mean = mu;
        std = sqrt(square / (T)views + eps);
        """,
        "xmesh_pool_views_forward",
    )
    backward = cupy.ElementwiseKernel(
        "T dmax, T dmean, T dstd, T maximum, T mean, T std, raw T stacked, int32 views, int64 size",
        "raw T dstacked",
        """
        int ties = 0;
        for (int v = 0; v < views; ++v) ties += stacked[v * size + i] == maximum;
        const T share = dmax / (T)ties;
        const T through_mean = dmean / (T)views;
        const T spread = dstd / ((T)views * std);
        for (int v = 0; v < views; ++v) {
            const T s = stacked[v * size + i];
            dstacked[v * size + i] = (s == maximum ? share : (T)0) + through_mean + (s - mean) * spread;
        }
        """,
        "xmesh_pool_views_backward",
    )
    return forward, backward


def pool_views_forward(stacked, eps: float, outs=None):
    """``stacked`` (V, ..., C) as a contiguous array, and its (max, mean, std = sqrt(variance + eps)) over
    the leading view axis, written into ``outs`` where given (three arrays of that shape; views of a
    wider array may be strided)."""
    import cupy

    stacked = cupy.ascontiguousarray(stacked)
    shape = stacked.shape[1:]
    if outs is None:
        outs = [cupy.empty(shape, dtype=stacked.dtype) for _ in range(3)]
    elif any(o.shape != shape or o.dtype != stacked.dtype for o in outs):
        raise ValueError(f"pool_views_forward: outs must be three {stacked.dtype} arrays of shape {shape}")
    _kernels()[0](stacked, np.int32(stacked.shape[0]), np.int64(outs[0].size), stacked.dtype.type(eps), *outs)
    return stacked, tuple(outs)


def pool_views_backward(dmax, dmean, dstd, stacked, maximum, mean, std):
    """The gradient (V, ..., C) of the contiguous ``stacked`` features from those of (max, mean, std)."""
    import cupy

    dstacked = cupy.empty_like(stacked)
    _kernels()[1](
        dmax, dmean, dstd, maximum, mean, std, stacked, np.int32(stacked.shape[0]), np.int64(maximum.size), dstacked
    )
    return dstacked
