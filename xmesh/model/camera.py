"""Camera rows -> camera frames, and the pinhole projection of the original code.

A camera row is (azimuth deg, elevation deg, unused, distance, unused). Mesh coordinates live in
camera 0's frame; a point is moved into view i's frame by ``to_camera_i(from_camera_0(p))``.
Frames are computed on the host in float32 (as the original graph did); the per-point transforms
use only ``@``, ``-`` and ``+`` so they run unchanged on NumPy or CuPy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FOCAL = 248.0  # pixels, at the 224x224 network input
CENTER = 112.0  # principal point
MAX_PIXEL = 223.0  # projections are clamped to [0, MAX_PIXEL]
IMAGE_SIZE = 224
OBJECT_RADIUS = 0.24  # the objects' size in the network's world (xmesh.synthetic.shapes says why)


def camera_frames(rows) -> tuple[np.ndarray, np.ndarray]:
    """(C, o) for camera rows (..., 5): C (..., 3, 3) with rows the unit X, Y, Z axes, o (..., 3) the
    (unnormalised) Z vector. Element-wise float32 arithmetic, in the same order for every row."""
    rows = np.asarray(rows, dtype=np.float32)
    pi = np.float32(np.pi)
    theta = rows[..., 0] * pi / np.float32(180.0)
    phi = rows[..., 1] * pi / np.float32(180.0)
    d = rows[..., 3]
    camy = d * np.sin(phi)
    lens = d * np.cos(phi)
    camx = lens * np.cos(theta)
    camz = lens * np.sin(theta)
    y0, y1, y2 = camy * np.cos(theta + pi), lens, camy * np.sin(theta + pi)
    # x = y cross z in np.cross's arithmetic (y1 z2 - y2 z1, ...) without its overhead (half of this function's time)
    x0, x1, x2 = y1 * camz - y2 * camy, y2 * camx - y0 * camz, y0 * camy - y1 * camx
    axes = np.stack([x0, x1, x2, y0, y1, y2, camx, camy, camz], axis=-1).reshape(rows.shape[:-1] + (3, 3))
    norms = np.sqrt(np.sum(axes * axes, axis=-1, dtype=np.float32))
    return (axes / norms[..., None]).astype(np.float32), axes[..., 2, :].copy()


def camera_frame(row) -> tuple[np.ndarray, np.ndarray]:
    """(C, o) for one camera row: C's rows are the unit X, Y, Z axes, o the (unnormalised) Z vector."""
    c, o = camera_frames(np.asarray(row, dtype=np.float32)[None])
    return c[0], o[0]


def packed_transforms(cameras) -> np.ndarray:
    """Camera rows (B, V, 5) -> (B, 12 + 12V) float32: per sample ``from0`` (9), ``origin0`` (3), ``rot``
    (9V) and ``origin`` (3V) of :class:`ViewTransforms`, flattened in that order, all samples at once."""
    cameras = np.asarray(cameras, dtype=np.float32)
    batch, views = cameras.shape[:2]
    frames, origin = camera_frames(cameras)
    rot = np.swapaxes(frames, -1, -2)
    from0 = np.linalg.inv(rot[:, 0].astype(np.float64)).astype(np.float32)
    return np.concatenate(
        [from0.reshape(batch, 9), origin[:, 0], rot.reshape(batch, 9 * views), origin.reshape(batch, 3 * views)], axis=1
    ).astype(np.float32)


def unpack_transforms(packed, views: int) -> tuple:
    """(from0, origin0, rot, origin) as views of :func:`packed_transforms` rows (..., 12 + 12V)."""
    lead = tuple(packed.shape[:-1])
    return (
        packed[..., :9].reshape(lead + (3, 3)),
        packed[..., 9:12],
        packed[..., 12 : 12 + 9 * views].reshape(lead + (views, 3, 3)),
        packed[..., 12 + 9 * views :].reshape(lead + (views, 3)),
    )


@dataclass(frozen=True)
class ViewTransforms:
    """Everything the projections need to map camera-0 points into each view, as host float32.

    ``from0`` = (C_0^T)^-1 and ``origin0`` = o_0 undo camera 0; ``rot[i]`` = C_i^T and
    ``origin[i]`` = o_i apply view i: q_i = (p @ from0 + origin0 - origin[i]) @ rot[i].
    """

    from0: np.ndarray  # (3,3)
    origin0: np.ndarray  # (3,)
    rot: np.ndarray  # (V,3,3)
    origin: np.ndarray  # (V,3)

    @classmethod
    def from_cameras(cls, cameras) -> ViewTransforms:
        cameras = np.asarray(cameras, dtype=np.float32)
        return cls(*unpack_transforms(packed_transforms(cameras[None])[0], cameras.shape[0]))


def mat3(p, m):
    """Row vectors p (..., 3) times m (..., 3, 3) in the original's float32 order,
    ((p0*m0 + p1*m1) + p2*m2), each product and sum rounded (no fused multiply-add)."""
    return (p[..., 0:1] * m[..., 0, :] + p[..., 1:2] * m[..., 1, :]) + p[..., 2:3] * m[..., 2, :]


def to_view(points, tf: ViewTransforms, view: int, xp=np):
    """Camera-0 points (..., 3) -> view ``view``'s camera frame (out of camera 0, into the view)."""
    world = mat3(points, xp.asarray(tf.from0)) + xp.asarray(tf.origin0)
    return mat3(world - xp.asarray(tf.origin[view]), xp.asarray(tf.rot[view]))


def project(q, xp=np):
    """View-frame points (..., 3) -> clamped pixel rows h and columns w, as the original computes them."""
    x, y, z = q[..., 0], q[..., 1], q[..., 2]
    h = FOCAL * ((-y) / (-z)) + CENTER
    w = FOCAL * (x / (-z)) + CENTER
    return xp.clip(h, 0.0, MAX_PIXEL), xp.clip(w, 0.0, MAX_PIXEL)


def world_to_camera(points, row) -> np.ndarray:
    """World (object) coordinates -> the frame of the camera ``row`` (host NumPy)."""
    c, o = camera_frame(row)
    return ((np.asarray(points, dtype=np.float32) - o) @ c.T).astype(np.float32)


def camera_to_world(points, row) -> np.ndarray:
    """The inverse of :func:`world_to_camera` (host NumPy)."""
    c, o = camera_frame(row)
    return (np.asarray(points, dtype=np.float32) @ np.linalg.inv(c.T) + o).astype(np.float32)
