"""Where posed photos come from: a COLMAP sparse model, or camera-to-world matrices (``poses.json``).

Both end in :func:`xmesh.photo.views.convert`. The object is placed by ``center`` and ``radius``:

* ``center="points"`` (the default where 3D points exist): the sphere of the object's 3D points
  (:func:`xmesh.photo.frame.object_sphere`). The object's points are those inside every view's
  mask, when masks are given, else every point in front of and on all three photos (background
  points seen by all three then count as object: give masks, or ``center="axes"`` and a radius).
* ``center="axes"``: the point nearest every optical axis (photos centred on the object), with
  ``radius`` given, or measured from the 3D points around that centre.
* ``center=(x, y, z)``: that point, with ``radius`` given or measured likewise.

``radius`` always overrides the measured one. Units are the input's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xmesh.errors import FileFormatError, InputError, MissingFileError
from xmesh.io.images import NUM_VIEWS
from xmesh.photo import colmap, frame
from xmesh.photo.intrinsics import Intrinsics
from xmesh.photo.posed import PhotoView, view_label
from xmesh.photo.views import PhotoCameras, check_count, convert

CONVENTIONS = ("opencv", "opengl")
ORTHONORMAL_TOLERANCE = 1e-4


def object_points(views, points, masks) -> np.ndarray:
    """The 3D points that lie inside every view's mask (or, without masks, on every photo)."""
    from xmesh.photo.prepare import load_mask

    points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    keep = np.ones(len(points), dtype=bool)
    masks = (None,) * len(views) if masks is None else masks
    for i, (view, mask) in enumerate(zip(views, masks)):
        uv, front = view.intrinsics.project(view.to_camera(points))
        if mask is None:
            keep &= front & view.intrinsics.inside(uv)
            continue
        what = (
            f"{view_label(i, view)}: mask {str(mask)!r}"
            if isinstance(mask, (str, os.PathLike))
            else f"{view_label(i, view)}: mask"
        )
        binary = load_mask(mask, what)
        height, width = binary.shape
        k = view.intrinsics.scaled_to(width, height, what)
        uv, front = k.project(view.to_camera(points))
        col, row = np.floor(uv[:, 0]).astype(np.int64), np.floor(uv[:, 1]).astype(np.int64)
        on = front & (col >= 0) & (col < width) & (row >= 0) & (row < height)
        hit = np.zeros(len(points), dtype=bool)
        hit[on] = binary[row[on], col[on]]
        keep &= hit
    if keep.sum() < 4:
        where = "every view's mask" if any(m is not None for m in masks) else "all three photos"
        raise InputError(
            f"only {int(keep.sum())} of the {len(points)} 3D points lie inside {where}, too few to place "
            "the object; check the masks and views, or give center='axes' and radius="
        )
    return points[keep]


def place_object(views, points, masks, center, radius) -> tuple[np.ndarray, float]:
    """(centre, radius) in input units from the ``center`` / ``radius`` choice (module docstring)."""
    have_points = points is not None and len(points) > 0
    if isinstance(center, str):
        if center == "points":
            if not have_points:
                raise InputError("center='points': there are no 3D points; give center='axes' (or a point) and radius=")
            middle, measured = frame.object_sphere(object_points(views, points, masks))
            return middle, measured if radius is None else float(radius)
        if center != "axes":
            raise InputError(f"center={center!r}: expected 'points', 'axes' or a 3D point")
        middle = frame.nearest_to_axes([v.centre for v in views], [v.rotation[2] for v in views])
    else:
        middle = np.asarray(center, dtype=np.float64)
        if middle.shape != (3,) or not np.all(np.isfinite(middle)):
            raise InputError(f"center={center!r}: expected 'points', 'axes' or a finite 3D point")
    if radius is not None:
        return middle, float(radius)
    if not have_points:
        raise InputError(
            "radius=: the object's radius (input units) is needed where there are no 3D points to measure it"
        )
    return middle, frame.object_sphere(object_points(views, points, masks), centre=middle)[1]


def _names(images) -> list[str] | None:
    if images is None:
        return None
    if isinstance(images, (str, bytes, os.PathLike)) or not isinstance(images, Sequence):
        raise InputError(f"images={images!r}: expected a sequence of {NUM_VIEWS} photo names or paths")
    check_count(len(images), "images")
    out = []
    for item in images:
        if not isinstance(item, (str, os.PathLike)):
            raise InputError(f"images: {item!r} is not a photo name or path")
        out.append(os.fspath(item))
    return out


