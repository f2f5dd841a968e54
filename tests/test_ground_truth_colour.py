"""Ground truth has one colour in every picture of it: the report gallery's point-set panel and its
overlay on the prediction draw it in the same red (the report page says "ground truth red")."""

from __future__ import annotations

import numpy as np

from xmesh.pictures.views import mesh_panel, points_panel
from xmesh.render.draw import GT_COLOR, POINT_COLOR

ROW = np.array([30.0, 25.0, 0.0, 0.75, 25.0], dtype=np.float32)


def _coloured(panel: np.ndarray) -> np.ndarray:
    """The panel's pixels that are neither grey nor white (the shaded mesh, the labels and the background are)."""
    pixels = panel.reshape(-1, 3).astype(int)
    return pixels[pixels.max(axis=1) - pixels.min(axis=1) > 80]


def test_ground_truth_is_the_same_red_alone_and_over_the_prediction():
    rng = np.random.default_rng(0)
    vertices = np.array([[0.1, 0, 0], [-0.1, 0.1, 0], [0, -0.1, 0.1], [0, 0, -0.12]], dtype=np.float32)
    faces = np.array([[0, 1, 2], [0, 3, 1], [0, 2, 3], [1, 3, 2]])
    points = rng.normal(size=(400, 3)).astype(np.float32)
    points = 0.12 * points / np.linalg.norm(points, axis=1, keepdims=True)
    alone = _coloured(points_panel(points, ROW, 160, camera0_row=ROW, title="ground truth")[0])
    over = _coloured(mesh_panel(vertices, faces, ROW, 160, camera0_row=ROW, points=points, title="overlay")[0])
    red = np.array(POINT_COLOR[:3])
    assert np.allclose(np.array(GT_COLOR) * 255, red)
    for pixels in (alone, over):
        assert len(pixels) > 50
        assert np.all(pixels[:, 0] > pixels[:, 2] + 80) and np.all(pixels[:, 0] > pixels[:, 1] + 80)  # red, not blue
        assert (pixels == red).all(axis=1).any()  # the nearest points in exactly the one colour
