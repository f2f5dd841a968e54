"""Render meshes the way the network sees the world: xmesh's camera rows and pinhole projection.

A world point p seen by camera row r: q = world_to_camera(p, r); at an image of ``size`` pixels,
row h = f (-q_y)/(-q_z) + size/2 and column w = f q_x/(-q_z) + size/2 with f = 248 size / 224 (the
network's 248 px focal length at 224 px). At size 224 this is exactly ``xmesh.model.camera.project``
(without its clamp). ``h``/``w`` are continuous: pixel (r, c) spans [r, r+1) x [c, c+1).

Meshes the network outputs live in camera 0's frame: pass ``frame="camera0"`` and the row of
camera 0, and they are first mapped back with ``camera_to_world``.
"""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np

from xmesh.errors import FileFormatError, InputError, MissingFileError
from xmesh.io.atomic import atomic_write
from xmesh.model.camera import FOCAL, IMAGE_SIZE, camera_to_world, world_to_camera
from xmesh.render.framing import Framing
from xmesh.render.raster import color_array, downsample, draw_points, rasterize, shade

SHAPENET_SIZE = 137
DEFAULT_COLOR = (0.72, 0.72, 0.76)
GT_COLOR = (220 / 255, 30 / 255, 30 / 255)  # ground truth, red in every picture: drawn alone or over a mesh
POINT_COLOR = (220, 30, 30, 255)  # GT_COLOR as the RGBA bytes of points drawn over a mesh
FRAMES = ("world", "camera0")
DEPTH_SHADES = 6
FAR_SHADE = 0.45


def focal_length(size: int) -> float:
    """The focal length in pixels at an image of ``size`` pixels (248 at 224)."""
    return FOCAL * size / IMAGE_SIZE


def _check_row(row, what: str) -> np.ndarray:
    row = np.asarray(row, dtype=np.float64)
    if row.shape != (5,) or not np.all(np.isfinite(row)) or not row[3] > 0:
        raise InputError(
            f"{what}: {np.asarray(row).tolist()!r}; expected a camera row "
            "(azimuth deg, elevation deg, 0, distance > 0, 25)"
        )
    return row


def _check_points(points, what: str) -> np.ndarray:
    points = np.asarray(points)
    if points.ndim != 2 or points.shape[1] < 3 or not np.issubdtype(points.dtype, np.number):
        raise InputError(f"{what}: shape {points.shape}; expected (N, 3) coordinates (extra columns ignored)")
    points = points[:, :3].astype(np.float32)
    if not np.all(np.isfinite(points)):
        raise InputError(f"{what}: holds NaN or infinite coordinates")
    return points


def _check_mesh(vertices, faces) -> tuple[np.ndarray, np.ndarray]:
    vertices = _check_points(vertices, "render_mesh: vertices")
    faces = np.asarray(faces)
    if faces.ndim != 2 or faces.shape[1] != 3 or not np.issubdtype(faces.dtype, np.integer):
        raise InputError(f"render_mesh: faces have shape {faces.shape} / dtype {faces.dtype}; expected (F, 3) integers")
    faces = faces.astype(np.int64)
    if faces.size and (faces.min() < 0 or faces.max() >= len(vertices)):
        raise InputError(f"render_mesh: face indices must lie in [0, {len(vertices) - 1}] (0-based)")
    return vertices, faces


def to_world(points, frame: str, camera0_row=None) -> np.ndarray:
    """Points given in ``frame`` ("world" or "camera0") -> world coordinates."""
    if frame not in FRAMES:
        raise InputError(f"frame={frame!r}; expected one of {FRAMES}")
    if frame == "world":
        return np.asarray(points, dtype=np.float32)
    if camera0_row is None:
        raise InputError('frame="camera0" needs camera0_row, the camera row the points are expressed in')
    return camera_to_world(points, _check_row(camera0_row, "camera0_row"))


