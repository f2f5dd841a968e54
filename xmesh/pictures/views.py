"""One labelled RGB panel: a mesh or a point set framed to fit (or seen from the camera), or an input image;
a mesh file's three views side by side (:func:`render_mesh_file`, ``xmesh render``).

Framed panels look from a camera row's direction at the middle of what they show and zoom it to
fill ``FILL`` of the panel (:mod:`xmesh.render.framing`); their label says so, with the zoom
against the camera's own view. Points given with a mesh are framed together with it.
"""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np

from xmesh.errors import FileFormatError, InputError, MissingFileError
from xmesh.io.cameras import load_cameras
from xmesh.io.images import quiet_opencv
from xmesh.mesh import read_mesh
from xmesh.pictures.panels import hstack, on_white, put_label
from xmesh.render.draw import (
    DEFAULT_COLOR,
    GT_COLOR,
    SHAPENET_SIZE,
    load_points,
    render_mesh,
    render_points,
    render_views,
    save_png,
    tile,
    to_world,
)
from xmesh.render.framing import fit_framing

PANEL_SIZE = 224


def _title(title: str, note: str) -> str:
    return f"{title}, {note}" if title else note


def mesh_panel(
    vertices,
    faces,
    camera_row,
    size: int = PANEL_SIZE,
    *,
    points=None,
    frame: str = "camera0",
    camera0_row=None,
    camera_view: bool = False,
    title: str = "",
    color=DEFAULT_COLOR,
    point_radius: float | None = None,
):
    """(RGB (size, size, 3) panel, its Framing or None): the mesh framed from ``camera_row``'s direction,
    or with ``camera_view`` seen by that camera as the network saw its input. ``frame="camera0"`` (the
    network's output frame) needs ``camera0_row``; ``points`` (ground truth) are overlaid in red."""
    if frame == "camera0" and camera0_row is None:
        camera0_row = camera_row
    framing = None
    if not camera_view:
        bounds = to_world(np.asarray(vertices, dtype=np.float32), frame, camera0_row)
        if points is not None:
            bounds = np.concatenate([bounds, to_world(np.asarray(points, dtype=np.float32)[:, :3], frame, camera0_row)])
        framing = fit_framing(bounds, camera_row)
    rgba = render_mesh(
        vertices,
        faces,
        camera_row,
        size=size,
        points=points,
        color=color,
        frame=frame,
        camera0_row=camera0_row,
        framing=framing,
        point_radius=point_radius,
    )
    note = "camera view" if framing is None else framing.label
    return put_label(on_white(rgba), _title(title, note)), framing


def points_panel(
    points,
    camera_row,
    size: int = PANEL_SIZE,
    *,
    frame: str = "camera0",
    camera0_row=None,
    title: str = "",
    color=GT_COLOR,
):
    """(RGB panel, Framing): a point set (e.g. the ground truth) framed from ``camera_row``'s direction."""
    if frame == "camera0" and camera0_row is None:
        camera0_row = camera_row
    points = np.asarray(points, dtype=np.float32)
    if points.ndim != 2 or points.shape[1] < 3 or len(points) == 0:
        raise InputError(f"points_panel: points of shape {points.shape}; expected (N, 3), N >= 1")
    framing = fit_framing(to_world(points[:, :3], frame, camera0_row), camera_row)
    rgba = render_points(
        points[:, :3], camera_row, size=size, color=color, frame=frame, camera0_row=camera0_row, framing=framing
    )
    return put_label(on_white(rgba), _title(title, framing.label)), framing


def read_rgba(path) -> np.ndarray:
    """An image file -> RGBA uint8 (grey, RGB and RGBA files alike); errors name the file."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise MissingFileError(f"image {path!r} does not exist")
    with quiet_opencv():
        image = cv2.imdecode(np.fromfile(path, dtype=np.uint8), cv2.IMREAD_UNCHANGED)
    if image is None or image.ndim not in (2, 3):
        raise FileFormatError(f"image {path!r}: OpenCV cannot decode it; expected a PNG or JPEG picture")
    if image.dtype != np.uint8:
        image = (image.astype(np.float64) * 255.0 / np.iinfo(image.dtype).max).round().astype(np.uint8)
    if image.ndim == 2:
        return cv2.cvtColor(image, cv2.COLOR_GRAY2RGBA)
    code = cv2.COLOR_BGRA2RGBA if image.shape[2] == 4 else cv2.COLOR_BGR2RGBA
    return cv2.cvtColor(image, code)


def image_panel(image, size: int = PANEL_SIZE, title: str = "") -> np.ndarray:
    """An input image (a path or an RGBA/RGB uint8 array) on white, scaled to a ``size`` square, labelled."""
    rgba = read_rgba(image) if isinstance(image, (str, os.PathLike)) else np.asarray(image)
    rgb = on_white(rgba)
    h, w = rgb.shape[:2]
    side = max(h, w)
    square = np.full((side, side, 3), 255, dtype=np.uint8)
    square[(side - h) // 2 : (side - h) // 2 + h, (side - w) // 2 : (side - w) // 2 + w] = rgb
    interpolation = cv2.INTER_AREA if side > size else cv2.INTER_LINEAR
    panel = cv2.resize(square, (size, size), interpolation=interpolation)
    return put_label(panel, title) if title else panel


def render_mesh_file(
    mesh_path,
    cameras_path,
    out_png,
    gt_points=None,
    *,
    size: int = SHAPENET_SIZE,
    views=None,
    frame: str = "camera0",
    camera_view: bool = False,
) -> Path:
    """Render an OBJ/PLY mesh from each of the 3 views of ``cameras_path`` (as ``load_cameras`` picks
    them) and write the views side by side into ``out_png``. The mesh (and ``gt_points``, an array or
    a points file, see :func:`load_points`) are in camera 0's frame, like the network's output,
    unless ``frame="world"``. Each view is framed to fit the mesh (and points), from the camera's
    direction, on white and labelled with its zoom; ``camera_view=True`` draws what the cameras
    themselves see instead (transparent background, no label: the alignment with the inputs).
    Backs ``xmesh render MESH --cameras F --out PNG``."""
    mesh = read_mesh(mesh_path)
    if len(mesh.faces) == 0:
        raise FileFormatError(f"{mesh_path}: the mesh has no faces; nothing to render")
    points = None if gt_points is None else load_points(gt_points)
    return render_mesh_picture(
        mesh, load_cameras(cameras_path, views), out_png, points, size=size, frame=frame, camera_view=camera_view
    )


def render_mesh_picture(
    mesh, cameras, out_png, points=None, *, size: int = SHAPENET_SIZE, frame: str = "camera0", camera_view: bool = False
) -> Path:
    """:func:`render_mesh_file` for a :class:`xmesh.mesh.Mesh`, the (3, 5) camera rows and (N, 3) points."""
    if camera_view:
        images = render_views(
            mesh.vertices, mesh.faces, cameras, size=size, points=points, frame=frame, camera0_row=cameras[0]
        )
        return save_png(out_png, tile(images))
    panels = [
        mesh_panel(
            mesh.vertices,
            mesh.faces,
            row,
            size,
            points=points,
            frame=frame,
            camera0_row=cameras[0],
            title=f"view {index + 1}",
        )[0]
        for index, row in enumerate(cameras)
    ]
    return save_png(out_png, hstack(panels))
