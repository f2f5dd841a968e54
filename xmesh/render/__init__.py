"""How xmesh draws a mesh: a NumPy/numba z-buffer rasteriser, views framed to fit, and meshes and point
sets seen through xmesh's camera rows.

``raster``: triangle z-buffer, Lambert shading, dots; ``framing``: a camera row's direction moved and
zoomed to fit a mesh's bounds; ``draw``: meshes and point sets seen through camera rows (or a framing),
images side by side, PNG output, ground-truth point files read back.
"""

import importlib

_HOMES = {
    "render_mesh": "draw",
    "render_points": "draw",
    "render_views": "draw",
    "save_png": "draw",
    "tile": "draw",
    "Framing": "framing",
    "fit_framing": "framing",
    "rasterize": "raster",
}


def __getattr__(name: str):
    """The names below, imported on first use: the rasteriser's numba kernels are loaded only when drawing."""
    if name in _HOMES:
        return getattr(importlib.import_module(f"xmesh.render.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'xmesh.render' has no attribute {name!r}")


__all__ = [
    "Framing",
    "fit_framing",
    "rasterize",
    "render_mesh",
    "render_points",
    "render_views",
    "save_png",
    "tile",
]
