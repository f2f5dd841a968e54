"""Procedural objects, a NumPy/numba z-buffer rasteriser, ShapeNet-style renderings and datasets.

``shapes``: closed procedural meshes and area-weighted surface sampling; ``raster``: triangle
z-buffer, Lambert shading, dots; ``render``: meshes seen through xmesh's camera rows, PNG output;
``dataset``: ShapeNet-style camera sets, rendering folders, the Pixel2Mesh++ dataset layout, demo inputs.
"""
from xmesh.synthetic.dataset import (
    demo_inputs,
    demo_scene,
    shapenet_cameras,
    write_dataset,
    write_rendering_set,
)
from xmesh.synthetic.render import render_mesh, render_views, save_png
from xmesh.synthetic.shapes import SHAPE_NAMES, make_shape, sample_surface

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
