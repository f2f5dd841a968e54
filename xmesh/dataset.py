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

import errno
import os
import re
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

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
    def parse(cls, text: str) -> SampleId:
        """Parse an id (a leading folder is ignored); InputError when it is not of the id form."""
        token = str(text).strip().replace("\\", "/").rsplit("/", 1)[-1]
        if not token.endswith(".dat"):
            raise InputError(f"{text!r} is not a sample id: it does not end in '.dat'; expected e.g. {EXAMPLE_ID!r}")
        parts = token[: -len(".dat")].split("_")
        if len(parts) < 3:
            raise InputError(
                f"{text!r} is not a sample id: expected three parts '{{synset}}_{{item}}_{{view}}.dat', "
                f"e.g. {EXAMPLE_ID!r}"
            )
        synset, item, view = parts[0], "_".join(parts[1:-1]), parts[-1]
        if not synset.isdigit():
            raise InputError(f"{text!r} is not a sample id: synset {synset!r} is not a number (e.g. '02691156')")
        if not view.isdigit():
            raise InputError(f"{text!r} is not a sample id: view {view!r} is not a number (e.g. '00')")
        if not _ITEM.match(item):
            raise InputError(
                f"{text!r} is not a sample id: item {item!r} is empty or holds characters other than "
                "letters, digits, '_', '-', '.'"
            )
        return cls(synset, item, view)


@dataclass(frozen=True)
class SamplePaths:
    """The files of one sample as text paths: the 3 rendering PNGs, the camera metadata file and the
    ground truth (text is quick to make for a long list and to send to a cluster's workers; paths
    given as ``Path`` are kept as their text)."""

    images: tuple[str, str, str]
    cameras: str
    gt: str

    def __post_init__(self) -> None:
        a, b, c = self.images
        if not (type(a) is type(b) is type(c) is type(self.cameras) is type(self.gt) is str):
            object.__setattr__(self, "images", (os.fspath(a), os.fspath(b), os.fspath(c)))
            object.__setattr__(self, "cameras", os.fspath(self.cameras))
            object.__setattr__(self, "gt", os.fspath(self.gt))

    def files(self) -> list[tuple[str, str]]:
        return [
            *((f"rendering {os.path.basename(p)}", p) for p in self.images),
            ("camera metadata", self.cameras),
            ("ground-truth", self.gt),
        ]


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
        raise FileFormatError(
            f"list file {str(path)!r} is not UTF-8 text (byte {exc.start}); expected one sample id per line"
        ) from None
    samples: list[SampleId] = []
    seen: dict[SampleId, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        content = line.split("#", 1)[0].strip()
        if not content:
            continue
        if len(content.split()) != 1:
            raise FileFormatError(
                f"list file {str(path)!r}, line {lineno}: {line.strip()!r} holds more than one "
                f"field; expected one sample id per line, e.g. {EXAMPLE_ID!r}"
            )
        try:
            sample = SampleId.parse(content)
        except InputError as exc:
            raise FileFormatError(f"list file {str(path)!r}, line {lineno}: {exc}") from None
        if sample in seen:
            raise FileFormatError(
                f"list file {str(path)!r}, line {lineno}: {sample} repeats line {seen[sample]}; "
                "expected each sample once"
            )
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


def _checked_views(views: Sequence[int]) -> tuple:
    views = tuple(views)
    if len(views) != 3 or any(
        isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < 100 for v in views
    ):
        raise InputError(f"views={views!r}: expected 3 rendering indices in 0..99")
    return views


class _Layout:
    """Where the files of a sample are, for one images root, ground-truth root and set of views."""

    def __init__(self, images_root, gt_root, views: Sequence[int]):
        self.views = _checked_views(views)
        self.renderings = os.path.join(renderings_root(images_root), "")  # ends in the separator
        self.gt_root = os.path.join(gt_root, "")
        self.image_a, self.image_b, self.image_c = (f"{int(v):02d}.png" for v in self.views)

    def paths(self, sample: SampleId) -> SamplePaths:
        folder = f"{self.renderings}{sample.synset}/{sample.item}/rendering/"
        return SamplePaths(
            (folder + self.image_a, folder + self.image_b, folder + self.image_c),
            folder + SHAPENET_METADATA_NAME,
            f"{self.gt_root}{sample.name}",
        )


def sample_paths(
    sample: SampleId | str,
    images_root: str | os.PathLike,
    gt_root: str | os.PathLike,
    views: Sequence[int] = DEFAULT_VIEWS,
) -> SamplePaths:
    """Where the files of ``sample`` are (nothing is checked; see :func:`check_sample`)."""
    if not isinstance(sample, SampleId):
        sample = SampleId.parse(sample)
    return _Layout(images_root, gt_root, views).paths(sample)


# stat() errors that mean "not there" (as pathlib's is_file and exists read them); others are raised
_ABSENT = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP})


