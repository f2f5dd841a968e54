"""A small z-buffer triangle rasteriser (numba), Lambert shading, and dots for point sets.

Screen coordinates are continuous pixels: ``x`` is the column, ``y`` the row, (0, 0) the top-left
corner of the image, and pixel (row r, column c) is sampled at its centre (c + 0.5, r + 0.5). A
triangle covers the pixels whose centres fall inside it (edges included). Depth is the distance
along the viewing axis; the z-buffer keeps 1/depth, interpolated linearly in screen space, which is
the perspective-correct depth of the surface at that pixel.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from xmesh.errors import InputError

LIGHT_DIRECTION = (0.35, 0.55, 1.0)  # towards the light, camera frame (x right, y up, z to the viewer)
AMBIENT = 0.3


@numba.njit(cache=True, nogil=True)
def _raster_kernel(xy, inv_depth, faces, face_index, zbuffer):  # pragma: no cover - compiled
    height, width = face_index.shape
    for f in range(faces.shape[0]):
        i0, i1, i2 = faces[f, 0], faces[f, 1], faces[f, 2]
        iz0, iz1, iz2 = inv_depth[i0], inv_depth[i1], inv_depth[i2]
        if not (iz0 > 0.0 and iz1 > 0.0 and iz2 > 0.0):
            continue  # a vertex at or behind the camera: the triangle is not drawn
        x0, y0 = xy[i0, 0], xy[i0, 1]
        x1, y1 = xy[i1, 0], xy[i1, 1]
        x2, y2 = xy[i2, 0], xy[i2, 1]
        area = (x1 - x0) * (y2 - y0) - (x2 - x0) * (y1 - y0)
        if area == 0.0 or not math.isfinite(area):
            continue
        # pixel centres c + 0.5 inside [min, max]
        c_lo = max(int(math.ceil(min(x0, x1, x2) - 0.5)), 0)
        c_hi = min(int(math.floor(max(x0, x1, x2) - 0.5)), width - 1)
        r_lo = max(int(math.ceil(min(y0, y1, y2) - 0.5)), 0)
        r_hi = min(int(math.floor(max(y0, y1, y2) - 0.5)), height - 1)
        for r in range(r_lo, r_hi + 1):
            py = r + 0.5
            for c in range(c_lo, c_hi + 1):
                px = c + 0.5
                w0 = ((x1 - px) * (y2 - py) - (x2 - px) * (y1 - py)) / area
                w1 = ((x2 - px) * (y0 - py) - (x0 - px) * (y2 - py)) / area
                w2 = 1.0 - w0 - w1
                if w0 < 0.0 or w1 < 0.0 or w2 < 0.0:
                    continue
                iz = w0 * iz0 + w1 * iz1 + w2 * iz2
                if iz > zbuffer[r, c]:
                    zbuffer[r, c] = iz
                    face_index[r, c] = f


def rasterize(xy, depth, faces, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Visible triangle per pixel.

    xy (V, 2) screen coordinates (column, row), depth (V,) distances along the view axis (> 0 in
    front of the camera), faces (F, 3) vertex indices. Returns (face_index (H, W) int32, -1 where
    no triangle covers the pixel centre; depth (H, W) float32, inf there).
    """
    xy = np.ascontiguousarray(xy, dtype=np.float64)
    depth = np.asarray(depth, dtype=np.float64)
    faces = np.ascontiguousarray(faces, dtype=np.int64)
    if xy.ndim != 2 or xy.shape[1] != 2:
        raise InputError(f"rasterize: xy has shape {xy.shape}; expected (V, 2) screen coordinates")
    if depth.shape != (len(xy),):
        raise InputError(f"rasterize: depth has shape {depth.shape}; expected ({len(xy)},), one per vertex")
    if faces.ndim != 2 or faces.shape[1] != 3:
        raise InputError(f"rasterize: faces have shape {faces.shape}; expected (F, 3)")
    if faces.size and (faces.min() < 0 or faces.max() >= len(xy)):
        raise InputError(f"rasterize: face indices must lie in [0, {len(xy) - 1}]")
    if int(height) < 1 or int(width) < 1:
        raise InputError(f"rasterize: image size {height}x{width}; expected at least 1x1")
    with np.errstate(divide="ignore"):
        inv_depth = np.where(depth > 0, 1.0 / depth, -1.0)
    face_index = np.full((int(height), int(width)), -1, dtype=np.int32)
    zbuffer = np.zeros((int(height), int(width)), dtype=np.float64)
    _raster_kernel(xy, inv_depth, faces, face_index, zbuffer)
    with np.errstate(divide="ignore"):
        out_depth = np.where(face_index >= 0, 1.0 / zbuffer, np.inf).astype(np.float32)
    return face_index, out_depth


