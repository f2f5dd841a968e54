"""A synthetic capture for the photo-camera tests: a procedural object in the network's world (centred
and scaled by the converter's own object sphere), ShapeNet-style cameras, and the same scene moved by
a similarity into an arbitrary "input world", with renderers for any pinhole camera."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial.transform import Rotation

from xmesh.photo import colmap, frame
from xmesh.photo.intrinsics import Intrinsics
from xmesh.render import render_mesh
from xmesh.synthetic import capture, shapenet_cameras
from xmesh.synthetic.shapes import make_shape, sample_surface


@dataclass
class Scene:
    vertices: np.ndarray  # network world, float32
    faces: np.ndarray
    points: np.ndarray  # surface samples, network world, float64
    rows: np.ndarray  # (3, 5) float64 camera rows (float32-representable)
    others: np.ndarray  # (21, 5) the rest of a 24-camera capture around the object
    rotation: np.ndarray  # similarity: input = sigma * rotation @ network + shift
    sigma: float
    shift: np.ndarray

    def to_input(self, p):
        return self.sigma * np.asarray(p, dtype=np.float64) @ self.rotation.T + self.shift

    def from_input(self, p):
        return (np.asarray(p, dtype=np.float64) - self.shift) @ self.rotation / self.sigma

    def network_pose(self, i: int, row=None) -> tuple[np.ndarray, np.ndarray]:
        """View i's (or ``row``'s) network camera: world -> camera rotation (OpenCV axes) and centre."""
        row = self.rows[i] if row is None else row
        az, el, d = np.deg2rad(row[0]), np.deg2rad(row[1]), row[3]
        centre = d * np.array([np.cos(el) * np.cos(az), np.sin(el), np.cos(el) * np.sin(az)])
        return frame.network_rotation(row[0], row[1]), centre

    def input_pose(self, i: int, turn=None, row=None) -> tuple[np.ndarray, np.ndarray]:
        """View i's camera in the input world (world -> camera rotation, centre); ``turn`` rotates the
        camera about its own centre (camera axes), e.g. a roll."""
        rot, centre = self.network_pose(i, row)
        turn = np.eye(3) if turn is None else turn
        return turn @ rot @ self.rotation.T, self.to_input(centre[None])[0]


def make_scene(seed: int = 0, shape: str = "chair") -> Scene:
    rng = np.random.default_rng(seed)
    vertices, faces = make_shape(shape, rng)
    points, _ = sample_surface(vertices, faces, 3000, rng)
    centre, radius = frame.object_sphere(points)
    s = frame.TARGET_RADIUS / radius
    capture = shapenet_cameras(24, rng).astype(np.float32).astype(np.float64)
    chosen = [0, 6, 7]
    rows, others = capture[chosen], np.delete(capture, chosen, axis=0)
    return Scene(
        ((vertices - centre) * s).astype(np.float32),
        faces,
        (points - centre) * s,
        rows,
        others,
        Rotation.random(random_state=seed + 100).as_matrix(),
        float(rng.uniform(0.2, 30.0)),
        rng.uniform(-50, 50, size=3),
    )


def network_intrinsics(size: int) -> Intrinsics:
    """The network's camera (focal 248 px and centred principal point at 224 px) at ``size`` pixels."""
    f = 248.0 * size / 224.0
    return Intrinsics(f, f, size / 2.0, size / 2.0, size, size)


def bgra(rgba: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rgba[:, :, [2, 1, 0, 3]])


def network_photos(scene: Scene, size: int = 137) -> list[np.ndarray]:
    """BGRA renderings through the network's own cameras (what ShapeNetRendering holds)."""
    return [bgra(render_mesh(scene.vertices, scene.faces, row, size=size)) for row in scene.rows]


def render_pinhole(scene: Scene, rotation, centre, k: Intrinsics, supersample: int = 3) -> np.ndarray:
    """BGRA uint8 photo of the object (input world) through any pinhole camera, flat face colours."""
    return capture.render_pinhole(
        scene.to_input(scene.vertices), scene.faces, rotation, centre, k, supersample=supersample
    )


def write_colmap(scene: Scene, folder, names, intrinsics=None, turns=None, other_rolls=None) -> None:
    """The scene's cameras and surface points as a COLMAP text model in the input world; with
    ``other_rolls`` (21 angles) the rest of the capture is registered too, each photo rolled so."""
    intrinsics = list(intrinsics or [network_intrinsics(137)] * 3)
    turns = turns or [np.eye(3)] * 3
    poses = [scene.input_pose(i, turns[i]) for i in range(3)]
    names = list(names)
    if other_rolls is not None:
        for j, (row, angle) in enumerate(zip(scene.others, other_rolls)):
            poses.append(scene.input_pose(0, roll(angle), row=row))
            names.append(f"other_{j:02d}.jpg")
            intrinsics.append(network_intrinsics(137))
    colmap.write_text_model(
        folder, names, [r for r, _ in poses], [-r @ c for r, c in poses], intrinsics, scene.to_input(scene.points)
    )


def roll(degrees: float) -> np.ndarray:
    """A rotation of the camera about its optical axis (camera axes)."""
    return Rotation.from_euler("z", degrees, degrees=True).as_matrix()
