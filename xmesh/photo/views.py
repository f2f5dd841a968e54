"""Real cameras -> the network's camera rows, and the similarity between the two worlds.

:func:`convert` takes three posed photos (:class:`~xmesh.photo.posed.PhotoView`: intrinsics, world -> camera rotation
in OpenCV axes, camera centre) and an object centre and radius, and returns :class:`PhotoCameras`:
the (3, 5) rows (azimuth, elevation, 0, distance, 25), the map between the input world and the
network's, and the per-view image preparation (:mod:`xmesh.photo.prepare`).

Assumptions. Up is given, or estimated from every camera of the capture (all registered photos) as
the direction most nearly perpendicular to every photo's horizontal: exact when no photo is rolled,
and a few degrees of hand-held roll average out over a capture around the object. Azimuth 0
is view 0's (``first_azimuth`` moves it; the network's output does not depend on it). Each network
camera sits where the real camera was and looks at the object centre with roll 0: a real camera
that points elsewhere or is rolled differs from it by a rotation about its own centre, which a
pinhole photo undoes exactly by reprojection, so the photo is resampled into the network's view
(rolled photos come out turned upright, off-centre objects centred) rather than rejected.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from xmesh.errors import InputError
from xmesh.io.cameras import DISTANCE_WARNING, FIELD_OF_VIEW, TRAINED_DISTANCES
from xmesh.io.images import NUM_VIEWS
from xmesh.model.camera import camera_frame
from xmesh.photo import frame
from xmesh.photo.posed import view_label
from xmesh.photo.prepare import prepare_photos

WEAK_UP = 0.1  # second-smallest share of the x axes' spread below which up is weakly fixed
MAX_ELEVATION = 89.0  # the network's camera frame is undefined straight above the object


@dataclass(frozen=True)
class PhotoCameras:
    """Three photos' cameras in the network's convention, and the similarity to their world.

    ``table``: (3, 5) float64 rows; ``rows``: the float32 rows the network reads. A point p of the
    input world sits at ``scale * rotation @ (p - centre)`` in the network's world, where the object
    is centred at the origin with radius :data:`frame.TARGET_RADIUS`. ``masks``: per view a mask
    (path or array) or None, applied when the photos are prepared.
    """

    views: tuple
    table: np.ndarray
    centre: np.ndarray
    radius: float
    rotation: np.ndarray
    masks: tuple = (None, None, None)

    @property
    def rows(self) -> np.ndarray:
        return self.table.astype(np.float32)

    @property
    def names(self) -> tuple:
        return tuple(v.name for v in self.views)

    @property
    def scale(self) -> float:
        """Network units per input unit."""
        return frame.TARGET_RADIUS / self.radius

    def to_network(self, points) -> np.ndarray:
        """Input-world points (N, 3) -> the network's world (float64)."""
        return self.scale * (np.asarray(points, dtype=np.float64) - self.centre) @ self.rotation.T

    def to_input(self, points) -> np.ndarray:
        """The network's world (N, 3) -> input-world points (float64)."""
        return np.asarray(points, dtype=np.float64) @ self.rotation / self.scale + self.centre

    def camera0_to_input(self, points) -> np.ndarray:
        """Points in camera 0's frame, where the network's meshes live, -> the input world (float32).
        Camera 0's frame is the network's own float32 one (``xmesh.model.camera.camera_frame``)."""
        axes, origin = camera_frame(self.rows[0])
        world = np.asarray(points, dtype=np.float64) @ np.linalg.inv(axes.T.astype(np.float64)) + origin
        return self.to_input(world).astype(np.float32)

    def input_to_camera0(self, points) -> np.ndarray:
        """The inverse of :meth:`camera0_to_input`: input-world points -> camera 0's frame (float32)."""
        axes, origin = camera_frame(self.rows[0])
        network = self.to_network(points)
        return ((network - origin.astype(np.float64)) @ axes.T.astype(np.float64)).astype(np.float32)

    def place(self, mesh):
        """A network mesh (camera 0's frame) -> the same mesh in the input world, to overlay the
        photos' own reconstruction. A similarity keeps the faces' orientation."""
        from xmesh.mesh import Mesh

        coarse = None if mesh.coarse_vertices is None else self.camera0_to_input(mesh.coarse_vertices)
        return Mesh(self.camera0_to_input(mesh.vertices), mesh.faces, coarse)

    def virtual_rotation(self, index: int) -> np.ndarray:
        """World (input) -> camera rotation, OpenCV axes, of the network's camera for view ``index``."""
        azimuth, elevation = self.table[index, 0], self.table[index, 1]
        return frame.network_rotation(azimuth, elevation) @ self.rotation

    def roll_degrees(self) -> np.ndarray:
        """Per view, the angle (degrees) by which the photo is turned about its optical axis from the
        network's upright camera at the same place (the photo's x axis, seen in that camera)."""
        out = []
        for i, view in enumerate(self.views):
            x = self.virtual_rotation(i) @ view.rotation[0]
            out.append(np.degrees(np.arctan2(x[1], x[0])))
        return np.asarray(out)

    def off_axis_degrees(self) -> np.ndarray:
        """Per view, the angle between the optical axis and the direction to the object centre."""
        out = []
        for v in self.views:
            towards = self.centre - v.centre
            out.append(np.degrees(np.arccos(np.clip(v.rotation[2] @ towards / np.linalg.norm(towards), -1.0, 1.0))))
        return np.asarray(out)

    def prepare_images(self, images, masks=None) -> np.ndarray:
        """The three photos (paths or arrays) resampled into the network's views: (3, 224, 224, 3)
        float32 BGR in [0, 1]; ``masks`` (else the ones given with the cameras) mark the object."""
        return prepare_photos(self, images, self.masks if masks is None else masks)

    def describe(self) -> str:
        """One line per view: its row and how much its photo is turned to match the network's camera."""
        lines = [f"object centre {np.round(self.centre, 6).tolist()}, radius {self.radius:.6g} (input units)"]
        for i, (v, roll, off) in enumerate(zip(self.views, self.roll_degrees(), self.off_axis_degrees())):
            az, el, _, d, _ = self.table[i]
            lines.append(
                f"{view_label(i, v)}: azimuth {az:.3f}, elevation {el:.3f}, distance {d:.4f}; "
                f"roll {roll:.2f} deg, object {off:.2f} deg off the optical axis"
            )
        return "\n".join(lines)


