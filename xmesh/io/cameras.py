"""Camera rows: (azimuth deg, elevation deg, unused, distance, unused), one per input view.

Sources: an array-like of shape (3, 5), or (V, 5) with ``views`` choosing 3 rows; or a text file
of such rows, whitespace (or comma) separated, such as the demo ``cameras.txt`` or ShapeNet's
``rendering_metadata.txt`` (24 rows, one per rendering). ``views`` defaults to (0, 6, 7) for a file
named ``rendering_metadata.txt`` (the renderings Pixel2Mesh++ used) and to (0, 1, 2) otherwise.
"""

from __future__ import annotations

import numbers
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xmesh.errors import FileFormatError, InputError, MissingFileError
from xmesh.io.images import NUM_VIEWS

NUM_COLUMNS = 5
DISTANCE_COLUMN = 3
SHAPENET_METADATA_NAME = "rendering_metadata.txt"
SHAPENET_DEFAULT_VIEWS = (0, 6, 7)
DEFAULT_VIEWS = tuple(range(NUM_VIEWS))
FIELD_OF_VIEW = 25.0  # the fifth column of ShapeNet's rows (the network reads none)
TRAINED_DISTANCES = (0.62, 0.88)  # ShapeNet rendering distances the network was trained on
DISTANCE_WARNING = (0.45, 1.3)  # beyond these the object is much larger / smaller than in training


ROWS_COUNT = "camera rows count from 0, as --views and views= do; lines from 1"


def read_camera_file(path: str | os.PathLike) -> np.ndarray:
    """All rows of a camera text file as (V, 5) float64; blank lines and '#' comments are skipped."""
    return _read_rows(path)[0]


def _read_rows(path: str | os.PathLike) -> tuple[np.ndarray, list[int]]:
    """(the rows of a camera file, the line number, from 1, of each row)."""
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"camera file {str(path)!r} does not exist; expected a text file of camera rows")
    if path.is_dir():
        raise InputError(
            f"camera path {str(path)!r} is a directory; expected a cameras.txt or {SHAPENET_METADATA_NAME} file"
        )
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileFormatError(
            f"camera file {str(path)!r} is not UTF-8 text (byte {exc.start}); expected lines of {NUM_COLUMNS} numbers"
        ) from exc
    rows: list[list[float]] = []
    lines: list[int] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        content = line.split("#", 1)[0].replace(",", " ").split()
        if not content:
            continue
        if len(content) != NUM_COLUMNS:
            raise FileFormatError(
                f"camera file {str(path)!r}, line {lineno}: {len(content)} values; expected {NUM_COLUMNS} "
                f"(azimuth deg, elevation deg, 0, distance, 25) (camera row {len(rows)}; {ROWS_COUNT})"
            )
        try:
            rows.append([float(token) for token in content])
            lines.append(lineno)
        except ValueError as exc:
            raise FileFormatError(
                f"camera file {str(path)!r}, line {lineno}: {line.strip()!r} is not {NUM_COLUMNS} numbers ({exc}) "
                f"(camera row {len(rows)}; {ROWS_COUNT})"
            ) from exc
    if not rows:
        raise FileFormatError(
            f"camera file {str(path)!r} holds no camera rows; expected lines of {NUM_COLUMNS} numbers"
        )
    return np.asarray(rows, dtype=np.float64), lines


def _check_views(views: Any, count: int, source: str) -> list[int]:
    if isinstance(views, (str, bytes)) or not isinstance(views, Sequence) and not isinstance(views, np.ndarray):
        raise InputError(f"views={views!r}: expected a sequence of {NUM_VIEWS} row indices")
    views = list(views)
    if len(views) != NUM_VIEWS:
        raise InputError(f"views={views!r}: {len(views)} indices; {NUM_VIEWS} views are needed")
    out = []
    for v in views:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
            raise InputError(f"views={views!r}: {v!r} is not an integer row index")
        if not 0 <= int(v) < count:
            raise InputError(
                f"views={views!r}: index {int(v)} is out of range; {source} has {count} rows (0..{count - 1})"
            )
        out.append(int(v))
    return out


