"""The demo's picture: the three input views beside the coarse and refined meshes, with a caption
that names the weights (synthetic or real)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from xmesh.pictures.panels import caption, framed_border, hstack, vstack
from xmesh.pictures.views import PANEL_SIZE, image_panel, mesh_panel
from xmesh.render.draw import save_png

MESH_COLOR = (0.55, 0.68, 0.85)


def weights_caption(weights=None, seed: int | None = None, recipe: str = "the test recipe") -> str:
    """The caption line naming the weights: the files given, or the synthetic ``recipe`` and ``seed``."""
    if weights:
        return "weights: " + ", ".join(str(w) for w in weights)
    return (
        f"weights: SYNTHETIC ({recipe}, seed {seed}; random, NOT trained): the pipeline working, "
        "not a reconstruction. --weights takes the real ones"
    )


def demo_picture(images, cameras, mesh, weights_line: str, detail: str = "", size: int = PANEL_SIZE) -> np.ndarray:
    """RGB picture: ``images`` (3 paths or RGBA arrays) then ``mesh.coarse()`` and ``mesh``, both in
    camera 0's frame and framed from camera 0's direction, then a caption: what is shown,
    ``weights_line`` and ``detail``."""
    cameras = np.asarray(cameras, dtype=np.float64)
    panels = [image_panel(image, size, title=f"input view {index + 1}") for index, image in enumerate(images)]
    if mesh.coarse_vertices is not None:
        panels.append(
            mesh_panel(
                mesh.coarse_vertices,
                mesh.faces,
                cameras[0],
                size,
                camera0_row=cameras[0],
                title="coarse (stage 1)",
                color=MESH_COLOR,
            )[0]
        )
    panels.append(
        mesh_panel(
            mesh.vertices,
            mesh.faces,
            cameras[0],
            size,
            camera0_row=cameras[0],
            title="refined (stage 2)",
            color=MESH_COLOR,
        )[0]
    )
    row = hstack([framed_border(p) for p in panels])
    lines = [
        "xmesh demo: the 3 input views and their cameras -> Pixel2Mesh++'s coarse and refined meshes, "
        "each framed to fit (xN: N times the size seen from input camera 1)",
        weights_line,
    ]
    if detail:
        lines.append(detail)
    return vstack([row, caption(row.shape[1], lines)])


def write_demo_picture(path: str | os.PathLike, images, cameras, mesh, weights_line: str, detail: str = "") -> Path:
    """Write :func:`demo_picture` as a PNG, atomically."""
    return save_png(path, demo_picture(images, cameras, mesh, weights_line, detail))
