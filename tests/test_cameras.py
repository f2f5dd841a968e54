"""Camera rows from arrays, cameras.txt and ShapeNet rendering_metadata.txt."""

from __future__ import annotations

import numpy as np
import pytest

from xmesh.errors import FileFormatError, InputError, MissingFileError
from xmesh.io.cameras import load_cameras, read_camera_file

ROWS = [[float(i * 15), 20.0 + i, 0.0, 0.6 + 0.01 * i, 25.0] for i in range(24)]


def _metadata_text(rows) -> str:
    return "".join(" ".join(repr(v) for v in row) + "\n" for row in rows)


def test_demo_cameras_equal_golden(demo_dir, golden_dir):
    golden = np.load(golden_dir / "demo_seed1.npz")["cameras"]
    cameras = load_cameras(demo_dir / "cameras.txt")
    assert cameras.shape == (3, 5) and cameras.dtype == np.float32
    assert np.array_equal(cameras, golden)
    assert np.array_equal(load_cameras(str(demo_dir / "cameras.txt")), golden)


def test_array_sources():
    rows = np.asarray(ROWS, dtype=np.float64)
    out = load_cameras(rows[:3])
    assert out.dtype == np.float32 and np.array_equal(out, rows[:3].astype(np.float32))
    assert np.array_equal(load_cameras(ROWS[:3]), out)  # nested lists
    assert np.array_equal(load_cameras(rows, views=[5, 0, 23]), rows[[5, 0, 23]].astype(np.float32))
    assert np.array_equal(load_cameras(rows), out)  # more rows: (0, 1, 2) by default
    assert np.array_equal(load_cameras(rows, views=np.array([1, 1, 2])), rows[[1, 1, 2]].astype(np.float32))
    ints = np.array([[0, 30, 0, 2, 25]] * 3)
    assert np.array_equal(load_cameras(ints), ints.astype(np.float32))


def test_rendering_metadata_default_views(tmp_path):
    folder = tmp_path / "02691156" / "abc" / "rendering"
    folder.mkdir(parents=True)
    path = folder / "rendering_metadata.txt"
    path.write_text(_metadata_text(ROWS))
    expected = np.asarray(ROWS, dtype=np.float64)[[0, 6, 7]].astype(np.float32)
    assert np.array_equal(load_cameras(path), expected)
    assert np.array_equal(load_cameras(path, views=(3, 2, 1)), np.asarray(ROWS, np.float32)[[3, 2, 1]])
    other = tmp_path / "cams.txt"
    other.write_text(_metadata_text(ROWS))
    assert np.array_equal(load_cameras(other), np.asarray(ROWS, np.float32)[:3])
    assert read_camera_file(other).shape == (24, 5)


def test_comments_blank_lines_commas_and_bom(tmp_path):
    path = tmp_path / "cameras.txt"
    path.write_bytes(
        "\ufeff# az el 0 d 25\n\n10, 20, 0, 0.5, 25\n  30 40 0 0.7 25   # second\n\n50 60 0 0.9 25\n".encode()
    )
    out = load_cameras(path)
    assert np.array_equal(out, np.array([[10, 20, 0, 0.5, 25], [30, 40, 0, 0.7, 25], [50, 60, 0, 0.9, 25]], np.float32))


@pytest.mark.parametrize(
    "text, error, pattern",
    [
        ("1 2 0 0.5 25\n1 2 0 0.5\n1 2 0 0.5 25\n", FileFormatError, r"line 2: 4 values; expected 5"),
        ("1 2 0 0.5 25\n1 2 0 0.5 25\n1 2 0 abc 25\n", FileFormatError, r"line 3: .*is not 5 numbers"),
        ("", FileFormatError, "holds no camera rows"),
        ("# only a comment\n", FileFormatError, "holds no camera rows"),
        ("1 2 0 0.5 25\n1 2 0 0.5 25\n", InputError, "holds 2 camera rows; 3 views are needed"),
        ("1 2 0 0.5 25\n1 nan 0 0.5 25\n1 2 0 0.5 25\n", InputError, "row 1 .*NaN or infinite"),
        ("1 2 0 0.5 25\n1 2 0 0.5 25\n1 2 0 inf 25\n", InputError, "row 2 .*NaN or infinite"),
        ("1 2 0 0 25\n1 2 0 0.5 25\n1 2 0 0.5 25\n", InputError, r"row 0 has distance 0 .*expected a distance > 0"),
        ("1 2 0 0.5 25\n1 2 0 -1 25\n1 2 0 0.5 25\n", InputError, r"row 1 has distance -1"),
    ],
)
def test_bad_files(tmp_path, text, error, pattern):
    path = tmp_path / "bad_cameras.txt"
    path.write_text(text)
    with pytest.raises(error, match=pattern) as info:
        load_cameras(path)
    assert "bad_cameras.txt" in str(info.value)


def test_missing_binary_and_directory(tmp_path):
    with pytest.raises(MissingFileError, match=r"nothere\.txt.*does not exist"):
        load_cameras(tmp_path / "nothere.txt")
    binary = tmp_path / "cams.bin"
    binary.write_bytes(b"\xff\xfe\x00\x81garbage")
    with pytest.raises(FileFormatError, match=r"cams\.bin.*not UTF-8"):
        load_cameras(binary)
    with pytest.raises(InputError, match="is a directory"):
        load_cameras(tmp_path)


def test_views_validation(tmp_path):
    path = tmp_path / "rendering_metadata.txt"
    path.write_text(_metadata_text(ROWS[:5]))  # too short for the default (0, 6, 7)
    with pytest.raises(InputError, match=r"index 6 is out of range; .*rendering_metadata\.txt.* has 5 rows"):
        load_cameras(path)
    rows = np.asarray(ROWS)
    with pytest.raises(InputError, match="2 indices; 3 views are needed"):
        load_cameras(rows, views=[0, 1])
    with pytest.raises(InputError, match="index -1 is out of range"):
        load_cameras(rows, views=[0, 1, -1])
    with pytest.raises(InputError, match="index 24 is out of range"):
        load_cameras(rows, views=[0, 1, 24])
    with pytest.raises(InputError, match="1.5 is not an integer"):
        load_cameras(rows, views=[0, 1, 1.5])
    with pytest.raises(InputError, match="expected a sequence"):
        load_cameras(rows, views="012")


def test_array_validation():
    with pytest.raises(InputError, match=r"shape \(3, 4\); expected \(3, 5\)"):
        load_cameras(np.zeros((3, 4)))
    with pytest.raises(InputError, match=r"shape \(5,\)"):
        load_cameras([0, 30, 0, 1, 25])
    with pytest.raises(InputError, match="holds 2 camera rows; 3 views are needed"):
        load_cameras(np.asarray(ROWS[:2]))
    with pytest.raises(InputError, match="dtype"):
        load_cameras([["a", "b", "c", "d", "e"]] * 3)
    with pytest.raises(InputError, match="could not be read as an array|dtype"):
        load_cameras([[1, 2], [1, 2, 3]])
    bad = np.asarray(ROWS[:3])
    bad[2, 3] = 0.0
    with pytest.raises(InputError, match="row 2 has distance 0"):
        load_cameras(bad)
    bad[2, 3] = np.inf
    with pytest.raises(InputError, match="row 2 .*NaN or infinite"):
        load_cameras(bad)
