"""Reading a Pixel2Mesh++ test set in the official layout.

::

    {images_root}/{synset}/{item}/rendering/00.png .. 23.png      (ShapeNetRendering)
    {images_root}/{synset}/{item}/rendering/rendering_metadata.txt  24 camera rows
    {gt_root}/{synset}_{item}_{view}.dat     pickle of (image, points (N, 6): xyz + normal)
    list file: one '{synset}_{item}_{view}.dat' per line

``images_root`` is the ``ShapeNetRendering`` folder itself; a folder that *contains*
``ShapeNetRendering`` (the root :func:`xmesh.synthetic.dataset.write_dataset` writes) is accepted
too. The 3 input views are renderings (0, 6, 7) by default, as in the original evaluation.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import FileFormatError, InputError, MissingFileError
from .io import safe_pickle
from .io.cameras import SHAPENET_DEFAULT_VIEWS, SHAPENET_METADATA_NAME

RENDERINGS_FOLDER = "ShapeNetRendering"
DEFAULT_VIEWS = SHAPENET_DEFAULT_VIEWS
_ITEM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
EXAMPLE_ID = "02691156_d004d0e86ea3d77a65a6ed5c458f6a32_00.dat"


@dataclass(frozen=True)
class SampleId:
    """One test sample: ``{synset}_{item}_{view}.dat``. ``str(sample)`` is that id."""

    synset: str
    item: str
    view: str

    @property
    def name(self) -> str:
        return f"{self.synset}_{self.item}_{self.view}.dat"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, text: str) -> "SampleId":
        """Parse an id (a leading folder is ignored); InputError when it is not of the id form."""
        token = str(text).strip().replace("\\", "/").rsplit("/", 1)[-1]
        if not token.endswith(".dat"):
            raise InputError(f"{text!r} is not a sample id: it does not end in '.dat'; expected e.g. {EXAMPLE_ID!r}")
        parts = token[: -len(".dat")].split("_")
        if len(parts) < 3:
            raise InputError(f"{text!r} is not a sample id: expected three parts '{{synset}}_{{item}}_{{view}}.dat', "
                             f"e.g. {EXAMPLE_ID!r}")
        synset, item, view = parts[0], "_".join(parts[1:-1]), parts[-1]
        if not synset.isdigit():
            raise InputError(f"{text!r} is not a sample id: synset {synset!r} is not a number (e.g. '02691156')")
        if not view.isdigit():
            raise InputError(f"{text!r} is not a sample id: view {view!r} is not a number (e.g. '00')")
        if not _ITEM.match(item):
            raise InputError(f"{text!r} is not a sample id: item {item!r} is empty or holds characters other than "
                             "letters, digits, '_', '-', '.'")
        return cls(synset, item, view)


@dataclass(frozen=True)
class SamplePaths:
    """The files of one sample: the 3 rendering PNGs, the camera metadata file and the ground truth."""

    images: tuple[Path, Path, Path]
    cameras: Path
    gt: Path

    def files(self) -> list[tuple[str, Path]]:
        return [*((f"rendering {p.name}", p) for p in self.images), ("camera metadata", self.cameras),
                ("ground-truth", self.gt)]


def read_list(path: str | os.PathLike) -> list[SampleId]:
    """The sample ids of a list file, in order. Blank lines and ``#`` comments are skipped; a
    malformed or repeated line raises FileFormatError naming the file and the line number."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise MissingFileError(f"list file {str(path)!r} does not exist; expected a text file of sample ids") from None
    except IsADirectoryError:
        raise InputError(f"list file {str(path)!r} is a folder; expected a text file of sample ids") from None
    except UnicodeDecodeError as exc:
        raise FileFormatError(f"list file {str(path)!r} is not UTF-8 text (byte {exc.start}); "
                              "expected one sample id per line") from None
    samples: list[SampleId] = []
    seen: dict[SampleId, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        content = line.split("#", 1)[0].strip()
        if not content:
            continue
        if len(content.split()) != 1:
            raise FileFormatError(f"list file {str(path)!r}, line {lineno}: {line.strip()!r} holds more than one "
                                  f"field; expected one sample id per line, e.g. {EXAMPLE_ID!r}")
        try:
            sample = SampleId.parse(content)
        except InputError as exc:
            raise FileFormatError(f"list file {str(path)!r}, line {lineno}: {exc}") from None
        if sample in seen:
            raise FileFormatError(f"list file {str(path)!r}, line {lineno}: {sample} repeats line {seen[sample]}; "
                                  "expected each sample once")
        seen[sample] = lineno
        samples.append(sample)
    if not samples:
        raise FileFormatError(f"list file {str(path)!r} holds no sample ids; expected lines like {EXAMPLE_ID!r}")
    return samples


def renderings_root(images_root: str | os.PathLike) -> Path:
    """The folder holding ``{synset}/{item}/rendering``: ``images_root``, or its ShapeNetRendering subfolder."""
    root = Path(images_root)
    inner = root / RENDERINGS_FOLDER
    if root.name != RENDERINGS_FOLDER and inner.is_dir():
        return inner
    return root


def sample_paths(sample: SampleId | str, images_root: str | os.PathLike, gt_root: str | os.PathLike,
                 views: Sequence[int] = DEFAULT_VIEWS) -> SamplePaths:
    """Where the files of ``sample`` are (nothing is checked; see :func:`check_sample`)."""
    if not isinstance(sample, SampleId):
        sample = SampleId.parse(sample)
    views = tuple(views)
    if len(views) != 3 or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < 100
                              for v in views):
        raise InputError(f"views={views!r}: expected 3 rendering indices in 0..99")
    folder = renderings_root(images_root) / sample.synset / sample.item / "rendering"
    images = tuple(folder / f"{int(v):02d}.png" for v in views)
    return SamplePaths(images=images, cameras=folder / SHAPENET_METADATA_NAME, gt=Path(gt_root) / sample.name)


