"""Comparing two drawings of one mesh whose vertices may differ in their last bits.

The network's mesh for one sample computed alone or inside a batch, or on a CPU whose BLAS sums in
another order, agrees to about 1e-5 of its size: thousandths of a pixel once drawn. The rasteriser
covers a sub-pixel sample when its centre lies inside a triangle, so such a move flips only samples
that a triangle's edge passes within that distance of, and a sliver's shade (its normal is
ill-conditioned) changes with it. So the pixels that may differ are those within one pixel of an
edge of the mesh as drawn (``edge_band``); everywhere else the two drawings must agree, and along
the edges they must still cover mostly the same pixels. Measured on the gallery's synthetic
prediction (a needle-thin mesh, the hardest case): vertices moved by 1e-5 of their size keep
coverage overlap >= 0.96 and by 1e-4 >= 0.79, all changes on the band; by 1e-3 it drops to 0.42 with
changes off the band, so the checks below tell a last-bit difference from another drawing.
"""

from __future__ import annotations

import cv2
import numpy as np

MIN_OVERLAP = 0.7  # intersection over union of the two drawings' coverage along the edges


def edge_band(xy: np.ndarray, faces: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Pixels within one pixel of an edge of any triangle: ``xy`` (V, 2) screen coordinates
    (column, row; pixel (r, c) spans [c, c+1) x [r, r+1)), ``faces`` (F, 3), ``shape`` (H, W)."""
    lines = np.zeros(shape, np.uint8)
    fixed = np.round((np.asarray(xy, np.float64) - 0.5) * 16).astype(np.int64)  # cv2's 4 fractional bits
    fixed = np.clip(fixed, -(1 << 24), 1 << 24)
    for a, b in ((0, 1), (1, 2), (2, 0)):
        for p, q in zip(fixed[faces[:, a]], fixed[faces[:, b]]):
            cv2.line(lines, (int(p[0]), int(p[1])), (int(q[0]), int(q[1])), 1, 1, cv2.LINE_8, 4)
    return cv2.dilate(lines, np.ones((3, 3), np.uint8)).astype(bool)


def coverage(rgb: np.ndarray, background: int = 255) -> np.ndarray:
    """Pixels where anything is drawn: any channel other than the background's."""
    return np.any(rgb != background, axis=2)


def assert_same_drawing(got: np.ndarray, expected: np.ndarray, band: np.ndarray, background: int = 255) -> None:
    """``got`` and ``expected`` (RGB) draw the same mesh: they differ (by more than shading's
    rounding) only on its ``edge_band``, and there cover mostly the same pixels."""
    assert got.shape == expected.shape and band.shape == got.shape[:2], (got.shape, expected.shape, band.shape)
    changed = np.any(np.abs(got.astype(int) - expected.astype(int)) > 1, axis=2)
    off = changed & ~band
    assert not off.any(), (
        f"{off.sum()} pixel(s) differ away from the mesh's edges, e.g. at {np.argwhere(off)[:3].tolist()}"
    )
    drawn, wanted = coverage(got, background) & band, coverage(expected, background) & band
    assert wanted.any(), "the expected drawing shows nothing of the mesh"
    overlap = (drawn & wanted).sum() / (drawn | wanted).sum()
    assert overlap >= MIN_OVERLAP, f"the drawings cover different pixels along the edges (overlap {overlap:.2f})"
