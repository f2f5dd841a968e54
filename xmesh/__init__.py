"""xmesh: Pixel2Mesh++ multi-view mesh reconstruction on NumPy or CuPy, no deep-learning framework.

    >>> import xmesh
    >>> mesh = xmesh.reconstruct(["a.png", "b.png", "c.png"], "cameras.txt", weights="p2mpp.npz")
    >>> mesh.to_obj("out.obj")
"""
from __future__ import annotations

import os
import sys

from .errors import XmeshError, interrupted_while_starting

try:   # a second or more on a busy machine, in which the xmesh command's Ctrl+C would print a traceback
    from . import cameras
    from .mesh import Mesh
    from .reconstruct import Reconstructor, reconstruct
except KeyboardInterrupt:
    # the xmesh command (its script, or python -m xmesh while the package is found) answers it in one line
    if sys.argv[:1] == ["-m"] or os.path.basename(sys.argv[0] if sys.argv else "") == "xmesh":
        interrupted_while_starting()
    raise

__version__ = "0.1.0"
__all__ = ["cameras", "reconstruct", "Reconstructor", "Mesh", "XmeshError", "__version__"]