def check_sample(sample: SampleId | str, paths: SamplePaths) -> None:
    """MissingFileError naming the sample and the path when any of its files is absent."""
    for what, path in paths.files():
        if not path.is_file():
            state = "is not a file" if path.exists() else "does not exist"
            raise MissingFileError(f"sample {sample}: {what} file {str(path)!r} {state}")


def check_inputs(sample: SampleId | str, paths: SamplePaths) -> None:
    """As :func:`check_sample` for the network's inputs only (renderings and camera metadata)."""
    for what, path in paths.files()[:-1]:
        if not path.is_file():
            state = "is not a file" if path.exists() else "does not exist"
            raise MissingFileError(f"sample {sample}: {what} file {str(path)!r} {state}")


def load_ground_truth_array(path: str | os.PathLike) -> np.ndarray:
    """The points array of an official ``.dat`` as stored (N, C >= 3; (N, 6) = xyz + normal in the
    official files, in their dtype), read with the restricted unpickler: a pickle of ``(image,
    points)``, or a bare points array. Errors name the file."""
    path = os.fspath(path)
    data = safe_pickle.load(path, what="ground-truth")
    if isinstance(data, (tuple, list)):
        if len(data) != 2:
            raise FileFormatError(f"{path}: ground truth holds a {type(data).__name__} of {len(data)} items; "
                                  "expected (image, points)")
        points = data[1]
    else:
        points = data
    if not isinstance(points, np.ndarray):
        raise FileFormatError(f"{path}: ground-truth points are a {type(points).__name__}; expected an (N, 6) array")
    if points.dtype.kind not in "fiu":
        raise FileFormatError(f"{path}: ground-truth points have dtype {points.dtype}; expected float numbers")
    if points.ndim != 2 or points.shape[1] < 3 or points.shape[0] < 1:
        raise FileFormatError(f"{path}: ground-truth points have shape {points.shape}; expected (N, 6) "
                              "(xyz + normal) with N >= 1")
    return points


def load_ground_truth(path: str | os.PathLike) -> np.ndarray:
    """The (N, 3) float32 ground-truth points of an official ``.dat`` (see
    :func:`load_ground_truth_array`); NaN or infinite coordinates are refused, naming the file."""
    path = os.fspath(path)
    xyz = np.ascontiguousarray(load_ground_truth_array(path)[:, :3], dtype=np.float32)
    bad = np.flatnonzero(~np.isfinite(xyz).all(axis=1))
    if bad.size:
        raise FileFormatError(f"{path}: {bad.size} ground-truth point(s) hold NaN or infinite coordinates "
                              f"(first at row {bad[0]}); expected finite coordinates")
    return xyz
