"""COLMAP's sparse model in its text form: ``cameras.txt``, ``images.txt``, ``points3D.txt``.

``images.txt`` gives each registered photo's pose as world -> camera, X_cam = R(q) X + t, with the
quaternion q = (w, x, y, z) and COLMAP's camera frame (x right, y down, z forward). COLMAP writes
binary ``.bin`` files by default; ``colmap model_converter --output_type TXT`` turns them into text.
:func:`write_text_model` writes the same files (tests and synthetic captures use it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xmesh.errors import FileFormatError, InputError, MissingFileError
from xmesh.io.atomic import atomic_write
from xmesh.photo.intrinsics import MODELS, Intrinsics, from_model

FILES = ("cameras.txt", "images.txt", "points3D.txt")


@dataclass(frozen=True)
class RegisteredImage:
    """One registered photo: its name in COLMAP (relative to the image folder), world -> camera
    rotation (3, 3) and translation (3,), and its camera's intrinsics."""

    image_id: int
    name: str
    rotation: np.ndarray
    translation: np.ndarray
    intrinsics: Intrinsics

    @property
    def center(self) -> np.ndarray:
        """The camera centre in world coordinates, -R^T t."""
        return -self.rotation.T @ self.translation


@dataclass(frozen=True)
class SparseModel:
    images: list  # RegisteredImage, in the file's order
    points: np.ndarray  # (N, 3) float64 world coordinates
    folder: Path


def quaternion_to_rotation(q) -> np.ndarray:
    """A unit quaternion (w, x, y, z) -> its rotation matrix (normalised first)."""
    w, x, y, z = np.asarray(q, dtype=np.float64) / np.linalg.norm(q)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def rotation_to_quaternion(r) -> np.ndarray:
    """A rotation matrix -> the unit quaternion (w, x, y, z) with w >= 0 (the largest-component method)."""
    r = np.asarray(r, dtype=np.float64)
    k = (
        np.array(
            [
                [r[0, 0] - r[1, 1] - r[2, 2], r[1, 0] + r[0, 1], r[2, 0] + r[0, 2], r[2, 1] - r[1, 2]],
                [r[1, 0] + r[0, 1], r[1, 1] - r[0, 0] - r[2, 2], r[2, 1] + r[1, 2], r[0, 2] - r[2, 0]],
                [r[2, 0] + r[0, 2], r[2, 1] + r[1, 2], r[2, 2] - r[0, 0] - r[1, 1], r[1, 0] - r[0, 1]],
                [r[2, 1] - r[1, 2], r[0, 2] - r[2, 0], r[1, 0] - r[0, 1], r[0, 0] + r[1, 1] + r[2, 2]],
            ]
        )
        / 3.0
    )
    values, vectors = np.linalg.eigh(k)
    x, y, z, w = vectors[:, np.argmax(values)]
    q = np.array([w, x, y, z])
    return -q if w < 0 else q