def from_colmap(
    sparse_dir: str | os.PathLike,
    images: Sequence[str] | None = None,
    masks=None,
    center: Any = "points",
    radius: float | None = None,
    up=None,
    first_azimuth: float = 0.0,
) -> PhotoCameras:
    """The network's cameras for three photos of a COLMAP sparse model in text form (``cameras.txt``,
    ``images.txt``, ``points3D.txt``; ``colmap model_converter --output_type TXT`` writes them).

    ``images``: the three photos' names as in ``images.txt``, or paths whose file names match them
    (default: the model's photos, when it holds exactly three). ``masks``: one per photo (path or
    array, or None), used to pick the object's 3D points and later to put the photos on white.
    ``up``: the world's up direction (default: estimated from every registered camera, the direction
    most nearly perpendicular to all the photos' horizontals); ``first_azimuth``: view
    0's azimuth in degrees. See the module docstring for ``center`` and ``radius``.
    """
    model = colmap.read_text_model(sparse_dir)
    names = _names(images)
    if names is None:
        check_count(len(model.images), f"COLMAP model {str(model.folder)!r} (no images= given: its registered photos)")
        chosen = list(model.images)
    else:
        chosen = [colmap.find_image(model, name, f"view {i}") for i, name in enumerate(names)]
    views = [
        PhotoView(im.name if names is None else names[i], im.intrinsics, im.rotation, im.center)
        for i, im in enumerate(chosen)
    ]
    everyone = [PhotoView(im.name, im.intrinsics, im.rotation, im.center) for im in model.images]
    masks = _masks(masks)
    middle, size = place_object(views, model.points, masks, center, radius)
    return convert(views, middle, size, up=up, first_azimuth=first_azimuth, masks=masks, up_from=everyone)


def _masks(masks):
    if masks is None:
        return None
    if isinstance(masks, (str, bytes, os.PathLike)) or not hasattr(masks, "__len__") or len(masks) != NUM_VIEWS:
        raise InputError(f"masks: expected {NUM_VIEWS} masks (paths, arrays or None), one per photo")
    return tuple(masks)


def _matrix(value, what: str) -> np.ndarray:
    try:
        m = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{what}: camera_to_world is not a matrix of numbers ({exc})") from None
    if m.shape not in ((4, 4), (3, 4)) or not np.all(np.isfinite(m)):
        raise InputError(
            f"{what}: camera_to_world has shape {m.shape}; expected a finite 4x4 (or 3x4) camera-to-world matrix"
        )
    rot = m[:3, :3]
    if np.abs(rot.T @ rot - np.eye(3)).max() > ORTHONORMAL_TOLERANCE or np.linalg.det(rot) < 0:
        raise InputError(
            f"{what}: the rotation part of camera_to_world is not a rotation (orthonormal, determinant +1); "
            "remove any scale from the pose"
        )
    return m


def _number(entry: dict, key: str, what: str, default=None) -> float | None:
    value = entry.get(key, default)
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{what}: {key}={value!r} is not a number") from None
    if not np.isfinite(value):
        raise InputError(f"{what}: {key}={value!r} is not finite")
    return value


def pose_view(entry: dict, index: int, convention: str) -> PhotoView:
    """One poses.json view: camera_to_world (4x4), fx, fy, cx, cy, optional width, height, image,
    and distortion k1, k2, p1, p2, k3 (OpenCV's model)."""
    if not isinstance(entry, dict) or "camera_to_world" not in entry:
        raise InputError(f"view {index}: expected an object with camera_to_world, fx, fy, cx, cy")
    name = str(entry.get("image", ""))
    what = f"view {index}" + (f" ({name})" if name else "")
    m = _matrix(entry["camera_to_world"], what)
    values = {k: _number(entry, k, what) for k in ("fx", "fy", "cx", "cy")}
    missing = [k for k, v in values.items() if v is None]
    if missing:
        raise InputError(f"{what}: missing {', '.join(missing)}; expected the intrinsics fx, fy, cx, cy in pixels")
    if values["fx"] <= 0 or values["fy"] <= 0:
        raise InputError(f"{what}: focal lengths fx={values['fx']}, fy={values['fy']}; expected > 0")
    size = [_number(entry, k, what) for k in ("width", "height")]
    if (
        (size[0] is None) != (size[1] is None)
        or size[0] is not None
        and (min(size) < 1 or any(int(s) != s for s in size))
    ):
        raise InputError(f"{what}: width={size[0]}, height={size[1]}; expected both (positive integers) or neither")
    distortion = {k: _number(entry, k, what) for k in ("k1", "k2", "p1", "p2", "k3") if k in entry}
    axes = m[:3, :3] if convention == "opencv" else m[:3, :3] @ frame.OPENCV_FROM_NETWORK
    k = Intrinsics(
        values["fx"],
        values["fy"],
        values["cx"],
        values["cy"],
        None if size[0] is None else int(size[0]),
        None if size[1] is None else int(size[1]),
        distortion,
    )
    return PhotoView(name, k, axes.T.copy(), m[:3, 3].copy())


