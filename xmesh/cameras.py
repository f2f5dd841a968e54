"""Cameras for your own photos, in the network's convention.

    >>> import xmesh
    >>> cams = xmesh.cameras.from_colmap("sparse/0", ["a.jpg", "b.jpg", "c.jpg"], masks=["a.png", "b.png", "c.png"])
    >>> mesh = xmesh.reconstruct(["a.jpg", "b.jpg", "c.jpg"], cams, weights="p2mpp.npz")   # in COLMAP's world

``from_colmap`` reads a COLMAP text model, ``from_poses`` camera-to-world matrices with intrinsics
(a ``poses.json`` or its content). Both return :class:`PhotoCameras`: the network's (3, 5) camera
rows (``.rows``), the similarity between the input world and the network's, and the preparation of
the photos (``.prepare_images``). ``xmesh.reconstruct`` and ``Reconstructor`` take it in place of
camera rows, prepare the photos with it and return the mesh in the input's world.
"""

from xmesh.photo.frame import TARGET_RADIUS, object_sphere
from xmesh.photo.posed import PhotoView
from xmesh.photo.sources import from_colmap, from_poses, read_poses
from xmesh.photo.views import PhotoCameras

__all__ = ["from_colmap", "from_poses", "read_poses", "PhotoCameras", "PhotoView", "object_sphere", "TARGET_RADIUS"]