def _lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of a model file, comment lines dropped (blank lines kept: images.txt
    writes an empty 2D-points line for a photo without observations)."""
    if not path.is_file():
        raise MissingFileError(
            f"COLMAP model file {str(path)!r} does not exist; expected the text model ({', '.join(FILES)})"
        )
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileFormatError(
            f"{str(path)!r} is not UTF-8 text (byte {exc.start}); expected COLMAP's text model"
        ) from exc
    return [(n, line) for n, line in enumerate(text.splitlines(), start=1) if not line.lstrip().startswith("#")]


def _numbers(tokens, path: Path, lineno: int, what: str) -> list[float]:
    try:
        values = [float(t) for t in tokens]
    except ValueError:
        raise FileFormatError(
            f"{str(path)!r}, line {lineno}: {what} {' '.join(tokens)!r} are not all numbers"
        ) from None
    if not np.all(np.isfinite(values)):
        raise FileFormatError(f"{str(path)!r}, line {lineno}: {what} hold NaN or infinite values")
    return values


def read_cameras(path: Path) -> dict[int, Intrinsics]:
    """cameras.txt: CAMERA_ID MODEL WIDTH HEIGHT PARAMS[] -> {camera id: Intrinsics}."""
    cameras = {}
    for lineno, line in _lines(path):
        tokens = line.split()
        if not tokens:
            continue
        if len(tokens) < 5:
            raise FileFormatError(
                f"{str(path)!r}, line {lineno}: {line.strip()!r}; expected CAMERA_ID MODEL WIDTH HEIGHT PARAMS..."
            )
        camera_id, model = tokens[0], tokens[1]
        size = _numbers(tokens[2:4], path, lineno, "WIDTH HEIGHT")
        params = _numbers(tokens[4:], path, lineno, "camera parameters")
        if not camera_id.isdigit() or min(size) < 1 or any(int(s) != s for s in size):
            raise FileFormatError(
                f"{str(path)!r}, line {lineno}: {line.strip()!r}; expected an integer camera id "
                "and a positive integer WIDTH and HEIGHT"
            )
        what = f"{str(path)!r}, line {lineno} (camera {camera_id})"
        cameras[int(camera_id)] = from_model(model, int(size[0]), int(size[1]), params, what)
    return cameras


def read_images(path: Path, cameras: dict[int, Intrinsics]) -> list[RegisteredImage]:
    """images.txt: pairs of lines, IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME, then the 2D points."""
    lines = _lines(path)
    if len(lines) % 2 and not lines[-1][1].strip():
        lines = lines[:-1]
    images = []
    for (lineno, line), _ in zip(lines[0::2], lines[1::2] + [(0, "")]):
        tokens = line.split()
        if len(tokens) < 10:
            raise FileFormatError(
                f"{str(path)!r}, line {lineno}: {line.strip()!r}; expected IMAGE_ID QW QX QY QZ "
                "TX TY TZ CAMERA_ID NAME (then a line of 2D points)"
            )
        values = _numbers(tokens[1:8], path, lineno, "QW QX QY QZ TX TY TZ")
        if not tokens[0].isdigit() or not tokens[8].isdigit():
            raise FileFormatError(f"{str(path)!r}, line {lineno}: IMAGE_ID and CAMERA_ID must be integers")
        if int(tokens[8]) not in cameras:
            raise FileFormatError(f"{str(path)!r}, line {lineno}: camera {tokens[8]} is not in cameras.txt")
        if np.linalg.norm(values[:4]) == 0:
            raise FileFormatError(f"{str(path)!r}, line {lineno}: the quaternion is zero")
        images.append(
            RegisteredImage(
                int(tokens[0]),
                " ".join(tokens[9:]),
                quaternion_to_rotation(values[:4]),
                np.asarray(values[4:7]),
                cameras[int(tokens[8])],
            )
        )
    return images


def read_points(path: Path) -> np.ndarray:
    """points3D.txt: POINT3D_ID X Y Z R G B ERROR TRACK[] -> (N, 3) float64 positions."""
    rows = []
    for lineno, line in _lines(path):
        tokens = line.split()
        if not tokens:
            continue
        if len(tokens) < 4:
            raise FileFormatError(
                f"{str(path)!r}, line {lineno}: {line.strip()!r}; expected POINT3D_ID X Y Z R G B ERROR TRACK..."
            )
        rows.append(_numbers(tokens[1:4], path, lineno, "X Y Z"))
    return np.asarray(rows, dtype=np.float64).reshape(-1, 3)


def read_text_model(folder: str | os.PathLike) -> SparseModel:
    """The photos, poses, intrinsics and 3D points of a COLMAP sparse model folder (text form)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MissingFileError(
            f"COLMAP model folder {str(folder)!r} does not exist; expected a sparse model "
            f"folder holding {', '.join(FILES)} (e.g. sparse/0)"
        )
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        binary = [name for name in ("cameras.bin", "images.bin", "points3D.bin") if (folder / name).is_file()]
        hint = (
            f"; it holds COLMAP's binary model ({', '.join(binary)}): convert it with `colmap model_converter "
            f"--input_path {folder} --output_path {folder} --output_type TXT`"
            if binary
            else ""
        )
        raise MissingFileError(f"COLMAP model folder {str(folder)!r} lacks {', '.join(missing)}{hint}")
    cameras = read_cameras(folder / "cameras.txt")
    images = read_images(folder / "images.txt", cameras)
    return SparseModel(images, read_points(folder / "points3D.txt"), folder)


def find_image(model: SparseModel, name: str, what: str) -> RegisteredImage:
    """The registered photo called ``name``: its COLMAP name, or else a unique match of the file name alone."""
    exact = [im for im in model.images if im.name == name]
    if exact:
        return exact[0]
    base = Path(name).name
    matches = [im for im in model.images if Path(im.name).name == base]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise InputError(
            f"{what}: {name!r} matches several registered photos ({', '.join(m.name for m in matches)}); "
            "give the name as COLMAP writes it in images.txt"
        )
    known = ", ".join(im.name for im in model.images[:10]) + (" ..." if len(model.images) > 10 else "")
    raise InputError(
        f"{what}: photo {name!r} was not registered by COLMAP (not in {str(model.folder / 'images.txt')!r}, "
        f"which holds {len(model.images)} photo(s): {known}); re-run COLMAP with more overlap between "
        "the photos, or choose a registered one"
    )


def write_text_model(folder: str | os.PathLike, names, rotations, translations, intrinsics, points) -> Path:
    """Write a COLMAP text model: one PINHOLE (or distorted) camera and one registered photo per
    entry of ``names``, world -> camera ``rotations`` (V, 3, 3) and ``translations`` (V, 3), and the
    3D ``points`` (N, 3) with empty tracks. Floats are written with ``repr`` (exact)."""
    folder = Path(folder)
    camera_lines, image_lines = [], []
    for i, (name, rot, trans, k) in enumerate(zip(names, rotations, translations, intrinsics), start=1):
        model = "OPENCV" if k.distorted else "PINHOLE"
        params = [k.fx, k.fy, k.cx, k.cy] + (
            [k.distortion.get(n, 0.0) for n in MODELS["OPENCV"][0][4:]] if k.distorted else []
        )
        camera_lines.append(f"{i} {model} {k.width} {k.height} " + " ".join(repr(float(p)) for p in params))
        q = rotation_to_quaternion(rot)
        image_lines.append(f"{i} " + " ".join(repr(float(v)) for v in (*q, *trans)) + f" {i} {name}")
        image_lines.append("")
    point_lines = [
        f"{i} " + " ".join(repr(float(v)) for v in p) + " 128 128 128 0" for i, p in enumerate(points, start=1)
    ]
    header = "# written by xmesh\n"
    for name, lines in zip(FILES, (camera_lines, image_lines, point_lines)):
        with atomic_write(folder / name, "w") as handle:
            handle.write(header + "".join(line + "\n" for line in lines))
    return folder
