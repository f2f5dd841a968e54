"""xmesh ground-truth: own objects' surfaces sampled into the official .dat layout, then evaluated."""

from __future__ import annotations

import csv
import math
import pickle

import numpy as np
import pytest
from scipy.spatial import ConvexHull

from xmesh import cli
from xmesh.dataset import load_ground_truth, load_ground_truth_array
from xmesh.ground_truth import item_name
from xmesh.mesh import Mesh
from xmesh.model.camera import camera_frame, camera_to_world
from xmesh.synthetic.dataset import shapenet_cameras, write_rendering_set
from xmesh.synthetic.shapes import make_shape

SYNSET = "02958343"
HALF = np.array([0.12, 0.05, 0.2])  # a 0.24 x 0.1 x 0.4 box: sides of three different areas
N_POINTS = 30000


def _box() -> tuple[np.ndarray, np.ndarray]:
    """The box's 8 corners and 12 triangles, each wound counter-clockwise seen from outside."""
    corners = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], dtype=np.float64) * HALF
    faces = ConvexHull(corners).simplices.copy()
    for face in faces:
        a, b, c = corners[face]
        if np.cross(b - a, c - a) @ (a + b + c) < 0:
            face[[1, 2]] = face[[2, 1]]
    return corners, faces


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """Two own objects (a box and a procedural car) as OBJ files, rendered ShapeNet-style, with ground truth."""
    root = tmp_path_factory.mktemp("own")
    objects = {"box": _box(), "racer": make_shape("car", np.random.default_rng(2))}
    cameras = {}
    for k, (item, (vertices, faces)) in enumerate(objects.items()):
        Mesh(vertices, faces).to_obj(root / "meshes" / f"{item}.obj")
        cameras[item] = shapenet_cameras(24, np.random.default_rng(k))
        write_rendering_set(root / "renders" / SYNSET / item, (vertices, faces), cameras[item])
    args = [
        "ground-truth",
        *(str(root / "meshes" / f"{item}.obj") for item in objects),
        "--synset",
        SYNSET,
        "--images",
        str(root / "renders"),
        "--out",
        str(root / "gt"),
        "--points",
        str(N_POINTS),
    ]
    assert cli.main(args) == 0
    return {"root": root, "objects": objects, "cameras": cameras}


def test_box_points_are_uniform_on_its_surface_with_its_faces_normals(own):
    vertices, faces = own["objects"]["box"]
    path = own["root"] / "gt" / f"{SYNSET}_box_00.dat"
    image, points = pickle.load(open(path, "rb"), encoding="latin1")  # the original's loader
    assert points.shape == (N_POINTS, 6) and points.dtype == np.float32 and image.shape == (137, 137, 4)
    row = own["cameras"]["box"][0]
    world = camera_to_world(points[:, :3], row).astype(np.float64)
    normals = points[:, 3:].astype(np.float64) @ camera_frame(row)[0].astype(np.float64)  # back to the world

    # every point on the surface: on one side's plane, inside its rectangle
    outside = np.abs(world) / HALF
    side_axis = outside.argmax(axis=1)
    assert np.abs(outside.max(axis=1) - 1.0).max() < 1e-5
    # its normal is its side's outward normal
    expected = np.zeros_like(world)
    expected[np.arange(len(world)), side_axis] = np.sign(world[np.arange(len(world)), side_axis])
    assert np.abs(normals - expected).max() < 1e-5

    # per-triangle counts proportional to area, within 5 binomial standard deviations
    corners = vertices[faces]
    areas = 0.5 * np.linalg.norm(np.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0]), axis=1)
    share = areas / areas.sum()
    owner = np.empty(len(world), dtype=np.int64)
    for f, (a, b, c) in enumerate(corners):
        n = np.cross(b - a, c - a)
        on_plane = np.abs((world - a) @ n) < 1e-5 * np.linalg.norm(n)
        inside = on_plane.copy()
        for p, q in ((a, b), (b, c), (c, a)):  # inside each edge, seen from the normal's side
            inside &= np.cross(q - p, world - p) @ n >= -1e-9
        owner[inside] = f
    counts = np.bincount(owner, minlength=len(faces))
    sigma = np.sqrt(N_POINTS * share * (1 - share))
    assert np.all(np.abs(counts - N_POINTS * share) < 5 * sigma), (counts, N_POINTS * share)
    # and uniform inside a side: each half of the largest side holds half of its points
    largest = side_axis == 1
    top = largest & (world[:, 1] > 0)
    half_share = np.count_nonzero(top & (world[:, 0] > 0)) / np.count_nonzero(top)
    assert abs(half_share - 0.5) < 5 * math.sqrt(0.25 / np.count_nonzero(top))


def test_ground_truth_round_trips_through_xmesh_and_the_original_loader(own):
    path = own["root"] / "gt" / f"{SYNSET}_racer_00.dat"
    for encoding in ("latin1", "bytes"):  # the original reads with encoding='bytes'
        _, points = pickle.load(open(path, "rb"), encoding=encoding)
        np.testing.assert_array_equal(load_ground_truth_array(path), points)
        np.testing.assert_array_equal(load_ground_truth(path), points[:, :3])
    # the points lie on the object seen from view 0: all in front of the camera (negative z)
    assert np.all(points[:, 2] < 0)


def test_eval_runs_on_own_objects(own, tmp_path):
    root = own["root"]
    (tmp_path / "list.txt").write_text(f"{SYNSET}_box_00.dat\n{SYNSET}_racer_00.dat\n")
    assert (
        cli.main(
            [
                "eval",
                "--images",
                str(root / "renders"),
                "--gt",
                str(root / "gt"),
                "--list",
                str(tmp_path / "list.txt"),
                "--weights",
                "synthetic:1",
                "--out",
                str(tmp_path / "ev"),
                "--no-progress",
            ]
        )
        == 0
    )
    with open(tmp_path / "ev" / "samples.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["id"] for r in rows] == [f"{SYNSET}_box_00.dat", f"{SYNSET}_racer_00.dat"]
    assert all(math.isfinite(float(r["chamfer"])) and float(r["chamfer"]) > 0 for r in rows)


def test_item_names_and_errors_name_what_to_do(own, tmp_path, capsys):
    assert item_name("shapenet/1a2b/model.obj") == "1a2b" and item_name("v2/1a2b/models/model_normalized.obj") == "1a2b"
    assert item_name("objects/mug.ply") == "mug"
    mesh = own["root"] / "meshes" / "box.obj"
    assert (
        cli.main(
            ["ground-truth", str(mesh), "--synset", SYNSET, "--images", str(tmp_path), "--out", str(tmp_path / "gt")]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "rendering_metadata.txt" in err and "--images" in err
    assert (
        cli.main(
            [
                "ground-truth",
                str(mesh),
                "--synset",
                "cars",
                "--images",
                str(own["root"] / "renders"),
                "--out",
                str(tmp_path / "gt"),
            ]
        )
        == 2
    )
    assert "synset 'cars' is not a number" in capsys.readouterr().err
