"""xmesh: Pixel2Mesh++ multi-view mesh reconstruction on NumPy or CuPy, no deep-learning framework.

    >>> import xmesh
    >>> mesh = xmesh.reconstruct(["a.png", "b.png", "c.png"], "cameras.txt", weights="p2mpp.npz")
    >>> mesh.to_obj("out.obj")
"""
from __future__ import annotations

from . import cameras
from .errors import XmeshError
from .mesh import Mesh
from .reconstruct import Reconstructor, reconstruct

__version__ = "0.1.0"
__all__ = ["cameras", "reconstruct", "Reconstructor", "Mesh", "XmeshError", "__version__"]
