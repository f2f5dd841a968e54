"""Perceptual feature pooling: the stage-1 graph projection and the stage-2 local projection.

Both move camera-0 points into each view, project them with the original pinhole model, sample
the views' CNN maps and pool over views by max, mean and std = sqrt(population variance + 1e-6).
Written with the array API; a backend may replace either with a fused kernel (``op_*``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from .architecture import IMAGE_SIZE, stage1_views_read
from .camera import mat3, packed_transforms, project, unpack_transforms
from .sparse import scatter_add
from .view_pool import ViewPoolCache, pool_views_backward, pool_views_forward

STD_EPS = 1e-6


@dataclass(frozen=True)
class DeviceTransforms:
    """Batched view transforms on the device: from0 (B,3,3), origin0 (B,3), rot (B,V,3,3), origin (B,V,3).

    All four are views of ``packed`` (B, 12 + 12V) (:func:`~xmesh.model.camera.packed_transforms`),
    the one array the kernels read and the one upload of a call.
    """

    from0: Any
    origin0: Any
    rot: Any
    origin: Any
    packed: Any
    num_views: int

    @classmethod
    def from_packed(cls, packed, num_views: int) -> DeviceTransforms:
        """The transforms as views of a (B, 12 + 12V) array of :func:`packed_transforms` rows."""
        return cls(*unpack_transforms(packed, num_views), packed=packed, num_views=num_views)

    @classmethod
    def from_cameras(cls, backend, cameras) -> DeviceTransforms:
        """``cameras`` is a host array (B,V,5)."""
        cameras = np.asarray(cameras, dtype=np.float32)
        return cls.from_packed(backend.asarray(packed_transforms(cameras)), cameras.shape[1])


def _view_pixels(xp, points, tf: DeviceTransforms, view: int):
    """Pixel (h, w) of camera-0 points (B,n,3) in ``view``, clamped to the image.

    The original moves points out of camera 0 and into the view (a round trip for view 0) and
    projects them; the same float32 operations in the same order are kept here (``camera.mat3``),
    because the published weights' outputs depend on which side of a pixel boundary a point falls.
    """
    world = mat3(points, tf.from0[:, None]) + tf.origin0[:, None, :]
    q = mat3(world - tf.origin[:, view, None, :], tf.rot[:, view, None])
    return project(q, xp)


def _pool_views(xp, per_view):
    stacked = xp.stack(per_view)
    mean = xp.mean(stacked, axis=0)
    var = xp.mean((stacked - mean) ** 2, axis=0)
    return [xp.max(stacked, axis=0), mean, xp.sqrt(var + STD_EPS)]


def stage1_map_views(batch: int, maps, num_views: int, view_quirk: bool) -> int:
    """Views per sample in the stage-1 ``maps``: all ``num_views``, or (with the quirk) as few as the
    projection reads (``architecture.stage1_views_read``); anything else is refused."""
    read = len(stage1_views_read(num_views, view_quirk))
    counts = {int(m.shape[0]) for m in maps}
    for views in (num_views, read):
        if counts == {batch * views}:
            return views
    raise InputError(
        f"graph projection: maps of {sorted(counts)} images for {batch} sample(s) of {num_views} views; "
        f"expected {batch * num_views}"
        + (f" or {batch * read} (the views the quirk reads)" if read != num_views else "")
    )


def graph_projection(backend, coords, maps, tf: DeviceTransforms, view_quirk: bool = True, carried=None):
    """Stage 1: (B,N,3) camera-0 coordinates -> (B,N,3+3*sum(C)) pooled features, followed by
    ``carried``'s (B,N,E) columns where given (the layers that append a[-2]'s features).

    ``maps`` are the stacked (B*V',s,s,C) CNN maps of the first V' views of each sample: all V, or
    with ``view_quirk`` (the published weights' behaviour) only those the quirk reads. With the
    quirk the view index is divided by the map stride like the pixel indices, so every view
    samples view 0's maps.
    """
    map_views = stage1_map_views(coords.shape[0], maps, tf.num_views, view_quirk)
    fast = backend.op_graph_projection(coords, maps, tf, view_quirk, carried, map_views)
    if fast is not None:
        return fast
    xp = backend.xp
    per_view, _ = _stage1_gather(xp, coords, maps, tf, view_quirk, map_views)
    return xp.concat([coords] + _pool_views(xp, per_view) + ([] if carried is None else [carried]), axis=-1)


def _stage1_gather(xp, coords, maps, tf: DeviceTransforms, view_quirk: bool, map_views: int):
    """Each view's gathered features (B,N,sum(C)) and, per view and map, the flat row indices into the
    map viewed as (B*V'*s*s, C) that were read."""
    batch, n, _ = coords.shape
    per_view, indices = [], []
    for view in range(tf.num_views):
        h, w = _view_pixels(xp, coords, tf, view)
        feats, rows = [], []
        for fmap in maps:
            s, channels = fmap.shape[1], fmap.shape[3]
            stride = IMAGE_SIZE // s
            src_view = view // stride if view_quirk else view
            ih = xp.astype(h / stride, xp.int64)
            iw = xp.astype(w / stride, xp.int64)
            base = (xp.arange(batch, dtype=xp.int64) * map_views + src_view)[:, None] * (s * s)
            flat = xp.reshape(fmap, (-1, channels))
            index = xp.reshape(base + ih * s + iw, (-1,))
            feats.append(xp.reshape(xp.take(flat, index, axis=0), (batch, n, channels)))
            rows.append(index)
        per_view.append(xp.concat(feats, axis=-1))
        indices.append(rows)
    return per_view, indices


@dataclass
class GraphProjectionCache:
    pool: ViewPoolCache
    indices: list  # per view, per map: the flat rows read
    map_shapes: list
    carried_width: int


def graph_projection_forward(xp, coords, maps, tf: DeviceTransforms, view_quirk: bool = True, carried=None):
    """Training forward of :func:`graph_projection` (its array-API arithmetic); returns (out, cache)."""
    map_views = stage1_map_views(coords.shape[0], maps, tf.num_views, view_quirk)
    per_view, indices = _stage1_gather(xp, coords, maps, tf, view_quirk, map_views)
    pooled, pool = pool_views_forward(xp, xp.stack(per_view))
    out = xp.concat([coords, *pooled] + ([] if carried is None else [carried]), axis=-1)
    carried_width = 0 if carried is None else carried.shape[-1]
    cache = GraphProjectionCache(pool, indices, [tuple(m.shape) for m in maps], carried_width)
    return out, cache


def graph_projection_backward(xp, dout, cache: GraphProjectionCache):
    """(dcoords, dmaps, dcarried or None) from the output gradient. The integer pixel positions pass
    no gradient: the coordinates get only their own columns'. The view max splits its gradient
    equally among the views that tie for it, as TensorFlow's reduce_max gradient does."""
    views, width = cache.pool.stacked.shape[0], cache.pool.stacked.shape[-1]
    dstacked = pool_views_backward(xp, *(dout[..., 3 + i * width : 3 + (i + 1) * width] for i in range(3)), cache.pool)
    dmaps = []
    offset = 0
    for m, shape in enumerate(cache.map_shapes):
        channels = shape[3]
        rows = xp.concat([cache.indices[v][m] for v in range(views)])
        values = xp.reshape(dstacked[..., offset : offset + channels], (-1, channels))
        size = shape[0] * shape[1] * shape[2]
        dmaps.append(xp.reshape(scatter_add(xp, rows, values, size), shape))
        offset += channels
    dcarried = dout[..., 3 + 3 * width :] if cache.carried_width else None
    return dout[..., :3], dmaps, dcarried


def pad_maps(backend, maps):
    """Append a zero row and column to each map, so an index equal to the size reads 0 (the original's rule)."""
    xp = backend.xp
    padded = []
    for fmap in maps:
        n, s, _, c = fmap.shape
        out = xp.zeros((n, s + 1, s + 1, c), dtype=fmap.dtype)
        out[:, :s, :s, :] = fmap
        padded.append(out)
    return padded


def local_projection(backend, points, maps, tf: DeviceTransforms):
    """Stage 2: (B,n,3) hypothesis points -> (B,n,3+3*sum(C)) bilinearly sampled, view-pooled features.

    ``maps`` are the (B*V,s+1,s+1,C) zero-padded stage-2 maps (:func:`pad_maps`). The original's
    bilinear rule is kept: x1 = floor(x), x2 = ceil(x), so at an integer coordinate both weights
    along that axis are 0 and the sample is 0.
    """
    fast = backend.op_local_projection(points, maps, tf)
    if fast is not None:
        return fast
    xp = backend.xp
    batch, n, _ = points.shape
    views = tf.num_views
    per_view = []
    for view in range(views):
        h, w = _view_pixels(xp, points, tf, view)
        feats = []
        for fmap in maps:
            sp, channels = fmap.shape[1], fmap.shape[3]
            s = sp - 1
            x = h / (IMAGE_SIZE / s)  # = h*s/224, exact for the power-of-two strides
            y = w / (IMAGE_SIZE / s)
            x1, x2 = xp.floor(x), xp.ceil(x)
            y1, y2 = xp.floor(y), xp.ceil(y)
            base = (xp.arange(batch, dtype=xp.int64) * views + view)[:, None] * (sp * sp)
            flat = xp.reshape(fmap, (-1, channels))

            def tap(xi, yi, base=base, sp=sp, flat=flat, channels=channels):
                index = xp.reshape(base + xp.astype(xi, xp.int64) * sp + xp.astype(yi, xp.int64), (-1,))
                return xp.reshape(xp.take(flat, index, axis=0), (batch, n, channels))

            wx1, wx2 = (x2 - x)[..., None], (x - x1)[..., None]
            wy1, wy2 = (y2 - y)[..., None], (y - y1)[..., None]
            f = (
                tap(x1, y1) * (wx1 * wy1)
                + tap(x2, y1) * (wx2 * wy1)
                + tap(x1, y2) * (wx1 * wy2)
                + tap(x2, y2) * (wx2 * wy2)
            )
            feats.append(f)
        per_view.append(xp.concat(feats, axis=-1))
    return xp.concat([points] + _pool_views(xp, per_view), axis=-1)
