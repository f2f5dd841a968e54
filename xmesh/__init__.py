"""xmesh: Pixel2Mesh++ multi-view mesh reconstruction on NumPy or CuPy, no deep-learning framework.

>>> import xmesh
>>> mesh = xmesh.reconstruct(["a.png", "b.png", "c.png"], "cameras.txt", weights="p2mpp.npz")
>>> mesh.to_obj("out.obj")
"""

from __future__ import annotations

from .errors import XmeshError, interrupted_while_starting, started_as_the_command

try:  # a second or more on a busy machine, in which the xmesh command's Ctrl+C would print a traceback
    from . import cameras
    from .mesh import Mesh
    from .reconstruct import Reconstructor, reconstruct
except KeyboardInterrupt:
    if started_as_the_command():  # in one line; a library's user gets the KeyboardInterrupt
        interrupted_while_starting()
    raise

__version__ = "0.1.0"
__all__ = ["cameras", "reconstruct", "Reconstructor", "Mesh", "XmeshError", "__version__"]