def read_poses(path: str | os.PathLike) -> dict:
    """A poses.json file as a dict (see :func:`from_poses` for the layout)."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"poses file {str(path)!r} does not exist; expected a JSON file with a 'views' list")
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FileFormatError(f"poses file {str(path)!r} is not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("views"), list):
        raise FileFormatError(f"poses file {str(path)!r}: expected an object with a 'views' list")
    return data


def _order(views: list[PhotoView], names: list[str] | None) -> list[PhotoView]:
    """The views in the order of the photos given (matched by name when the views are named)."""
    if names is None or not all(v.name for v in views):
        check_count(len(views), "poses")
        if names is not None:
            views = [PhotoView(n, v.intrinsics, v.rotation, v.centre) for n, v in zip(names, views)]
        return views
    out = []
    for i, name in enumerate(names):
        matches = [v for v in views if v.name == name] or [v for v in views if Path(v.name).name == Path(name).name]
        if len(matches) != 1:
            known = ", ".join(v.name for v in views)
            raise InputError(
                f"view {i} ({name}): {'no' if not matches else 'several'} pose(s) for this photo among "
                f"the poses' images ({known}); expected exactly one"
            )
        out.append(PhotoView(name, matches[0].intrinsics, matches[0].rotation, matches[0].centre))
    return out


def from_poses(
    poses: Any,
    images: Sequence[str] | None = None,
    masks=None,
    center: Any = None,
    radius: float | None = None,
    up=None,
    first_azimuth: float | None = None,
    points=None,
    convention: str | None = None,
) -> PhotoCameras:
    """The network's cameras from camera-to-world matrices with intrinsics.

    ``poses``: a ``poses.json`` path, or its content as a dict or a list of views::

        {"convention": "opencv",           # camera axes: x right, y down, z forward (COLMAP, OpenCV);
                                           # "opengl": x right, y up, z backward (NeRF, Blender)
         "views": [{"image": "a.jpg", "camera_to_world": [[...], [...], [...], [0, 0, 0, 1]],
                    "fx": 1500, "fy": 1500, "cx": 960, "cy": 540, "width": 1920, "height": 1080}, ...],
         "center": "axes", "radius": 0.15, "up": [0, 0, 1], "points": [[x, y, z], ...]}

    Pixel coordinates as COLMAP's: (0, 0) is the top-left corner of the photo. Keywords override the
    file's entries; ``center`` defaults to "points" where points are given, else "axes" (then
    ``radius`` is required). ``images`` picks and orders the views by their "image" names.
    """
    if isinstance(poses, (str, os.PathLike)):
        data = read_poses(poses)
    elif isinstance(poses, dict):
        data = poses
    elif isinstance(poses, Sequence):
        data = {"views": list(poses)}
    else:
        raise InputError(f"poses: a {type(poses).__name__}; expected a poses.json path, a dict or a list of views")
    convention = convention or data.get("convention", "opencv")
    if convention not in CONVENTIONS:
        raise InputError(f"convention={convention!r}: expected one of {', '.join(CONVENTIONS)}")
    entries = data.get("views")
    if not isinstance(entries, list):
        raise InputError("poses: expected a 'views' list of camera entries")
    everyone = [pose_view(e, i, convention) for i, e in enumerate(entries)]
    views = _order(everyone, _names(images))
    points = data.get("points") if points is None else points
    if points is not None:
        points = np.asarray(points, dtype=np.float64)
        if points.ndim != 2 or points.shape[1] != 3 or not np.all(np.isfinite(points)):
            raise InputError(f"points: shape {points.shape}; expected finite (N, 3) coordinates")
    center = data.get("center", "points" if points is not None else "axes") if center is None else center
    radius = _number(data, "radius", "poses") if radius is None else radius
    up = data.get("up") if up is None else up
    first_azimuth = float(data.get("first_azimuth", 0.0)) if first_azimuth is None else first_azimuth
    masks = _masks(masks)
    middle, size = place_object(views, points, masks, center, radius)
    return convert(views, middle, size, up=up, first_azimuth=first_azimuth, masks=masks, up_from=everyone)
