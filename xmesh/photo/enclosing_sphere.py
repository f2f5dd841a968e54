"""The smallest sphere enclosing a set of 3D points (Welzl's algorithm, exact up to rounding).

Its centre depends only on the points farthest out, not on how densely the rest are sampled, so
it places an object whose 3D points crowd on its textured side where the points' mean would not.
The points are visited in a seeded random order (expected linear time); each level of the
recursion keeps one more point on the boundary, at most four.
"""

from __future__ import annotations

import numpy as np

from xmesh.errors import InputError

SHUFFLE_SEED = 0
RELATIVE_SLACK = 1e-12  # a point this far (times the points' extent) outside still counts as inside


def _sphere_through(boundary: np.ndarray) -> tuple[np.ndarray, float]:
    """The smallest sphere with every one of 1-4 ``boundary`` points on it: its centre lies in their
    affine hull, equidistant from all of them (least squares where they are degenerate)."""
    origin = boundary[0]
    if len(boundary) == 1:
        return origin.copy(), 0.0
    edges = boundary[1:] - origin
    gram = 2.0 * edges @ edges.T
    weights = np.linalg.lstsq(gram, np.einsum("ij,ij->i", edges, edges), rcond=None)[0]
    centre = origin + weights @ edges
    return centre, float(np.sqrt(np.max(np.sum((boundary - centre) ** 2, axis=1))))


def _enclose(points: np.ndarray, count: int, boundary: list, slack: float) -> tuple[np.ndarray, float]:
    """The smallest sphere holding ``points[:count]`` with the ``boundary`` points on it."""
    centre, radius = _sphere_through(np.array(boundary)) if boundary else (points[0].copy(), 0.0)
    if len(boundary) == 4:
        return centre, radius
    start = 0 if boundary else 1
    while start < count:
        distance = np.sqrt(np.sum((points[start:count] - centre) ** 2, axis=1))
        outside = np.flatnonzero(distance > radius + slack)
        if not outside.size:
            break
        index = start + int(outside[0])
        centre, radius = _enclose(points, index, boundary + [points[index]], slack)
        start = index + 1
    return centre, radius


def smallest_enclosing_sphere(points) -> tuple[np.ndarray, float]:
    """(centre (3,) float64, radius) of the smallest sphere holding every one of ``points`` (N, 3)."""
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != 3 or len(points) < 1 or not np.all(np.isfinite(points)):
        raise InputError(f"points: shape {points.shape}; expected (N, 3) finite coordinates, N >= 1")
    order = np.random.default_rng(SHUFFLE_SEED).permutation(len(points))
    shuffled = np.ascontiguousarray(points[order])
    extent = float(np.ptp(points, axis=0).max())
    centre, _ = _enclose(shuffled, len(shuffled), [], RELATIVE_SLACK * extent)
    return centre, float(np.sqrt(np.max(np.sum((points - centre) ** 2, axis=1))))
