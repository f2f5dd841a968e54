"""One posed photo (:class:`PhotoView`) and how messages name it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xmesh.photo.intrinsics import Intrinsics


@dataclass(frozen=True)
class PhotoView:
    """One posed photo: ``rotation`` (3, 3) world -> camera with OpenCV axes (x right, y down,
    z forward), ``centre`` (3,) the camera centre in world coordinates."""

    name: str
    intrinsics: Intrinsics
    rotation: np.ndarray
    centre: np.ndarray

    def to_camera(self, points) -> np.ndarray:
        return (np.asarray(points, dtype=np.float64) - self.centre) @ self.rotation.T


def view_label(index: int, view: PhotoView) -> str:
    return f"view {index} ({view.name})" if view.name else f"view {index}"
