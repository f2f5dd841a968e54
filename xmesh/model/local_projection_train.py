"""Stage 2's local projection for training: the forward with its cache, and the backward.

The forward is :func:`xmesh.model.projection.local_projection`'s arithmetic (camera move, pinhole
projection clamped to the image, the original's floor/ceil bilinear rule on zero-padded maps,
max/mean/std over views). The backward reaches the maps, through a scatter-add of each corner's
weight, and the points, through the bilinear weights, the clamp (TF passes the gradient where the
unclamped pixel lies in [0, 223], ends included) and the camera projection. floor and ceil have no
gradient, so at an integer coordinate, where the sample is 0, the coordinate's gradient is 0 too.
On CuPy in float32 the whole pair runs in one launch each way (:mod:`.local_projection_cupy`): the
pixels, the taps and the pooling, without the per-view features between them; elsewhere (float64,
other map sets) the bilinear taps of each view and map run in one launch each way
(:mod:`.bilinear_cupy`) and the pooling in one more (:mod:`.view_pool_cupy`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from array_api_compat import is_cupy_namespace

from . import bilinear_cupy, local_projection_cupy
from .camera import CENTER, FOCAL, IMAGE_SIZE, MAX_PIXEL, mat3
from .products import matmul
from .sparse import scatter_add
from .view_pool import ViewPoolCache, pool_views_backward, pool_views_forward


@dataclass
class ViewProjection:
    """One view's projection of the points: the view-frame points and which pixels the clamp passed."""

    q: Any  # (B,n,3) points in the view's camera frame
    h: Any  # (B,n) clamped pixel row
    w: Any  # (B,n) clamped pixel column
    h_inside: Any  # (B,n) bool: the unclamped row lies in [0, 223]
    w_inside: Any


@dataclass
class LocalProjectionCache:
    """What :func:`local_projection_backward` reads: the taps' per-view projections and pooling cache, or
    for the one-pass pair on CuPy the points and the padded features it wrote."""

    tf: Any  # DeviceTransforms
    maps: list  # (B*V, s+1, s+1, C) zero-padded maps
    views: list | None  # ViewProjection per view
    pool: ViewPoolCache | None
    points: Any = None  # (B,n,3), the one-pass pair's
    features: Any = None  # (B,n,row), the one-pass pair's rows [point, max, mean, std, zeros]


def view_projection(xp, points, tf, view: int) -> ViewProjection:
    """Pixel rows and columns of camera-0 points (B,n,3) in ``view``, in the inference's float32 order."""
    world = mat3(points, tf.from0[:, None]) + tf.origin0[:, None, :]
    q = mat3(world - tf.origin[:, view, None, :], tf.rot[:, view, None])
    x, y, z = q[..., 0], q[..., 1], q[..., 2]
    h = FOCAL * ((-y) / (-z)) + CENTER
    w = FOCAL * (x / (-z)) + CENTER
    # min(max(.)) is clip's arithmetic in two launches (array-api-compat's clip takes several on CuPy)
    return ViewProjection(
        q,
        xp.minimum(xp.maximum(h, 0.0), MAX_PIXEL),
        xp.minimum(xp.maximum(w, 0.0), MAX_PIXEL),
        (h >= 0.0) & (h <= MAX_PIXEL),
        (w >= 0.0) & (w <= MAX_PIXEL),
    )


_VIEW_PROJECTION = view_projection


def _corners(xp, proj: ViewProjection, size: int):
    """The bilinear sample's coordinates on a map of ``size`` cells: (x, y, x1, x2, y1, y2)."""
    x = proj.h / (IMAGE_SIZE / size)
    y = proj.w / (IMAGE_SIZE / size)
    return x, y, xp.floor(x), xp.ceil(x), xp.floor(y), xp.ceil(y)


def _corner_rows(xp, x1, x2, y1, y2, base, padded: int):
    """Flat row indices of the four corners (11, 21, 12, 22) in a (B*V*(s+1)^2, C) map."""

    def row(xi, yi):
        return xp.reshape(base + xp.astype(xi, xp.int64) * padded + xp.astype(yi, xp.int64), (-1,))

    return row(x1, y1), row(x2, y1), row(x1, y2), row(x2, y2)


def _base(xp, batch: int, views: int, view: int, padded: int):
    return (xp.arange(batch, dtype=xp.int64) * views + view)[:, None] * (padded * padded)