def check_count(count: int, what: str) -> None:
    if count < NUM_VIEWS:
        raise InputError(f"{what}: {count} view(s); Pixel2Mesh++ needs exactly {NUM_VIEWS} photos of the object")
    if count > NUM_VIEWS:
        raise InputError(
            f"{what}: {count} views; Pixel2Mesh++ takes exactly {NUM_VIEWS}: choose three "
            "(spread around the object, e.g. 90-150 degrees apart)"
        )


def check_facing(views, centre) -> None:
    """Every camera must have the object centre in front of it and on its photo."""
    for i, view in enumerate(views):
        q = view.to_camera(centre[None])[0]
        if q[2] <= 1e-12 * np.linalg.norm(q):
            raise InputError(
                f"{view_label(i, view)}: the camera looks away from the object: the object centre "
                f"{np.round(centre, 6).tolist()} lies behind it; check the pose (camera-to-world, "
                "OpenCV or OpenGL axes?) and that the photo shows the object"
            )
        uv, _ = view.intrinsics.project(q[None])
        if not view.intrinsics.inside(uv)[0]:
            k = view.intrinsics
            raise InputError(
                f"{view_label(i, view)}: the camera looks away from the object: the object centre "
                f"projects to pixel ({uv[0, 0]:.1f}, {uv[0, 1]:.1f}), outside the {k.width}x{k.height} "
                "photo; check the pose and the object centre"
            )


def estimate_up(views) -> np.ndarray:
    """World up from the cameras' axes (see :func:`frame.estimate_up`); warns where the cameras fix it
    poorly (x axes all within a narrow fan, where a few degrees of roll tilt the estimate a lot)."""
    right = np.asarray([v.rotation[0] for v in views])
    spread = np.linalg.eigvalsh(right.T @ right)
    if spread[1] < WEAK_UP * spread.sum():
        warnings.warn(
            f"the up direction is estimated from {len(views)} cameras whose horizontals nearly agree, so a "
            "little roll tilts it much: pass up= (--up), or cameras from all around the object",
            stacklevel=4,
        )
    return frame.estimate_up(right, [-v.rotation[1] for v in views])


def convert(
    views, centre, radius: float, up=None, first_azimuth: float = 0.0, masks=None, up_from=None
) -> PhotoCameras:
    """Three posed photos, the object's centre and radius (input units) -> :class:`PhotoCameras`.
    ``up_from``: the cameras that estimate up when ``up`` is None (default the three; every
    registered photo of a capture fixes it far better)."""
    views = tuple(views)
    check_count(len(views), "cameras")
    centre = np.asarray(centre, dtype=np.float64)
    if centre.shape != (3,) or not np.all(np.isfinite(centre)):
        raise InputError(f"center={centre.tolist()}: expected a finite 3D point")
    if not (np.isfinite(radius) and radius > 0):
        raise InputError(f"radius={radius}: expected the object's radius, a number > 0, in the input's units")
    check_facing(views, centre)
    up = estimate_up(views if up_from is None else up_from) if up is None else np.asarray(up, dtype=np.float64)
    if up.shape != (3,) or not np.all(np.isfinite(up)) or np.linalg.norm(up) == 0:
        raise InputError(f"up={up.tolist()}: expected a nonzero 3D direction")
    rotation = frame.normalising_rotation(up, views[0].centre - centre, float(first_azimuth))
    scale = frame.TARGET_RADIUS / radius
    table = np.zeros((NUM_VIEWS, 5))
    for i, view in enumerate(views):
        azimuth, elevation, distance = frame.spherical(scale * rotation @ (view.centre - centre))
        if abs(elevation) > MAX_ELEVATION:
            raise InputError(
                f"{view_label(i, view)}: elevation {elevation:.2f} deg: the camera is (nearly) straight "
                "above or below the object, where the network's cameras are undefined; choose a photo "
                f"within {MAX_ELEVATION:g} deg of the horizon, or give up="
            )
        table[i] = ((first_azimuth if i == 0 else azimuth) % 360.0, elevation, 0.0, distance, FIELD_OF_VIEW)
    far = [
        f"{view_label(i, v)}: {d:.3f}"
        for i, (v, d) in enumerate(zip(views, table[:, 3]))
        if not DISTANCE_WARNING[0] <= d <= DISTANCE_WARNING[1]
    ]
    if far:
        warnings.warn(
            f"camera distances in the network's frame ({'; '.join(far)}) are far from those it was trained "
            f"on ({TRAINED_DISTANCES[0]}-{TRAINED_DISTANCES[1]}, object radius {frame.TARGET_RADIUS}): the "
            "object fills much more or less of the photo than in training",
            stacklevel=3,
        )
    masks = (None,) * NUM_VIEWS if masks is None else tuple(masks)
    return PhotoCameras(views, table, centre, float(radius), rotation, masks)
