"""xmesh reconstruct's camera sources: exactly one of --cameras, --colmap, --poses, the photo options
only with --colmap/--poses, and the conversion's errors on one line naming the view."""

from __future__ import annotations

import pytest

from photo_scene import make_scene, write_colmap
from xmesh.cli import main

NAMES = ["a.png", "b.png", "c.png"]


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("xmesh reconstruct: error:") and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "no camera source: give exactly one of --cameras FILE"),
        (["--cameras", "c.txt", "--colmap", "sparse"], r"several camera sources (--cameras, --colmap)"),
        (["--colmap", "sparse", "--poses", "p.json"], r"several camera sources (--colmap, --poses)"),
        (["--cameras", "c.txt", "--masks", "m1", "m2", "m3"], "--masks go with --colmap or --poses"),
        (["--colmap", "sparse", "--views", "0", "1", "2"], "--views picks rows of a --cameras file"),
    ],
)
def test_camera_source_choice(capsys, tmp_path, argv, message):
    err = _error(capsys, ["reconstruct", *NAMES, *argv, "--weights", "synthetic:1", "--out", str(tmp_path / "m.obj")])
    assert message in err


def test_photo_options_are_refused_with_list(capsys, tmp_path):
    err = _error(
        capsys,
        [
            "reconstruct",
            "--list",
            "l.txt",
            "--images",
            "root",
            "--colmap",
            "sparse",
            "--weights",
            "synthetic:1",
            "--out",
            str(tmp_path),
        ],
    )
    assert "--colmap cannot be used with --list" in err


def test_conversion_errors_name_the_view(capsys, tmp_path):
    write_colmap(make_scene(0), tmp_path / "sparse", NAMES)
    err = _error(
        capsys,
        [
            "reconstruct",
            "a.png",
            "x.png",
            "c.png",
            "--colmap",
            str(tmp_path / "sparse"),
            "--weights",
            "synthetic:1",
            "--out",
            str(tmp_path / "m.obj"),
        ],
    )
    assert "view 1: photo 'x.png' was not registered by COLMAP" in err
    err = _error(
        capsys,
        [
            "reconstruct",
            *NAMES,
            "--colmap",
            str(tmp_path / "sparse"),
            "--center",
            "1,2",
            "--weights",
            "synthetic:1",
            "--out",
            str(tmp_path / "m.obj"),
        ],
    )
    assert "--center 1,2: expected 'points', 'axes' or X,Y,Z" in err


def test_render_draws_a_colmap_reconstruction_in_the_photos_world(capsys, tmp_path):
    """xmesh render --colmap: a mesh in COLMAP's world (as reconstruct --colmap writes it) is drawn from
    the three photos' network cameras, the same picture as the mesh moved to camera 0's frame drawn
    from those camera rows with --cameras."""
    import cv2
    import numpy as np

    import xmesh
    from xmesh.mesh import Mesh
    from xmesh.model.camera import world_to_camera
    from xmesh.synthetic.dataset import write_camera_file

    scene = make_scene(0)
    write_colmap(scene, tmp_path / "sparse", NAMES)
    world = Mesh(scene.to_input(scene.vertices), scene.faces)
    world.to_obj(tmp_path / "world.obj")
    points = scene.to_input(scene.points[::10])
    np.savetxt(tmp_path / "points.xyz", points)
    cams = xmesh.cameras.from_colmap(tmp_path / "sparse", NAMES)
    in_camera0 = cams.input_to_camera0(world.vertices)
    np.testing.assert_allclose(cams.camera0_to_input(in_camera0), world.vertices, rtol=0, atol=1e-4 * scene.sigma)
    # the network's view of the object: where the scene's own cameras put it, within the conversion's accuracy
    expected = world_to_camera(scene.vertices, scene.rows[0])
    assert np.abs(in_camera0 - expected).max() < 0.02 * 0.24
    Mesh(in_camera0, scene.faces).to_obj(tmp_path / "camera0.obj")
    np.savetxt(tmp_path / "points0.xyz", cams.input_to_camera0(points))
    write_camera_file(tmp_path / "rows.txt", cams.rows)

    assert (
        main(
            [
                "render",
                str(tmp_path / "world.obj"),
                "--colmap",
                str(tmp_path / "sparse"),
                "--images",
                *NAMES,
                "--points",
                str(tmp_path / "points.xyz"),
                "--out",
                str(tmp_path / "colmap.png"),
                "--size",
                "96",
            ]
        )
        == 0
    )
    assert "cameras from --colmap" in capsys.readouterr().err
    assert (
        main(
            [
                "render",
                str(tmp_path / "camera0.obj"),
                "--cameras",
                str(tmp_path / "rows.txt"),
                "--points",
                str(tmp_path / "points0.xyz"),
                "--out",
                str(tmp_path / "rows.png"),
                "--size",
                "96",
            ]
        )
        == 0
    )
    drawn, reference = (cv2.imread(str(tmp_path / name)) for name in ("colmap.png", "rows.png"))
    assert drawn.shape == reference.shape == (96, 3 * 96 + 2 * 4, 3)
    # the same picture: float32 rounding of the moved vertices may flip a pixel along an edge
    assert np.mean(np.any(drawn != reference, axis=2)) < 0.01
    assert np.mean(np.any(drawn < 250, axis=2)) > 0.1  # the object is drawn


def test_render_takes_exactly_one_camera_source(capsys, tmp_path):
    for argv, message in (
        (["--cameras", "c.txt", "--colmap", "sparse"], "several camera sources (--cameras, --colmap)"),
        (["--cameras", "c.txt", "--images", *NAMES], "--images names the photos of --colmap/--poses"),
        ([], "no camera source"),
    ):
        assert main(["render", "m.obj", *argv, "--out", str(tmp_path / "p.png")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("xmesh render: error:") and message in err and len(err.splitlines()) == 1
