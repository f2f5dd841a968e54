"""A synthetic hand-held capture: photos of a procedural object from pinhole cameras around it (any
intrinsics, a little roll and aim error), their masks, and the COLMAP text model of the capture in an
arbitrary world (z up, other units), to try ``xmesh reconstruct --colmap`` without a camera.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from xmesh.photo import colmap, frame
from xmesh.photo.intrinsics import Intrinsics
from xmesh.render.raster import downsample, rasterize, shade
from xmesh.synthetic.shapes import as_rng, make_shape, sample_surface

PHONE = Intrinsics(620.0, 620.0, 322.0, 236.0, 640, 480)  # a phone photo scaled to 640x480
WORLD_SCALE = 5.0  # the capture's units per network unit


def face_colours(faces, seed: int = 7) -> np.ndarray:
    """A flat colour per face, so that every camera sees the same colours (no lighting)."""
    return np.random.default_rng(seed).uniform(0.1, 0.9, size=(len(faces), 3))


def render_pinhole(vertices, faces, rotation, centre, k: Intrinsics, colours=None, supersample: int = 3) -> np.ndarray:
    """BGRA uint8 photo of a mesh through any pinhole camera: world -> camera ``rotation`` (OpenCV
    axes), camera ``centre``, intrinsics ``k`` (distortion applied to the vertices); each face flat."""
    cam = (np.asarray(vertices, dtype=np.float64) - centre) @ np.asarray(rotation).T
    big = Intrinsics(
        k.fx * supersample, k.fy * supersample, k.cx * supersample, k.cy * supersample, distortion=k.distortion
    )
    uv, _ = big.project(cam)
    index, _ = rasterize(uv, cam[:, 2], faces, k.height * supersample, k.width * supersample)
    colours = face_colours(faces) if colours is None else colours
    rgba = shade(index, np.zeros((len(faces), 3)), colours, ambient=1.0)
    return np.ascontiguousarray(downsample(rgba, supersample)[:, :, [2, 1, 0, 3]])


def _look_at(centre, target, up) -> np.ndarray:
    forward = (target - centre) / np.linalg.norm(target - centre)
    right = np.cross(forward, up)
    right /= np.linalg.norm(right)
    return np.stack([right, np.cross(forward, right), forward])  # rows: x right, y down, z forward


def write_capture(folder, shape: str = "car", views: int = 24, seed: int = 0, k: Intrinsics = PHONE) -> dict:
    """Write ``{folder}/photos/IMG_00NN.png`` (RGB), ``{folder}/masks/IMG_00NN.png`` and the COLMAP
    text model ``{folder}/sparse/0``. Cameras circle the object at 25-35 degrees of elevation and
    0.7-0.85 network units (times :data:`WORLD_SCALE`), each rolled and aimed off by up to 3 degrees.
    Returns {"photos", "masks", "sparse"}."""
    rng = as_rng(seed)
    folder = Path(folder)
    vertices, faces = make_shape(shape, rng)
    points, _ = sample_surface(vertices, faces, 4000, rng)
    # the capture's world: z up, metres-like units, the object off the origin
    to_world = np.array([[1.0, 0, 0], [0, 0, -1.0], [0, 1.0, 0]]) * WORLD_SCALE
    shift = np.array([0.4, -1.2, 0.8])
    world_vertices, world_points = vertices @ to_world.T + shift, points @ to_world.T + shift
    up = to_world[:, 1] / WORLD_SCALE
    names, rotations, translations, photos, masks = [], [], [], [], []
    for i in range(views):
        azimuth = np.deg2rad(360.0 * i / views + rng.uniform(-3, 3))
        elevation = np.deg2rad(rng.uniform(25, 35))
        distance = rng.uniform(0.7, 0.85) / frame.TARGET_RADIUS * np.linalg.norm(vertices, axis=1).max()
        local = distance * np.array(
            [np.cos(elevation) * np.cos(azimuth), np.sin(elevation), np.cos(elevation) * np.sin(azimuth)]
        )
        centre = local @ to_world.T + shift
        aim = shift + rng.uniform(-0.03, 0.03, size=3) * WORLD_SCALE * distance
        rot = _look_at(centre, aim, up)
        tilt = np.deg2rad(rng.uniform(-3, 3))
        rot = np.array([[np.cos(tilt), -np.sin(tilt), 0], [np.sin(tilt), np.cos(tilt), 0], [0, 0, 1]]) @ rot
        photo = render_pinhole(world_vertices, faces, rot, centre, k)
        name = f"IMG_{i:04d}.png"
        for sub, image in (
            ("photos", photo[:, :, :3]),
            ("masks", np.where(photo[:, :, 3] > 0, 255, 0).astype(np.uint8)),
        ):
            (folder / sub).mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(folder / sub / name), image)
        names.append(name)
        rotations.append(rot)
        translations.append(-rot @ centre)
        photos.append(folder / "photos" / name)
        masks.append(folder / "masks" / name)
    sparse = folder / "sparse" / "0"
    colmap.write_text_model(sparse, names, rotations, translations, [k] * views, world_points)
    return {"photos": photos, "masks": masks, "sparse": sparse}
