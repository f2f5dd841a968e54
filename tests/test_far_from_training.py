"""Inputs far from the network's training get a warning naming what is odd: tiny images, a field of
view other than 25, a camera distance in another unit; training-like inputs get none."""

from __future__ import annotations

import warnings

import cv2
import numpy as np
import pytest

from xmesh.io.cameras import load_cameras
from xmesh.io.images import load_images

ROWS = [[28.9, 28.4, 0, 0.785, 25], [93.9, 26.3, 0, 0.703, 25], [278.2, 29.4, 0, 0.741, 25]]


def _white_object(path, side):
    image = np.full((side, side, 3), 255, np.uint8)
    image[side // 3 : side - side // 3 or 1, side // 3 : side - side // 3 or 1] = (40, 90, 200)
    cv2.imwrite(str(path), image)
    return path


@pytest.mark.parametrize("side", [1, 10, 63])
def test_a_tiny_image_warns_that_it_is_enlarged(tmp_path, side):
    normal = [_white_object(tmp_path / f"n{i}.png", 137) for i in range(2)]
    tiny = _white_object(tmp_path / "tiny.png", side)
    with pytest.warns(UserWarning) as caught:
        images = load_images([normal[0], tiny, normal[1]])
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and messages[0].startswith(f"view 2 ({tiny}): it is only {side}x{side} pixels")
    assert f"enlarged {224 / side:.3g} times to 224x224" in messages[0]
    assert images.shape == (3, 224, 224, 3)


def test_renderings_of_64_pixels_and_more_do_not_warn(tmp_path):
    paths = [_white_object(tmp_path / f"{side}.png", side) for side in (64, 137, 224)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_images(paths)


@pytest.mark.parametrize(
    ("column", "value", "said"),
    [
        (4, 30.0, "row 1 has field of view 30 (column 4); the training cameras' is 25"),
        (4, 0.0, "row 1 has field of view 0 (column 4)"),
        (3, 785.0, "row 1 has distance 785 (another unit, such as millimetres?), far from the 0.62-0.88 of training"),
        (3, 2.5, "row 1 has distance 2.5, far from the 0.62-0.88 of training"),
        (3, 0.3, "row 1 has distance 0.3, far"),
    ],
)
def test_cameras_far_from_training_warn_naming_the_row(column, value, said):
    rows = np.array(ROWS)
    rows[1, column] = value
    with pytest.warns(UserWarning, match=r"load_cameras: cameras array: ") as caught:
        out = load_cameras(rows)
    assert len(caught) == 1 and said in str(caught[0].message)
    assert "millimetres" in str(caught[0].message) if value == 785.0 else "millimetres" not in str(caught[0].message)
    np.testing.assert_array_equal(out, rows.astype(np.float32))  # warned, not changed


def test_a_file_names_its_own_row_numbers(tmp_path):
    rows = np.array([ROWS[0]] * 8)
    rows[6, 3] = 785.0  # rendering_metadata.txt: views 0, 6, 7 by default
    path = tmp_path / "rendering_metadata.txt"
    path.write_text("\n".join(" ".join(f"{v:g}" for v in row) for row in rows) + "\n")
    with pytest.warns(UserWarning, match=r"row 6 has distance 785 "):
        load_cameras(path)


def test_training_like_cameras_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_cameras(np.array(ROWS))
        load_cameras(np.array([[0, 30, 0, 0.45, 25], [0, 30, 0, 1.3, 25], [0, 30, 0, 0.62, 25]]))
