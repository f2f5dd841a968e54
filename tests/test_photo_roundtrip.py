"""Round trip on synthetic data: a procedural object rendered by known cameras, its COLMAP text model
(cameras, poses, 3D points) moved by a random similarity; the converter recovers the cameras and the
reconstruction (NumPy, synthetic weights) equals the one from the original cameras, in the input's
world. Through the Python API and the command line (--colmap, and --poses with masks)."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

import xmesh
from photo_scene import make_scene, network_intrinsics, network_photos, write_colmap
from xmesh.cli import main
from xmesh.io.images import load_images
from xmesh.mesh import read_obj
from xmesh.model.camera import camera_to_world

NAMES = ["IMG_0001.png", "IMG_0002.png", "IMG_0003.png"]
WEIGHTS = "synthetic:1"  # the synthetic test recipe, as the CLI and the Python API take it
TOLERANCE = 1e-4

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    """The scene, its photos and COLMAP model on disk, and the reconstruction from the original
    cameras in the network's world."""
    scene = make_scene(2)
    folder = tmp_path_factory.mktemp("capture")
    (folder / "photos").mkdir()
    photos = network_photos(scene, 137)
    paths = []
    for name, photo in zip(NAMES, photos):
        cv2.imwrite(str(folder / "photos" / name), photo)
        paths.append(folder / "photos" / name)
    write_colmap(scene, folder / "sparse", NAMES)
    model = xmesh.Reconstructor(WEIGHTS)
    original = model(load_images(paths), scene.rows)
    world = camera_to_world(original.vertices, scene.rows[0]).astype(np.float64)
    coarse = camera_to_world(original.coarse_vertices, scene.rows[0]).astype(np.float64)
    return {
        "scene": scene,
        "folder": folder,
        "paths": paths,
        "photos": photos,
        "model": model,
        "world": world,
        "coarse": coarse,
    }


def _check_mesh(capture, vertices, coarse=None):
    """Input-world vertices, mapped back by the inverse similarity, equal the original reconstruction."""
    scene = capture["scene"]
    back = scene.from_input(vertices)
    assert np.max(np.abs(back - capture["world"])) < TOLERANCE
    if coarse is not None:
        assert np.max(np.abs(scene.from_input(coarse) - capture["coarse"])) < TOLERANCE
    # and in the input's units: the mesh overlays the input's own reconstruction
    assert np.max(np.abs(vertices - scene.to_input(capture["world"]))) < TOLERANCE * scene.sigma


def test_colmap_round_trip(capture):
    scene = capture["scene"]
    cams = xmesh.cameras.from_colmap(capture["folder"] / "sparse", capture["paths"], first_azimuth=scene.rows[0, 0])
    relative = np.abs(cams.table - scene.rows)[:, [0, 1, 3]] / np.abs(scene.rows[:, [0, 1, 3]])
    assert relative.max() < TOLERANCE
    mesh = capture["model"](capture["paths"], cams)
    _check_mesh(capture, mesh.vertices, mesh.coarse_vertices)
    assert np.array_equal(mesh.faces, capture["model"].faces)


def test_python_entry_point_with_default_azimuth(capture):
    """xmesh.reconstruct with PhotoCameras, view 0 at azimuth 0 (the default): the network sees the
    same relative cameras, so the mesh in the input world is the same up to float32 rounding, which
    the projections' integer pixel indices amplify for a tenth of the vertices (to 1.6e-3 here, on
    an object of radius 0.24)."""
    cams = xmesh.cameras.from_colmap(capture["folder"] / "sparse", capture["paths"])
    assert cams.table[0, 0] == 0.0
    mesh = xmesh.reconstruct(capture["paths"], cams, weights=WEIGHTS)
    back = capture["scene"].from_input(mesh.vertices)
    error = np.abs(back - capture["world"]).max(axis=1)
    assert np.median(error) < 1e-5 and np.quantile(error, 0.8) < TOLERANCE and error.max() < 5e-3


def test_command_line_colmap(capture, tmp_path, capsys):
    scene = capture["scene"]
    out, coarse = tmp_path / "mesh.obj", tmp_path / "coarse.obj"
    code = main(
        [
            "reconstruct",
            *map(str, capture["paths"]),
            "--colmap",
            str(capture["folder"] / "sparse"),
            "--first-azimuth",
            repr(float(scene.rows[0, 0])),
            "--weights",
            WEIGHTS,
            "--out",
            str(out),
            "--coarse-out",
            str(coarse),
        ]
    )
    assert code == 0
    _check_mesh(capture, read_obj(out).vertices, read_obj(coarse).vertices)
    assert "view 2 (" in capsys.readouterr().err  # the cameras found are reported


def test_command_line_poses_with_masks(capture, tmp_path):
    """RGB photos and mask files, camera-to-world matrices (OpenGL axes) in a poses.json."""
    scene = capture["scene"]
    photos, masks, views = [], [], []
    for i, (name, photo) in enumerate(zip(NAMES, capture["photos"])):
        jpg_free = tmp_path / name.replace(".png", "_rgb.png")  # lossless, so the pixels stay the same
        cv2.imwrite(str(jpg_free), photo[:, :, :3])
        cv2.imwrite(str(tmp_path / f"mask{i}.png"), np.where(photo[:, :, 3] > 0, 255, 0).astype(np.uint8))
        photos.append(str(jpg_free))
        masks.append(str(tmp_path / f"mask{i}.png"))
        rot, centre = scene.input_pose(i)
        m = np.eye(4)
        m[:3, :3], m[:3, 3] = rot.T @ np.diag([1.0, -1.0, -1.0]), centre
        k = network_intrinsics(137)
        views.append(
            {
                "image": jpg_free.name,
                "camera_to_world": m.tolist(),
                "fx": k.fx,
                "fy": k.fy,
                "cx": k.cx,
                "cy": k.cy,
                "width": 137,
                "height": 137,
            }
        )
    poses = tmp_path / "poses.json"
    # the object's sphere given (its points inside the masks would lose a few on the thinnest parts)
    poses.write_text(
        json.dumps(
            {
                "convention": "opengl",
                "views": views,
                "center": scene.shift.tolist(),
                "radius": 0.24 * scene.sigma,
                "first_azimuth": float(scene.rows[0, 0]),
            }
        )
    )
    out = tmp_path / "mesh.ply"
    assert (
        main(
            ["reconstruct", *photos, "--poses", str(poses), "--masks", *masks, "--weights", WEIGHTS, "--out", str(out)]
        )
        == 0
    )
    from xmesh.mesh import read_ply

    _check_mesh(capture, read_ply(out).vertices)
