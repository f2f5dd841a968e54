"""Ground truth for your own objects: a mesh's surface sampled into the official ``.dat`` layout.

As the original's data was made: points drawn uniformly over the surface (a triangle chosen with
probability proportional to its area, a uniform point inside it) with their triangle's unit normal
(right-hand rule over the face's vertex order: outward for counter-clockwise faces; the original's
training loss uses only its direction up to sign), scaled by ``scale`` and expressed in the frame
of the rendering they go with (``{images}/{synset}/{item}/rendering/``, row ``view`` of its
``rendering_metadata.txt``). The file is a pickle (protocol 2) of ``(rendering, points (N, 6)
float32)`` named ``{synset}_{item}_{view:02d}.dat``, so ``xmesh eval`` (and the original's
loader) read it with the renderings.
"""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np

from .dataset import SampleId, renderings_root
from .errors import FileFormatError, InputError, MissingFileError
from .io.cameras import SHAPENET_METADATA_NAME, read_camera_file
from .mesh import read_mesh
from .synthetic.dataset import ground_truth_points, write_ground_truth

DEFAULT_POINTS = 16384  # the original's data generator's sample count per object
SHAPENET_STEMS = ("model", "model_normalized")  # ShapeNet's {item}/model.obj: the item is the folder


def item_name(mesh_path: str | os.PathLike) -> str:
    """The item id of a mesh file: its stem, or its folder's name for ShapeNet's ``{item}/model.obj``."""
    path = Path(mesh_path)
    if path.stem in SHAPENET_STEMS:
        return path.parent.name if path.parent.name != "models" else path.parent.parent.name
    return path.stem


def sample_name(synset: str, item: str, view: int) -> SampleId:
    """The sample id ``{synset}_{item}_{view:02d}.dat``, checked as ``xmesh eval``'s lists are."""
    try:
        return SampleId.parse(f"{synset}_{item}_{int(view):02d}.dat")
    except InputError as exc:
        raise InputError(f"cannot name the ground truth of item {item!r} in synset {synset!r}: {exc}") from None


def rendering(images_root, sample: SampleId, view: int) -> tuple[np.ndarray, np.ndarray]:
    """(camera row (5,), the rendering as ``cv2.imread(..., IMREAD_UNCHANGED)`` gives it) of ``view``."""
    folder = renderings_root(images_root) / sample.synset / sample.item / "rendering"
    metadata = folder / SHAPENET_METADATA_NAME
    if not metadata.is_file():
        raise MissingFileError(
            f"{sample}: {str(metadata)!r} does not exist; render the object first (24 views with "
            "their camera rows, as ShapeNetRendering holds them) and give their root with --images"
        )
    rows = read_camera_file(metadata)
    if not 0 <= view < len(rows):
        raise InputError(f"{sample}: view {view} is not a row of {str(metadata)!r} ({len(rows)} rows)")
    png = folder / f"{view:02d}.png"
    image = cv2.imdecode(np.fromfile(str(png), dtype=np.uint8), cv2.IMREAD_UNCHANGED) if png.is_file() else None
    if image is None:
        raise FileFormatError(f"{sample}: rendering {str(png)!r} is missing or not an image")
    return rows[view], image


def write_object_ground_truth(
    mesh_path,
    out_dir,
    synset: str,
    images_root,
    view: int = 0,
    n_points: int = DEFAULT_POINTS,
    scale: float = 1.0,
    seed: int = 0,
) -> Path:
    """Sample ``mesh_path`` (.obj/.ply) into ``out_dir/{synset}_{item}_{view:02d}.dat``; its path."""
    if isinstance(n_points, bool) or int(n_points) != n_points or n_points < 1:
        raise InputError(f"points={n_points!r}: expected a whole number >= 1")
    if not (np.isfinite(scale) and scale > 0):
        raise InputError(f"scale={scale!r}: expected a positive number")
    sample = sample_name(synset, item_name(mesh_path), view)
    row, image = rendering(images_root, sample, int(view))
    mesh = read_mesh(mesh_path)
    if len(mesh.faces) == 0:
        raise InputError(f"{mesh_path}: the mesh has no faces; expected a triangle (or polygon) surface to sample")
    try:
        points = ground_truth_points(
            mesh.vertices.astype(np.float64) * scale,
            mesh.faces,
            row,
            int(n_points),
            np.random.default_rng([int(seed), int(sample.synset)]),
        )
    except InputError as exc:
        raise InputError(f"{mesh_path}: {exc}") from None
    return write_ground_truth(Path(out_dir) / sample.name, image, points)