def screen_coordinates(world_points, camera_row, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """World points -> (xy (N, 2) = (column w, row h), depth -q_z (N,), camera-frame q (N, 3))."""
    q = world_to_camera(world_points, camera_row).astype(np.float64)
    depth = -q[:, 2]
    f = focal_length(size)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = f * (-q[:, 1]) / depth + size / 2.0
        w = f * q[:, 0] / depth + size / 2.0
    return np.stack([w, h], axis=1), depth, q


def render_mesh(
    vertices,
    faces,
    camera_row,
    size: int = SHAPENET_SIZE,
    points=None,
    color=DEFAULT_COLOR,
    frame: str = "world",
    camera0_row=None,
    supersample: int = 2,
    point_radius: float | None = None,
    point_color=POINT_COLOR,
    framing: Framing | None = None,
) -> np.ndarray:
    """An RGBA uint8 (size, size, 4) image of the mesh seen by ``camera_row``: flat Lambert shading,
    transparent background, antialiased by ``supersample`` x ``supersample`` samples per pixel. ``points`` (N, 3),
    in the same frame as the vertices, are drawn on top as dots (e.g. a ground-truth overlay).
    With a ``framing`` (:func:`xmesh.render.framing.fit_framing` of the world points) the mesh is
    seen through that framed view instead of the camera itself."""
    vertices, faces = _check_mesh(vertices, faces)
    row = _check_row(camera_row, "camera_row")
    if int(size) != size or size < 1:
        raise InputError(f"render_mesh: size={size}; expected a positive integer")
    if int(supersample) != supersample or supersample < 1:
        raise InputError(f"render_mesh: supersample={supersample}; expected a positive integer")
    colors = color_array(color, "render_mesh: color")
    if colors.ndim == 2 and len(colors) != len(faces):
        raise InputError(f"render_mesh: {len(colors)} face colours for {len(faces)} faces")
    size, factor = int(size), int(supersample)
    big = size * factor
    project = (lambda world, n: screen_coordinates(world, row, n)) if framing is None else framing.screen
    xy, depth, q = project(to_world(vertices, frame, camera0_row), big)
    face_index, _ = rasterize(xy, depth, faces, big, big)
    a, b, c = q[faces[:, 0]], q[faces[:, 1]], q[faces[:, 2]]
    normals = np.cross(b - a, c - a)
    length = np.linalg.norm(normals, axis=1, keepdims=True)
    normals = np.divide(normals, length, out=np.zeros_like(normals), where=length > 0)
    # two-sided: turn every normal towards the camera (at the origin of q)
    centroid = (a + b + c) / 3.0
    normals *= np.where(np.einsum("ij,ij->i", normals, -centroid) < 0, -1.0, 1.0)[:, None]
    image = downsample(shade(face_index, normals, colors), factor)
    if points is not None:
        points = _check_points(points, "render_mesh: points")
        pxy, pdepth, _ = project(to_world(points, frame, camera0_row), size)
        radius = max(1.0, size / 137.0) if point_radius is None else float(point_radius)
        image = draw_points(image, pxy[pdepth > 0], radius=radius, color=point_color)
    return image


def render_points(
    points,
    camera_row,
    size: int = SHAPENET_SIZE,
    color=GT_COLOR,
    frame: str = "world",
    camera0_row=None,
    framing: Framing | None = None,
    radius: float | None = None,
) -> np.ndarray:
    """An RGBA uint8 (size, size, 4) image of a point set (e.g. ground truth) as dots, the far ones
    drawn first and darker (``DEPTH_SHADES`` steps from full ``color`` down to ``FAR_SHADE`` of it)."""
    row = _check_row(camera_row, "camera_row")
    points = to_world(_check_points(points, "render_points: points"), frame, camera0_row)
    size = int(size)
    if size < 1:
        raise InputError(f"render_points: size={size}; expected a positive integer")
    xy, depth, _ = screen_coordinates(points, row, size) if framing is None else framing.screen(points, size)
    keep = depth > 0
    xy, depth = xy[keep], depth[keep]
    order = np.argsort(-depth, kind="stable")  # far to near
    base = color_array(color, "render_points: color") * 255.0
    radius = max(1.0, size / 160.0) if radius is None else float(radius)
    image = np.zeros((size, size, 4), dtype=np.uint8)
    for step, chunk in enumerate(np.array_split(order, DEPTH_SHADES)):
        shade_of = FAR_SHADE + (1.0 - FAR_SHADE) * step / max(DEPTH_SHADES - 1, 1)
        rgba = (*np.clip(np.round(base * shade_of), 0, 255).astype(np.uint8).tolist(), 255)
        image = draw_points(image, xy[chunk], radius=radius, color=rgba)
    return image


def render_views(
    mesh_or_vertices,
    faces=None,
    cameras=None,
    *,
    size: int = SHAPENET_SIZE,
    points=None,
    color=DEFAULT_COLOR,
    frame: str = "world",
    camera0_row=None,
    supersample: int = 2,
) -> list[np.ndarray]:
    """One :func:`render_mesh` image per camera row of ``cameras`` (V, 5).

    ``mesh_or_vertices``: an object with ``vertices`` and ``faces`` (e.g. ``xmesh.mesh.Mesh``), or the
    vertices with ``faces`` given. With ``frame="camera0"`` camera 0 defaults to ``cameras[0]``."""
    if hasattr(mesh_or_vertices, "vertices") and hasattr(mesh_or_vertices, "faces"):
        vertices = mesh_or_vertices.vertices
        faces = mesh_or_vertices.faces if faces is None else faces
    else:
        vertices = mesh_or_vertices
    if faces is None:
        raise InputError("render_views: no faces; pass a Mesh or vertices and faces")
    if cameras is None:
        raise InputError("render_views: no cameras; expected (V, 5) camera rows")
    cameras = np.asarray(cameras, dtype=np.float64)
    if cameras.ndim != 2 or cameras.shape[1] != 5 or len(cameras) == 0:
        raise InputError(f"render_views: cameras have shape {cameras.shape}; expected (V, 5) camera rows")
    if frame == "camera0" and camera0_row is None:
        camera0_row = cameras[0]
    return [
        render_mesh(
            vertices,
            faces,
            row,
            size=size,
            points=points,
            color=color,
            frame=frame,
            camera0_row=camera0_row,
            supersample=supersample,
        )
        for row in cameras
    ]


def tile(images) -> np.ndarray:
    """Images of equal height side by side, left to right."""
    images = [np.asarray(im) for im in images]
    if not images or len({im.shape[0] for im in images}) != 1 or len({im.shape[2:] for im in images}) != 1:
        raise InputError("tile: expected one or more images of the same height and channel count")
    return np.concatenate(images, axis=1)


def save_png(path: str | os.PathLike, rgba) -> Path:
    """Write an RGBA (H, W, 4) or RGB (H, W, 3) uint8 image as a PNG, atomically."""
    image = np.asarray(rgba)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] not in (3, 4) or 0 in image.shape:
        raise InputError(
            f"save_png({str(path)!r}): image of shape {image.shape} / dtype {image.dtype}; "
            "expected (H, W, 4) RGBA or (H, W, 3) RGB uint8"
        )
    code = cv2.COLOR_RGBA2BGRA if image.shape[2] == 4 else cv2.COLOR_RGB2BGR
    ok, encoded = cv2.imencode(".png", cv2.cvtColor(np.ascontiguousarray(image), code))
    if not ok:
        raise InputError(f"save_png({str(path)!r}): OpenCV could not encode the image as PNG")
    with atomic_write(path, "wb") as handle:
        handle.write(encoded.tobytes())
    return Path(path)


def load_points(source) -> np.ndarray:
    """Ground-truth points from an array (N, >=3), an .xyz text file, a .npy file, or a ground-truth
    pickle (.dat / .pkl: a (image, points) tuple or a points array, read by the restricted loader)."""
    if not isinstance(source, (str, os.PathLike)):
        return _check_points(source, "gt_points")
    path = Path(source)
    suffix = path.suffix.lower()
    if suffix in (".dat", ".pkl", ".pickle"):
        from xmesh.io import safe_pickle

        data = safe_pickle.load(path, what="ground-truth points")
        if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[1], np.ndarray):
            data = data[1]
        if not isinstance(data, np.ndarray):
            raise FileFormatError(f"{path}: expected an (image, points) tuple or a points array in the pickle")
        return _check_points(data, f"ground-truth points in {path}")
    if suffix == ".npy":
        if not path.is_file():
            raise MissingFileError(f"{path}: no such points file")
        try:
            array = np.load(path, allow_pickle=False)
        except ValueError as exc:
            raise FileFormatError(f"{path}: not a plain .npy array ({exc})") from None
        return _check_points(array, f"points in {path}")
    from xmesh.mesh import read_xyz

    return read_xyz(path)
