"""Procedural objects, ShapeNet-style renderings and datasets, a synthetic hand-held capture.

``shapes``: closed procedural meshes and area-weighted surface sampling; ``dataset``: ShapeNet-style
camera sets, rendering folders (drawn by :mod:`xmesh.render`), the Pixel2Mesh++ dataset layout, demo
inputs; ``capture``: a synthetic hand-held capture with its COLMAP model.
"""

import importlib

_HOMES = {
    "demo_inputs": "dataset",
    "demo_scene": "dataset",
    "shapenet_cameras": "dataset",
    "write_dataset": "dataset",
    "write_rendering_set": "dataset",
    "SHAPE_NAMES": "shapes",
    "make_shape": "shapes",
    "sample_surface": "shapes",
}


def __getattr__(name: str):
    """The names below, imported on first use: the renderer's numba kernels are not loaded by a
    module that needs only the shapes."""
    if name in _HOMES:
        return getattr(importlib.import_module(f"xmesh.synthetic.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'xmesh.synthetic' has no attribute {name!r}")


__all__ = [
    "SHAPE_NAMES",
    "demo_inputs",
    "demo_scene",
    "make_shape",
    "sample_surface",
    "shapenet_cameras",
    "write_dataset",
    "write_rendering_set",
]
