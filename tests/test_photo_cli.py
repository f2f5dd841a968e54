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


@pytest.mark.parametrize("argv, message", [
    ([], "no camera source: give exactly one of --cameras FILE"),
    (["--cameras", "c.txt", "--colmap", "sparse"], r"several camera sources (--cameras, --colmap)"),
    (["--colmap", "sparse", "--poses", "p.json"], r"several camera sources (--colmap, --poses)"),
    (["--cameras", "c.txt", "--masks", "m1", "m2", "m3"], "--masks go with --colmap or --poses"),
    (["--colmap", "sparse", "--views", "0", "1", "2"], "--views picks rows of a --cameras file"),
])
def test_camera_source_choice(capsys, tmp_path, argv, message):
    err = _error(capsys, ["reconstruct", *NAMES, *argv, "--weights", "synthetic:1", "--out", str(tmp_path / "m.obj")])
    assert message in err


def test_photo_options_are_refused_with_list(capsys, tmp_path):
    err = _error(capsys, ["reconstruct", "--list", "l.txt", "--images", "root", "--colmap", "sparse",
                          "--weights", "synthetic:1", "--out", str(tmp_path)])
    assert "--colmap cannot be used with --list" in err


def test_conversion_errors_name_the_view(capsys, tmp_path):
    write_colmap(make_scene(0), tmp_path / "sparse", NAMES)
    err = _error(capsys, ["reconstruct", "a.png", "x.png", "c.png", "--colmap", str(tmp_path / "sparse"),
                          "--weights", "synthetic:1", "--out", str(tmp_path / "m.obj")])
    assert "view 1: photo 'x.png' was not registered by COLMAP" in err
    err = _error(capsys, ["reconstruct", *NAMES, "--colmap", str(tmp_path / "sparse"), "--center", "1,2",
                          "--weights", "synthetic:1", "--out", str(tmp_path / "m.obj")])
    assert "--center 1,2: expected 'points', 'axes' or X,Y,Z" in err
