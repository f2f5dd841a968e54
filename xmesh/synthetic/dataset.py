"""ShapeNet-style renderings and a small Pixel2Mesh++-layout dataset of procedural objects.

Layout written by :func:`write_dataset` (the official one)::

    {root}/ShapeNetRendering/{synset}/{item}/rendering/00.png .. 23.png   137x137 RGBA, transparent
    {root}/ShapeNetRendering/{synset}/{item}/rendering/rendering_metadata.txt   24 camera rows
    {root}/ShapeNetRendering/{synset}/{item}/rendering/renderings.txt          the PNG names
    {root}/gt/{synset}_{item}_00.dat     pickle (protocol 2) of (image, points)
    {root}/test_list.txt                  one '{synset}_{item}_00.dat' per line

``points`` is (N, 6) float32: surface samples (xyz) and their unit outward normals, both expressed
in the frame of camera 0 (view 00: q = world_to_camera(p, row0), normals rotated alike).
``image`` is rendering 00 as uint8 (137, 137, 4) in OpenCV's channel order (BGRA), i.e. exactly
what ``cv2.imread(00.png, cv2.IMREAD_UNCHANGED)`` returns. Array globals in the pickle are named
``numpy.core.multiarray`` (not NumPy 2's ``numpy._core``) so older NumPy, Python 2's included,
can read it. Everything is deterministic in ``seed``.
"""

from __future__ import annotations

import pickle
import pickletools
from pathlib import Path

import cv2
import numpy as np

from xmesh.errors import InputError
from xmesh.io.atomic import atomic_write
from xmesh.model.camera import camera_frame, world_to_camera
from xmesh.render.draw import render_mesh, save_png
from xmesh.synthetic.shapes import as_rng, make_shape, sample_surface

NUM_RENDERINGS = 24
AZIMUTH_RANGE = (0.0, 360.0)
ELEVATION_RANGE = (25.0, 30.0)
DISTANCE_RANGE = (0.62, 0.88)
FIELD_OF_VIEW = 25.0
DEMO_VIEWS = (0, 6, 7)
DEFAULT_POINTS = 4000

# ShapeNet synset -> (procedural shape, base RGB colour in [0, 1])
CATEGORIES = {
    "02691156": ("airplane", (0.78, 0.78, 0.82)),
    "03001627": ("chair", (0.62, 0.45, 0.30)),
    "04379243": ("table", (0.55, 0.40, 0.28)),
    "02958343": ("car", (0.70, 0.15, 0.15)),
}
DEFAULT_CATEGORIES = tuple(CATEGORIES)


def shapenet_cameras(n: int = NUM_RENDERINGS, rng=None) -> np.ndarray:
    """(n, 5) float64 rows like ShapeNet's rendering_metadata.txt: azimuth U(0, 360) deg,
    elevation U(25, 30) deg, 0, distance U(0.62, 0.88), 25."""
    if int(n) != n or n < 1:
        raise InputError(f"shapenet_cameras: n={n}; expected a positive integer")
    rng = as_rng(rng)
    n = int(n)
    rows = np.zeros((n, 5), dtype=np.float64)
    rows[:, 0] = rng.uniform(*AZIMUTH_RANGE, size=n)
    rows[:, 1] = rng.uniform(*ELEVATION_RANGE, size=n)
    rows[:, 3] = rng.uniform(*DISTANCE_RANGE, size=n)
    rows[:, 4] = FIELD_OF_VIEW
    return rows


def format_camera_rows(cameras) -> str:
    """Camera rows as text, one 'azimuth elevation 0 distance 25' line each; floats printed with
    ``repr`` so they read back exactly."""
    cameras = np.asarray(cameras, dtype=np.float64)
    if cameras.ndim != 2 or cameras.shape[1] != 5:
        raise InputError(f"camera rows have shape {cameras.shape}; expected (V, 5)")
    if not np.all(np.isfinite(cameras)):
        raise InputError("camera rows hold NaN or infinite values; expected finite numbers")
    lines = []
    for row in cameras:
        fields = [repr(float(v)) if float(v) != int(v) else str(int(v)) for v in row]
        lines.append(" ".join(fields))
    return "\n".join(lines) + "\n"


def write_camera_file(path, cameras) -> Path:
    """Write camera rows (see :func:`format_camera_rows`) atomically."""
    text = format_camera_rows(cameras)
    with atomic_write(path, "w") as handle:
        handle.write(text)
    return Path(path)


def _split_shape(shape) -> tuple[np.ndarray, np.ndarray]:
    if hasattr(shape, "vertices") and hasattr(shape, "faces"):
        return np.asarray(shape.vertices), np.asarray(shape.faces)
    if isinstance(shape, (tuple, list)) and len(shape) == 2:
        return np.asarray(shape[0]), np.asarray(shape[1])
    raise InputError("shape: expected a (vertices, faces) pair or an object with .vertices and .faces")


def write_rendering_set(folder, shape, cameras, *, color=(0.75, 0.75, 0.78), size: int = 137) -> list[Path]:
    """Render ``shape`` (world frame) from every camera row into ``{folder}/rendering/NN.png`` and
    write ``rendering_metadata.txt`` and ``renderings.txt`` beside them. Returns the PNG paths."""
    vertices, faces = _split_shape(shape)
    cameras = np.asarray(cameras, dtype=np.float64)
    if cameras.ndim != 2 or cameras.shape[1] != 5 or not 1 <= len(cameras) <= 100:
        raise InputError(f"write_rendering_set: cameras have shape {cameras.shape}; expected (V, 5), V <= 100")
    out = Path(folder) / "rendering"
    paths = []
    for index, row in enumerate(cameras):
        image = render_mesh(vertices, faces, row, size=size, color=color)
        paths.append(save_png(out / f"{index:02d}.png", image))
    write_camera_file(out / "rendering_metadata.txt", cameras)
    with atomic_write(out / "renderings.txt", "w") as handle:
        handle.write("".join(f"{p.name}\n" for p in paths))
    return paths


