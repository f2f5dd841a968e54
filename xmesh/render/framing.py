"""Views that frame what they show: a camera row's direction, moved and zoomed to fit the bounds.

A :class:`Framing` looks at the middle of the points' bounding box from the azimuth and elevation of
a camera row, at ``DISTANCE_RADII`` bounding-sphere radii (so every point is in front of it), and
zooms the projection so that the larger screen extent of the points is ``fill`` of the panel,
centred. ``zoom`` says how much larger that is than the same points seen from the camera row itself
(None where that camera does not have them all in front of it). Arithmetic is float64, so a mesh
0.001 or 1000 units wide, anywhere, is framed alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xmesh.errors import InputError
from xmesh.model.camera import FOCAL, IMAGE_SIZE, camera_frame

FILL = 0.8  # the framed points' larger screen extent, as a share of the panel side
DISTANCE_RADII = 3.0  # the framed camera's distance from the centre, in bounding-sphere radii
UNIT_FOCAL = FOCAL / IMAGE_SIZE  # the network's focal length in panel widths


def _camera_coordinates(points: np.ndarray, row) -> np.ndarray:
    """World points -> the frame of camera ``row``, in float64 (the axes as xmesh's camera math builds them)."""
    axes, origin = camera_frame(row)
    return (points - origin.astype(np.float64)) @ axes.astype(np.float64).T


def _unit_screen(q: np.ndarray) -> np.ndarray:
    """Camera-frame points -> screen offsets from the principal point in panel widths (column, row)."""
    depth = -q[:, 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        return UNIT_FOCAL * np.stack([q[:, 0] / depth, -q[:, 1] / depth], axis=1)


def _extent(screen: np.ndarray) -> float:
    return float(np.max(screen.max(axis=0) - screen.min(axis=0)))


@dataclass(frozen=True)
class Framing:
    """A framed view. ``center`` (3,): the world point it looks at; ``row``: the framed camera row;
    ``middle`` (2,): the unit-screen point placed at the panel's centre; ``scale``: panel widths per
    unit-screen length; ``zoom``: the framed size over the size seen from the original row (or None)."""

    center: np.ndarray
    row: np.ndarray
    middle: np.ndarray
    scale: float
    zoom: float | None

    def screen(self, world_points, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """World points -> (xy (N, 2) pixel column/row at a ``size`` panel, depth (N,), camera-frame q (N, 3))."""
        q = _camera_coordinates(np.asarray(world_points, dtype=np.float64) - self.center, self.row)
        xy = ((_unit_screen(q) - self.middle) * self.scale + 0.5) * size
        return xy, -q[:, 2], q

    @property
    def label(self) -> str:
        """What a picture says about its scale, e.g. 'fit x12.5' (12.5 times the size the camera saw)."""
        return "fit" if self.zoom is None else f"fit x{self.zoom:.3g}"


def fit_framing(world_points, camera_row, fill: float = FILL) -> Framing:
    """The :class:`Framing` of ``world_points`` (N, 3) seen from ``camera_row``'s direction."""
    points = np.asarray(world_points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != 3 or len(points) == 0 or not np.all(np.isfinite(points)):
        raise InputError(f"fit_framing: points of shape {points.shape}; expected (N, 3) finite coordinates, N >= 1")
    row = np.asarray(camera_row, dtype=np.float64)
    if row.shape != (5,) or not np.all(np.isfinite(row)):
        raise InputError(f"fit_framing: camera row {row.tolist()!r}; expected (azimuth, elevation, 0, distance, fov)")
    if not 0.0 < fill <= 1.0:
        raise InputError(f"fit_framing: fill={fill}; expected a share of the panel in (0, 1]")
    center = (points.min(axis=0) + points.max(axis=0)) / 2.0
    radius = float(np.max(np.linalg.norm(points - center, axis=1)))
    if radius <= 0.0:  # a single point: any distance shows it
        radius = 1.0
    framed_row = row.copy()
    framed_row[3] = DISTANCE_RADII * radius
    screen = _unit_screen(_camera_coordinates(points - center, framed_row))
    lo, hi = screen.min(axis=0), screen.max(axis=0)
    extent = _extent(screen)
    scale = fill / extent if extent > 0 else 1.0
    zoom = None
    original = _camera_coordinates(points, row)
    if np.all(-original[:, 2] > 0):
        seen = _extent(_unit_screen(original))
        zoom = fill / seen if seen > 0 else None
    return Framing(center=center, row=framed_row, middle=(lo + hi) / 2.0, scale=scale, zoom=zoom)