def _validate_rows(rows: np.ndarray, chosen: list[int], source: str, lines: list[int] | None = None) -> None:
    """Check the chosen rows: finite, distance > 0; messages give the row index in the source, counted from 0
    as ``views`` counts them (and, for a file, its line, counted from 1 as editors count them)."""
    for i in chosen:
        line = f" (line {lines[i]}; {ROWS_COUNT})" if lines else ""
        with np.errstate(over="ignore", invalid="ignore"):
            finite = np.all(np.isfinite(rows[i])) and np.all(np.isfinite(rows[i].astype(np.float32)))
        if not finite:
            raise InputError(
                f"{source}: camera row {i} {rows[i].tolist()} holds NaN or infinite values (or values "
                "beyond the float32 range, about 3.4e38); expected finite numbers{line}"
            )
        if not rows[i, DISTANCE_COLUMN] > 0:
            raise InputError(
                f"{source}: camera row {i} has distance {rows[i, DISTANCE_COLUMN]:g} (column {DISTANCE_COLUMN}); "
                f"expected a distance > 0{line}"
            )


def unlike_training_cameras(rows: np.ndarray, numbers: Sequence[int] | None = None) -> list[str]:
    """How camera rows differ from the ShapeNet cameras the network was trained on: a reason to warn
    per odd value, each naming its row (``numbers``, the rows' indices in their source, counted from 0;
    default 0, 1, 2, ...), empty when they look like training's."""
    reasons = []
    rows = np.asarray(rows, dtype=np.float64)
    for i, row in zip(range(len(rows)) if numbers is None else numbers, rows, strict=True):
        distance, fov = row[DISTANCE_COLUMN], row[4]
        if not DISTANCE_WARNING[0] <= distance <= DISTANCE_WARNING[1]:
            unit = " (another unit, such as millimetres?)" if distance > 10 * DISTANCE_WARNING[1] else ""
            reasons.append(
                f"row {i} has distance {distance:g}{unit}, far from the {TRAINED_DISTANCES[0]}-"
                f"{TRAINED_DISTANCES[1]} of training (object radius about 0.24 in the same units), so the "
                "object would fill much more or less of the view than in training"
            )
        if fov != FIELD_OF_VIEW:
            reasons.append(
                f"row {i} has field of view {fov:g} (column 4); the training cameras' is {FIELD_OF_VIEW:g} "
                "and the network reads none (its focal length is fixed at 248 px), so views of another "
                "field of view do not match its projection"
            )
    return reasons


def load_cameras(source: Any, views: Sequence[int] | None = None) -> np.ndarray:
    """The (3, 5) float32 camera rows for the 3 views, from an array-like or a camera text file.

    ``views`` picks 3 rows (0-based) of a source with more rows; default (0, 6, 7) for
    ``rendering_metadata.txt``, (0, 1, 2) for anything else.
    """
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        rows, lines = _read_rows(path)
        name = f"camera file {str(path)!r}"
        default = SHAPENET_DEFAULT_VIEWS if path.name == SHAPENET_METADATA_NAME else DEFAULT_VIEWS
    else:
        name, lines = "load_cameras: cameras array", None
        try:
            rows = np.asarray(source)
        except Exception as exc:  # ragged nested lists and the like
            raise InputError(
                f"{name} could not be read as an array ({exc}); expected shape ({NUM_VIEWS}, {NUM_COLUMNS})"
            ) from exc
        if rows.dtype == np.bool_ or not (
            np.issubdtype(rows.dtype, np.integer) or np.issubdtype(rows.dtype, np.floating)
        ):
            raise InputError(
                f"{name} has dtype {rows.dtype}; expected real numbers, shape ({NUM_VIEWS}, {NUM_COLUMNS})"
            )
        if rows.ndim != 2 or rows.shape[1] != NUM_COLUMNS:
            raise InputError(
                f"{name} has shape {rows.shape}; expected ({NUM_VIEWS}, {NUM_COLUMNS}) rows of "
                "(azimuth deg, elevation deg, 0, distance, 25), or (V, 5) with views="
            )
        rows = rows.astype(np.float64)
        default = DEFAULT_VIEWS
    if rows.shape[0] < NUM_VIEWS and views is None:
        raise InputError(f"{name} holds {rows.shape[0]} camera rows; {NUM_VIEWS} views are needed")
    chosen = _check_views(default if views is None else views, rows.shape[0], name)
    _validate_rows(rows, chosen, name, lines)
    reasons = unlike_training_cameras(rows[chosen], chosen)
    if reasons:
        warnings.warn(
            f"{name}: {'; '.join(reasons)}. Rows like ShapeNet's are (azimuth, elevation, 0, distance "
            f"{TRAINED_DISTANCES[0]}-{TRAINED_DISTANCES[1]}, {FIELD_OF_VIEW:g}) ({ROWS_COUNT})",
            stacklevel=2,
        )
    return np.ascontiguousarray(rows[chosen].astype(np.float32))
