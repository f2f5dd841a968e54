"""The network's world frame for a set of photos: object centre, scale, up direction, azimuth 0.

Pixel2Mesh++ was trained on ShapeNet renderings: the object centred at the origin and scaled to a
sphere of radius :data:`TARGET_RADIUS` (the scale of xmesh's synthetic objects, which matches the
official demo's predictions), y up, and each camera at (azimuth, elevation, distance) looking at the
origin with its x axis horizontal (roll 0). Every quantity here is a similarity invariant of the
input: rotating, translating or scaling the input world changes none of the network's cameras.
"""

from __future__ import annotations

import numpy as np

from xmesh.errors import InputError
from xmesh.model.camera import OBJECT_RADIUS
from xmesh.photo.enclosing_sphere import smallest_enclosing_sphere

TARGET_RADIUS = OBJECT_RADIUS
STRAY_DISTANCE = 4.0  # points beyond this many median distances from the centre are strays
SPHERE_PASSES = 3  # each pass measures the strays from the last pass's centre
DEGENERATE_UP = 1e-3  # second-smallest eigenvalue share below which the right axes fix no up
OPENCV_FROM_NETWORK = np.diag([1.0, -1.0, -1.0])  # network camera axes (y up, z back) -> OpenCV (y down, z forward)


def _unit(v) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


def object_sphere(points, centre=None) -> tuple[np.ndarray, float]:
    """(centre, radius) of an object's 3D points: the smallest sphere enclosing those that are not
    strays, whose centre does not follow the points' density (feature detectors crowd points on
    textured parts). Points farther from the centre than :data:`STRAY_DISTANCE` times the median
    distance are strays, found in :data:`SPHERE_PASSES` passes from the points' coordinate-wise
    median. With ``centre`` given it is kept, and the radius is the largest distance from it of
    the points that are not strays."""
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != 3 or len(points) < 4:
        raise InputError(
            f"object points: shape {points.shape}; at least 4 points (N, 3) are needed to place the object"
        )
    if centre is not None:
        middle = np.asarray(centre, dtype=np.float64)
        distance = np.linalg.norm(points - middle, axis=1)
        return middle, float(distance[distance <= STRAY_DISTANCE * np.median(distance)].max())
    middle = np.median(points, axis=0)
    for _ in range(SPHERE_PASSES):
        distance = np.linalg.norm(points - middle, axis=1)
        middle, radius = smallest_enclosing_sphere(points[distance <= STRAY_DISTANCE * np.median(distance)])
    return middle, radius


def nearest_to_axes(centres, directions) -> np.ndarray:
    """The point nearest (least squares) to every optical axis (camera centre + t direction)."""
    system, right = np.zeros((3, 3)), np.zeros(3)
    for c, d in zip(np.asarray(centres, dtype=np.float64), np.asarray(directions, dtype=np.float64)):
        d = _unit(d)
        across = np.eye(3) - np.outer(d, d)
        system += across
        right += across @ c
    if np.linalg.cond(system) > 1e8:
        raise InputError(
            "center='axes': the optical axes are (nearly) parallel, so no point lies nearest to all "
            "of them; give center= (a point) or use the 3D points (center='points')"
        )
    return np.linalg.solve(system, right)


def estimate_up(right_axes, camera_ups) -> np.ndarray:
    """World up from the cameras: the direction most nearly perpendicular to every camera's x axis
    (the photo's horizontal; exact when every roll is 0), signed like the cameras' own up (-y);
    the mean camera up where the x axes are all parallel (every view from one azimuth)."""
    right = np.asarray(right_axes, dtype=np.float64)
    ups = np.asarray(camera_ups, dtype=np.float64)
    values, vectors = np.linalg.eigh(right.T @ right)
    mean_up = ups.sum(axis=0)
    if values[1] <= DEGENERATE_UP * values.sum():
        return _unit(mean_up)
    up = vectors[:, 0]
    return up if up @ mean_up >= 0 else -up


def normalising_rotation(up, direction0, azimuth0: float) -> np.ndarray:
    """R (3, 3) taking input directions to the network's world axes: y along ``up``, and the
    horizontal part of ``direction0`` (object centre -> view 0's camera) at azimuth ``azimuth0``
    degrees (the network's azimuth turns from +x towards +z)."""
    up = _unit(up)
    horizontal = direction0 - (direction0 @ up) * up
    if np.linalg.norm(horizontal) <= 1e-9 * np.linalg.norm(direction0):
        raise InputError(
            "view 0 looks straight down (or up) the up direction, so its azimuth is undefined; "
            "choose another first view"
        )
    ex = _unit(horizontal)
    ez = np.cross(ex, up)
    a = np.deg2rad(azimuth0)
    turn = np.array([[np.cos(a), 0.0, -np.sin(a)], [0.0, 1.0, 0.0], [np.sin(a), 0.0, np.cos(a)]])
    return turn @ np.stack([ex, up, ez])


def spherical(p) -> tuple[float, float, float]:
    """(azimuth deg, elevation deg, distance) of a network-frame camera centre p, as camera rows hold them."""
    x, y, z = (float(v) for v in p)
    return (np.degrees(np.arctan2(z, x)), np.degrees(np.arctan2(y, np.hypot(x, z))), float(np.linalg.norm(p)))


def network_rotation(azimuth: float, elevation: float) -> np.ndarray:
    """The world -> camera rotation, OpenCV axes, of the network's camera at (azimuth, elevation):
    the rows X, Y, Z of ``xmesh.model.camera.camera_frames`` in float64, y and z flipped."""
    theta, phi = np.deg2rad(azimuth), np.deg2rad(elevation)
    z = np.array([np.cos(phi) * np.cos(theta), np.sin(phi), np.cos(phi) * np.sin(theta)])
    y = np.array([np.sin(phi) * np.cos(theta + np.pi), np.cos(phi), np.sin(phi) * np.sin(theta + np.pi)])
    x = np.cross(y, z)
    frame = np.stack([_unit(x), _unit(y), _unit(z)])
    return OPENCV_FROM_NETWORK @ frame