def missing_file(sample: SampleId | str, paths: SamplePaths, with_gt: bool = True) -> MissingFileError | None:
    """The MissingFileError naming the sample and the path of its first absent file (the ground truth
    looked for only ``with_gt``), or None when every file is there."""
    files = (*paths.images, paths.cameras, paths.gt) if with_gt else (*paths.images, paths.cameras)
    for index, path in enumerate(files):
        try:
            if stat.S_ISREG(os.stat(path).st_mode):
                continue
            state = "is not a file"
        except OSError as exc:
            if exc.errno not in _ABSENT:
                raise
            state = "does not exist"
        what = paths.files()[index][0]
        return MissingFileError(f"sample {sample}: {what} file {path!r} {state}")
    return None


def check_sample(sample: SampleId | str, paths: SamplePaths) -> None:
    """MissingFileError naming the sample and the path when any of its files is absent."""
    problem = missing_file(sample, paths)
    if problem is not None:
        raise problem


def check_inputs(sample: SampleId | str, paths: SamplePaths) -> None:
    """As :func:`check_sample` for the network's inputs only (renderings and camera metadata)."""
    problem = missing_file(sample, paths, with_gt=False)
    if problem is not None:
        raise problem


def load_ground_truth_array(path: str | os.PathLike) -> np.ndarray:
    """The points array of an official ``.dat`` as stored (N, C >= 3; (N, 6) = xyz + normal in the
    official files, in their dtype), read with the restricted unpickler: a pickle of ``(image,
    points)``, or a bare points array. Errors name the file."""
    path = os.fspath(path)
    data = safe_pickle.load(path, what="ground-truth")
    if isinstance(data, (tuple, list)):
        if len(data) != 2:
            raise FileFormatError(
                f"{path}: ground truth holds a {type(data).__name__} of {len(data)} items; expected (image, points)"
            )
        points = data[1]
    else:
        points = data
    if not isinstance(points, np.ndarray):
        raise FileFormatError(f"{path}: ground-truth points are a {type(points).__name__}; expected an (N, 6) array")
    if points.dtype.kind not in "fiu":
        raise FileFormatError(f"{path}: ground-truth points have dtype {points.dtype}; expected float numbers")
    if points.ndim != 2 or points.shape[1] < 3 or points.shape[0] < 1:
        raise FileFormatError(
            f"{path}: ground-truth points have shape {points.shape}; expected (N, 6) (xyz + normal) with N >= 1"
        )
    return points


def load_ground_truth(path: str | os.PathLike) -> np.ndarray:
    """The (N, 3) float32 ground-truth points of an official ``.dat`` (see
    :func:`load_ground_truth_array`); NaN or infinite coordinates are refused, naming the file."""
    path = os.fspath(path)
    xyz = np.ascontiguousarray(load_ground_truth_array(path)[:, :3], dtype=np.float32)
    bad = np.flatnonzero(~np.isfinite(xyz).all(axis=1))
    if bad.size:
        raise FileFormatError(
            f"{path}: {bad.size} ground-truth point(s) hold NaN or infinite coordinates "
            f"(first at row {bad[0]}); expected finite coordinates"
        )
    return xyz


def list_samples(
    list_file: str | os.PathLike,
    images_root: str | os.PathLike,
    gt_root: str | os.PathLike,
    views: Sequence[int] = DEFAULT_VIEWS,
    limit: int | None = None,
    with_gt: bool = True,
) -> list[tuple[SampleId, SamplePaths, Exception | None]]:
    """The first ``limit`` samples of ``list_file``, each with its (absolute) paths and the
    MissingFileError of its first absent file (None when all are there; with ``with_gt`` False
    the ground truth is not looked for). Errors in the list itself are raised."""
    samples = read_list(list_file)
    if limit is not None:
        samples = samples[: int(limit)]
    layout = _Layout(os.path.abspath(images_root), os.path.abspath(gt_root), views)
    listed = [(sample, layout.paths(sample)) for sample in samples]
    problems = _look_for_files(listed, with_gt)
    return [(sample, paths, problem) for (sample, paths), problem in zip(listed, problems)]


LISTING_CHUNK = 1024  # samples per task of the listing's threads
LISTING_THREADS = 4  # beside a model build in the same process, 4 threads halve the listing; more add nothing


def _look_for_files(listed: list, with_gt: bool) -> list:
    """:func:`missing_file` of every (sample, paths), in order; long lists in a few threads, whose
    stat() calls (most of the time on a warm cache, all of it on a network file system) overlap."""

    def look(chunk):
        return [missing_file(sample, paths, with_gt) for sample, paths in chunk]

    chunks = [listed[i : i + LISTING_CHUNK] for i in range(0, len(listed), LISTING_CHUNK)]
    if len(chunks) == 1:
        return look(listed)
    with ThreadPoolExecutor(min(len(chunks), LISTING_THREADS), thread_name_prefix="xmesh-listing") as pool:
        return [problem for found in pool.map(look, chunks) for problem in found]


def listing_args(
    list_file,
    images_root,
    gt_root,
    views: Sequence[int] = DEFAULT_VIEWS,
    limit: int | None = None,
    with_gt: bool = True,
) -> tuple:
    """:func:`list_samples`'s arguments in one form (absolute paths, a tuple of views), so that a
    listing started ahead (``xmesh.pipeline.startup.prefetch``) is found again by the run."""
    return (
        os.path.abspath(list_file),
        os.path.abspath(images_root),
        os.path.abspath(gt_root),
        tuple(views),
        limit,
        bool(with_gt),
    )
