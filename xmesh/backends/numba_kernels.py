"""CPU kernels (numba) for the NumPy backend's fast paths.

They compute exactly what the array-API code in ``xmesh.model.projection`` computes, in the same
float32 operation order (numba keeps float32 arithmetic in float32 when every operand is float32,
and contracts nothing into fused multiply-adds without fastmath), but in one pass per point instead
of dozens of whole-array temporaries.
"""

from __future__ import annotations

import numba
import numpy as np

_F = np.float32
FOCAL = _F(248.0)
CENTER = _F(112.0)
MAX_PIXEL = _F(223.0)
ZERO = _F(0.0)
THREE = _F(3.0)
EPS = _F(1e-6)


@numba.njit(cache=True, inline="always")
def _pixels(p0, p1, p2, tf, view, views):
    """(h, w) of one camera-0 point in ``view``; ``tf`` = from0 (9), origin0 (3), rot (V*9), origin (V*3)."""
    w0 = (p0 * tf[0] + p1 * tf[3]) + p2 * tf[6] + tf[9]
    w1 = (p0 * tf[1] + p1 * tf[4]) + p2 * tf[7] + tf[10]
    w2 = (p0 * tf[2] + p1 * tf[5]) + p2 * tf[8] + tf[11]
    r = 12 + 9 * view
    o = 12 + 9 * views + 3 * view
    d0 = w0 - tf[o]
    d1 = w1 - tf[o + 1]
    d2 = w2 - tf[o + 2]
    x = (d0 * tf[r] + d1 * tf[r + 3]) + d2 * tf[r + 6]
    y = (d0 * tf[r + 1] + d1 * tf[r + 4]) + d2 * tf[r + 7]
    z = (d0 * tf[r + 2] + d1 * tf[r + 5]) + d2 * tf[r + 8]
    h = FOCAL * ((-y) / (-z)) + CENTER
    w = FOCAL * (x / (-z)) + CENTER
    h = min(max(h, ZERO), MAX_PIXEL)
    w = min(max(w, ZERO), MAX_PIXEL)
    return h, w


@numba.njit(cache=True, parallel=True)
def local_projection(points, packed, m224, m112, m56, views, out):
    """points (B,n,3); packed (B,12+12V); maps (B*V,s+1,s+1,C) zero-padded; out (B,n,3+3*sum C)."""
    batch, n, _ = points.shape
    maps = (m224, m112, m56)
    channels = m224.shape[3] + m112.shape[3] + m56.shape[3]
    for task in numba.prange(batch * n):
        b = task // n
        i = task % n
        p0, p1, p2 = points[b, i, 0], points[b, i, 1], points[b, i, 2]
        feats = np.empty((views, channels), dtype=np.float32)
        for v in range(views):
            h, w = _pixels(p0, p1, p2, packed[b], v, views)
            col = 0
            for fmap in maps:
                sp = fmap.shape[1]
                scale = _F(224.0 / (sp - 1))
                x = h / scale
                y = w / scale
                x1 = np.floor(x)
                x2 = np.ceil(x)
                y1 = np.floor(y)
                y2 = np.ceil(y)
                w11 = (x2 - x) * (y2 - y)
                w21 = (x - x1) * (y2 - y)
                w12 = (x2 - x) * (y - y1)
                w22 = (x - x1) * (y - y1)
                img = b * views + v
                ix1, ix2, iy1, iy2 = int(x1), int(x2), int(y1), int(y2)
                for c in range(fmap.shape[3]):
                    feats[v, col + c] = (
                        (fmap[img, ix1, iy1, c] * w11 + fmap[img, ix2, iy1, c] * w21) + fmap[img, ix1, iy2, c] * w12
                    ) + fmap[img, ix2, iy2, c] * w22
                col += fmap.shape[3]
        out[b, i, 0] = p0
        out[b, i, 1] = p1
        out[b, i, 2] = p2
        for c in range(channels):
            mx = feats[0, c]
            total = feats[0, c]
            for v in range(1, views):
                mx = max(mx, feats[v, c])
                total = total + feats[v, c]
            mean = total / _F(views)
            var = ZERO
            for v in range(views):
                dv = feats[v, c] - mean
                var = var + dv * dv
            var = var / _F(views)
            out[b, i, 3 + c] = mx
            out[b, i, 3 + channels + c] = mean
            out[b, i, 3 + 2 * channels + c] = np.sqrt(var + EPS)
