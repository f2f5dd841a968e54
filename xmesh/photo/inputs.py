"""What a reconstruction call hands the network for either kind of cameras: camera rows (with images
already in the network's framing) or :class:`PhotoCameras` (photos to resample, mesh to move back)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from xmesh.errors import InputError
from xmesh.io.cameras import load_cameras
from xmesh.io.images import load_images
from xmesh.photo.views import PhotoCameras


def network_inputs(images: Any, cameras: Any, views: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(images (3, 224, 224, 3) float32, camera rows (3, 5) float32) for one sample."""
    if isinstance(cameras, PhotoCameras):
        if views is not None:
            raise InputError(
                f"views={views!r} picks rows of a camera file; PhotoCameras already hold their three views"
            )
        return cameras.prepare_images(images), cameras.rows
    return load_images(images), load_cameras(cameras, views=views)


def place(mesh, cameras: Any):
    """The network's mesh in the cameras' world: PhotoCameras move it to the input's world; camera
    rows leave it in camera 0's frame, as the original does."""
    return cameras.place(mesh) if isinstance(cameras, PhotoCameras) else mesh