#: CuPy runs the bilinear taps in bilinear_cupy's kernels; False runs the array-API code (for comparisons)
FUSED_ON_CUPY = True
#: float32 on CuPy runs the whole pair in local_projection_cupy's two kernels where they take the maps;
#: False runs the taps and the pooling each on its own (for comparisons). The kernels work out the pixels
#: themselves: a ``view_projection`` put in this module's place (the golden stage-2 test's, which puts
#: chosen samples on the original's side of a pixel boundary) takes the taps, which read its pixels.
ONE_PASS_ON_CUPY = True


def _fused(xp) -> bool:
    return FUSED_ON_CUPY and is_cupy_namespace(xp)


def local_projection_forward(xp, points, maps, tf, groups: int = 1):
    """(B,n,3) hypothesis points -> (B,n,3+3*sum(C)) features [points, max, mean, std], and the cache.

    ``maps`` are the (B*V,s+1,s+1,C) zero-padded stage-2 maps; ``tf`` the DeviceTransforms. ``groups``:
    the points are (n / groups, groups), as :func:`local_projection_backward` takes them (the one-pass
    kernel on CuPy samples a group's rows one after another).
    """
    if _fused(xp):
        return _local_projection_forward_cupy(xp, points, maps, tf, groups)
    batch, n, _ = points.shape
    views = tf.num_views
    per_view, projections = [], []
    for view in range(views):
        proj = view_projection(xp, points, tf, view)
        projections.append(proj)
        feats = []
        for fmap in maps:
            padded, channels = fmap.shape[1], fmap.shape[3]
            x, y, x1, x2, y1, y2 = _corners(xp, proj, padded - 1)
            flat = xp.reshape(fmap, (-1, channels))
            rows = _corner_rows(xp, x1, x2, y1, y2, _base(xp, batch, views, view, padded), padded)
            q11, q21, q12, q22 = (xp.reshape(xp.take(flat, r, axis=0), (batch, n, channels)) for r in rows)
            wx1, wx2 = (x2 - x)[..., None], (x - x1)[..., None]
            wy1, wy2 = (y2 - y)[..., None], (y - y1)[..., None]
            feats.append(q11 * (wx1 * wy1) + q21 * (wx2 * wy1) + q12 * (wx1 * wy2) + q22 * (wx2 * wy2))
        per_view.append(xp.concat(feats, axis=-1))
    pooled, pool_cache = pool_views_forward(xp, xp.stack(per_view))
    return xp.concat([points, *pooled], axis=-1), LocalProjectionCache(tf, list(maps), projections, pool_cache)