def _unit(vector) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float64)
    return v / np.linalg.norm(v)


def color_array(color, what: str = "color") -> np.ndarray:
    """An RGB colour (3,) or per-face colours (F, 3), floats in [0, 1] or integers 0..255 -> float64 [0, 1]."""
    c = np.asarray(color)
    if c.shape[-1:] not in ((3,), (4,)) or c.ndim > 2:
        raise InputError(f"{what}: shape {c.shape}; expected an RGB triple or (F, 3) colours")
    c = c[..., :3].astype(np.float64)
    if np.issubdtype(np.asarray(color).dtype, np.integer) or c.max(initial=0.0) > 1.0:
        c = c / 255.0
    if not np.all((c >= 0) & (c <= 1)):
        raise InputError(f"{what}: values outside [0, 1] (or 0..255)")
    return c


def shade(face_index, normals, color, light=LIGHT_DIRECTION, ambient: float = AMBIENT) -> np.ndarray:
    """Flat Lambert shading: RGBA uint8 (H, W, 4), alpha 255 where a face is visible and 0 elsewhere.

    normals (F, 3) unit face normals in the camera frame, facing the viewer; color (3,) or (F, 3);
    intensity = ambient + (1 - ambient) * max(0, n . light).
    """
    face_index = np.asarray(face_index)
    normals = np.asarray(normals, dtype=np.float64)
    colors = color_array(color)
    lambert = np.clip(normals @ _unit(light), 0.0, None)
    intensity = ambient + (1.0 - ambient) * lambert  # (F,)
    per_face = intensity[:, None] * (colors if colors.ndim == 2 else colors[None, :])
    covered = face_index >= 0
    rgba = np.zeros(face_index.shape + (4,), dtype=np.uint8)
    rgba[covered, :3] = np.clip(np.round(per_face[face_index[covered]] * 255.0), 0, 255).astype(np.uint8)
    rgba[covered, 3] = 255
    return rgba


def downsample(rgba: np.ndarray, factor: int) -> np.ndarray:
    """Average ``factor`` x ``factor`` blocks of an RGBA image (alpha-weighted colour): antialiasing."""
    if factor == 1:
        return rgba
    h, w = rgba.shape[0] // factor, rgba.shape[1] // factor
    blocks = rgba[: h * factor, : w * factor].astype(np.float64).reshape(h, factor, w, factor, 4)
    alpha = blocks[..., 3:4] / 255.0
    coverage = alpha.mean(axis=(1, 3))
    premultiplied = (blocks[..., :3] * alpha).mean(axis=(1, 3))
    color = np.divide(premultiplied, coverage, out=np.zeros_like(premultiplied), where=coverage > 0)
    out = np.concatenate([color, coverage * 255.0], axis=-1)
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


def draw_points(rgba: np.ndarray, xy, radius: float = 1.0, color=(220, 30, 30, 255)) -> np.ndarray:
    """A copy of ``rgba`` with a filled dot of ``radius`` pixels at each screen point (drawn on top)."""
    out = np.array(rgba, dtype=np.uint8, copy=True)
    xy = np.asarray(xy, dtype=np.float64).reshape(-1, 2)
    xy = np.clip(xy[np.all(np.isfinite(xy), axis=1)], -1e6, 1e6)
    value = np.asarray(color, dtype=np.uint8)
    if value.shape == (3,):
        value = np.append(value, np.uint8(255))
    if value.shape != (4,):
        raise InputError(f"draw_points: color {color!r}; expected an RGB or RGBA triple of 0..255")
    reach = int(math.ceil(radius))
    offsets = [
        (dr, dc)
        for dr in range(-reach, reach + 1)
        for dc in range(-reach, reach + 1)
        if dr * dr + dc * dc <= radius * radius + 1e-9
    ]
    rows = np.floor(xy[:, 1]).astype(np.int64)
    cols = np.floor(xy[:, 0]).astype(np.int64)
    h, w = out.shape[:2]
    for dr, dc in offsets:
        r, c = rows + dr, cols + dc
        keep = (r >= 0) & (r < h) & (c >= 0) & (c < w)
        out[r[keep], c[keep]] = value
    return out
