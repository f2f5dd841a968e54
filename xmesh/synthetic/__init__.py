"""Procedural objects, a NumPy/numba z-buffer rasteriser, ShapeNet-style renderings and datasets.

``shapes``: closed procedural meshes and area-weighted surface sampling; ``raster``: triangle
z-buffer, Lambert shading, dots; ``render``: meshes seen through xmesh's camera rows, PNG output;
``dataset``: ShapeNet-style camera sets, rendering folders, the Pixel2Mesh++ dataset layout, demo inputs.
"""
import importlib

_HOMES = {"demo_inputs": "dataset", "demo_scene": "dataset", "shapenet_cameras": "dataset", "write_dataset": "dataset",
          "write_rendering_set": "dataset", "render_mesh": "render", "render_views": "render", "save_png": "render",
          "SHAPE_NAMES": "shapes", "make_shape": "shapes", "sample_surface": "shapes"}


def __getattr__(name: str):
    """The names below, imported on first use: the rasteriser's numba kernels are not loaded by a
    module that needs only the shapes."""
    if name in _HOMES:
        return getattr(importlib.import_module(f"xmesh.synthetic.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'xmesh.synthetic' has no attribute {name!r}")


__all__ = [
    "SHAPE_NAMES",
    "demo_inputs",
    "demo_scene",
    "make_shape",
    "render_mesh",
    "render_views",
    "sample_surface",
    "save_png",
    "shapenet_cameras",
    "write_dataset",
    "write_rendering_set",
]