def _py2_array_globals(data: bytes) -> bytes:
    """Rename NumPy 2's ``numpy._core.*`` pickle globals to ``numpy.core.*`` (same callables,
    readable by every NumPy). Only GLOBAL opcodes are rewritten, located by pickletools."""
    pieces, last = [], 0
    for opcode, arg, position in pickletools.genops(data):
        if opcode.name == "GLOBAL" and arg.startswith("numpy._core."):
            module, name = arg.split(" ", 1)
            pieces.append(data[last:position])
            pieces.append(
                b"c"
                + module.replace("numpy._core.", "numpy.core.", 1).encode("ascii")
                + b"\n"
                + name.encode("ascii")
                + b"\n"
            )
            last = position + 1 + len(module) + 1 + len(name) + 1
    pieces.append(data[last:])
    return b"".join(pieces)


def ground_truth_points(vertices, faces, camera0_row, n: int = DEFAULT_POINTS, rng=None) -> np.ndarray:
    """(n, 6) float32 surface samples and outward normals, in camera 0's frame."""
    points, normals = sample_surface(vertices, faces, n, rng)
    rotation, _ = camera_frame(camera0_row)
    q = world_to_camera(points, camera0_row)
    rotated = (normals.astype(np.float64) @ rotation.T.astype(np.float64)).astype(np.float32)
    return np.concatenate([q, rotated], axis=1).astype(np.float32)


def write_ground_truth(path, image, points) -> Path:
    """Pickle (protocol 2) the (image, points) tuple the original ground-truth files hold, atomically."""
    data = _py2_array_globals(pickle.dumps((np.ascontiguousarray(image), np.ascontiguousarray(points)), protocol=2))
    with atomic_write(path, "wb") as handle:
        handle.write(data)
    return Path(path)


def _item_id(rng: np.random.Generator) -> str:
    return "".join(f"{b:02x}" for b in rng.integers(0, 256, size=16))


def write_dataset(
    root,
    n_per_category: int = 2,
    categories=DEFAULT_CATEGORIES,
    seed: int = 0,
    n_points: int = DEFAULT_POINTS,
    size: int = 137,
    first_index: int = 0,
) -> dict:
    """Write procedural objects in the official Pixel2Mesh++ layout (module docstring).

    Each item is generated from ``(seed, synset, index)`` alone, index counting from ``first_index``
    (so that parts of one dataset can be written apart, e.g. in parallel). Returns
    ``{"root", "test_list", "ids", "gt", "renderings"}``: the root and list file paths, the sample ids,
    the ground-truth paths and the rendering folders (lists in the order of the list file)."""
    if int(n_per_category) != n_per_category or n_per_category < 1:
        raise InputError(f"write_dataset: n_per_category={n_per_category}; expected a positive integer")
    categories = tuple(categories)
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown or not categories:
        raise InputError(
            f"write_dataset: categories {unknown or categories!r}; expected synsets among {sorted(CATEGORIES)}"
        )
    root = Path(root)
    ids, gts, folders = [], [], []
    for synset in categories:
        shape_name, base_color = CATEGORIES[synset]
        for index in range(int(first_index), int(first_index) + int(n_per_category)):
            rng = np.random.default_rng([int(seed), int(synset), index])
            item = _item_id(rng)
            vertices, faces = make_shape(shape_name, rng)
            color = np.clip(np.asarray(base_color) * rng.uniform(0.85, 1.15, size=3), 0.0, 1.0)
            cameras = shapenet_cameras(NUM_RENDERINGS, rng)
            folder = root / "ShapeNetRendering" / synset / item
            pngs = write_rendering_set(folder, (vertices, faces), cameras, color=color, size=size)
            image = cv2.imdecode(np.fromfile(str(pngs[0]), dtype=np.uint8), cv2.IMREAD_UNCHANGED)
            points = ground_truth_points(vertices, faces, cameras[0], n_points, rng)
            sample = f"{synset}_{item}_00.dat"
            gts.append(write_ground_truth(root / "gt" / sample, image, points))
            ids.append(sample)
            folders.append(folder / "rendering")
    test_list = root / "test_list.txt"
    with atomic_write(test_list, "w") as handle:
        handle.write("".join(f"{sample}\n" for sample in ids))
    return {"root": root, "test_list": test_list, "ids": ids, "gt": gts, "renderings": folders}


def demo_scene(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The demo object and views: (airplane vertices (world), faces, cameras (3, 5) = rows 0, 6, 7
    of a ShapeNet-style 24-camera set)."""
    rng = np.random.default_rng([int(seed), int("02691156")])
    vertices, faces = make_shape("airplane", rng)
    cameras = shapenet_cameras(NUM_RENDERINGS, rng)[list(DEMO_VIEWS)]
    return vertices, faces, cameras


def demo_inputs(folder, seed: int = 0) -> tuple[list[Path], Path]:
    """Write ``plane1.png .. plane3.png`` (137x137 RGBA) and ``cameras.txt`` for ``xmesh demo``,
    like the original demo folder. Returns (the 3 image paths, the cameras path)."""
    vertices, faces, cameras = demo_scene(seed)
    folder = Path(folder)
    images = [
        save_png(folder / f"plane{i + 1}.png", render_mesh(vertices, faces, row, color=CATEGORIES["02691156"][1]))
        for i, row in enumerate(cameras)
    ]
    return images, write_camera_file(folder / "cameras.txt", cameras)