def _local_projection_forward_cupy(xp, points, maps, tf, groups: int):
    """:func:`local_projection_forward` on CuPy: the one-pass kernel where it takes the operands, else
    with no copies between the kernels: the taps write each view's features into their columns of one
    (V, B*n, sum(C)) stack, and the pooling writes max, mean and std into theirs of the output. Either
    way the rows are padded with zeros to a multiple of 4 floats (339 -> 340, returned as a view of
    the first 339) for the layer kernels' 16-byte copies."""
    batch, n, _ = points.shape
    views = tf.num_views
    width = sum(int(m.shape[3]) for m in maps)
    if ONE_PASS_ON_CUPY and view_projection is _VIEW_PROJECTION and local_projection_cupy.takes(points, maps, views):
        out = local_projection_cupy.forward(points, maps, tf.packed, views, groups)
        cache = LocalProjectionCache(tf, list(maps), None, None, points=points, features=out)
        return out[..., : 3 + 3 * width], cache
    stacked = xp.empty((views, batch * n, width), dtype=points.dtype)
    projections = []
    for view in range(views):
        proj = view_projection(xp, points, tf, view)
        projections.append(proj)
        start = 0
        for fmap in maps:
            channels = int(fmap.shape[3])
            columns = stacked[view, :, start : start + channels]
            bilinear_cupy.bilinear_forward(fmap, proj.h, proj.w, views, view, out=columns)
            start += channels
    features = 3 + 3 * width
    out = xp.zeros((batch, n, -(-features // 4) * 4), dtype=points.dtype)
    out[..., :3] = points
    pooled = tuple(out[..., 3 + i * width : 3 + (i + 1) * width] for i in range(3))
    _, pool_cache = pool_views_forward(xp, xp.reshape(stacked, (views, batch, n, width)), outs=pooled)
    return out[..., :features], LocalProjectionCache(tf, list(maps), projections, pool_cache)


def local_projection_backward(xp, dfeats, cache: LocalProjectionCache, groups: int = 1, plus=None):
    """(dpoints (B,n,3), [d padded map (B*V,s+1,s+1,C)]) from the features' gradient (B,n,3+3*sum(C)).
    ``groups``: the points are (n / groups, groups), the rows k * groups + v of one v near one another
    (a deformation block's hypotheses of vertex v), which the CuPy kernel sums before the maps.
    ``plus``: the maps' gradients from another path, added to theirs (the one-pass kernel adds its
    shares into them, which it then returns)."""
    tf, maps = cache.tf, cache.maps
    if cache.features is not None:
        return local_projection_cupy.backward(
            dfeats, cache.features, cache.points, maps, tf.packed, tf.num_views, groups, into=plus
        )
    dpoints, dmaps = _taps_backward(xp, dfeats, cache, groups)
    return dpoints, (dmaps if plus is None else [p + d for p, d in zip(plus, dmaps, strict=True)])


def _taps_backward(xp, dfeats, cache: LocalProjectionCache, groups: int):
    """:func:`local_projection_backward` through the per-view taps and the pooling's backward."""
    tf, maps = cache.tf, cache.maps
    batch, n, _ = dfeats.shape
    views = tf.num_views
    width = sum(m.shape[3] for m in maps)
    dmax, dmean, dstd = (dfeats[..., 3 + i * width : 3 + (i + 1) * width] for i in range(3))
    dstacked = pool_views_backward(xp, dmax, dmean, dstd, cache.pool)  # (V,B,n,width)
    dpoints = dfeats[..., :3]
    dflat = [None] * len(maps)
    if _fused(xp):
        dflat = [xp.zeros((m.shape[0] * m.shape[1] * m.shape[2], m.shape[3]), dtype=m.dtype) for m in maps]
    for view, proj in enumerate(cache.views):
        dh = xp.zeros_like(proj.h)
        dw = xp.zeros_like(proj.w)
        start = 0
        for m, fmap in enumerate(maps):
            padded, channels = fmap.shape[1], fmap.shape[3]
            df = dstacked[view, :, :, start : start + channels]  # (B,n,C)
            start += channels
            if _fused(xp):
                bilinear_cupy.bilinear_backward(
                    xp.reshape(df, (-1, channels)), fmap, proj.h, proj.w, views, view, dflat[m], dh, dw, groups
                )
                continue
            x, y, x1, x2, y1, y2 = _corners(xp, proj, padded - 1)
            flat = xp.reshape(fmap, (-1, channels))
            rows = _corner_rows(xp, x1, x2, y1, y2, _base(xp, batch, views, view, padded), padded)
            wx1, wx2 = x2 - x, x - x1
            wy1, wy2 = y2 - y, y - y1
            scale = (padded - 1) / IMAGE_SIZE
            q11, q21, q12, q22 = (xp.reshape(xp.take(flat, r, axis=0), (batch, n, channels)) for r in rows)
            # d f / d x = (q21 - q11) wy1 + (q22 - q12) wy2, and likewise along y; x = h * s / 224
            gx = xp.sum(df * ((q21 - q11) * wy1[..., None] + (q22 - q12) * wy2[..., None]), axis=-1)
            gy = xp.sum(df * ((q12 - q11) * wx1[..., None] + (q22 - q21) * wx2[..., None]), axis=-1)
            dh = dh + gx * scale
            dw = dw + gy * scale
            flat_df = xp.reshape(df, (-1, channels))
            values = [flat_df * xp.reshape(weight, (-1, 1)) for weight in (wx1 * wy1, wx2 * wy1, wx1 * wy2, wx2 * wy2)]
            part = scatter_add(xp, xp.concat(rows), xp.concat(values, axis=0), flat.shape[0])
            dflat[m] = part if dflat[m] is None else dflat[m] + part
        dpoints = dpoints + _projection_backward(xp, dh, dw, proj, tf, view)
    return dpoints, [xp.reshape(d, fmap.shape) for d, fmap in zip(dflat, maps, strict=True)]


def _projection_backward(xp, dh, dw, proj: ViewProjection, tf, view: int):
    """The points' gradient (B,n,3) from the clamped pixels' (dh, dw) of one view.

    h = 248 y/z + 112 and w = -248 x/z + 112 in the view frame q = (p from0 + o0 - o_v) rot_v.
    """
    zeros = xp.zeros_like(dh)
    dh = xp.where(proj.h_inside, dh, zeros)
    dw = xp.where(proj.w_inside, dw, zeros)
    x, y, z = proj.q[..., 0], proj.q[..., 1], proj.q[..., 2]
    focal_z = FOCAL / z
    dq = xp.stack([-dw * focal_z, dh * focal_z, (dw * x - dh * y) * focal_z / z], axis=-1)
    dworld = matmul(dq, xp.matrix_transpose(tf.rot[:, view]))
    return matmul(dworld, xp.matrix_transpose(tf.from0))
