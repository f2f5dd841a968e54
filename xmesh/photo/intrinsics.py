"""A photo's intrinsics: pinhole focal lengths and principal point, an optional lens distortion.

Pixel coordinates follow COLMAP: (0, 0) is the top-left corner of the top-left pixel, so pixel
(row r, column c) spans [c, c+1) x [r, r+1) and its centre is (c + 0.5, r + 0.5). Distortion maps
normalised image coordinates (x, y) = (X/Z, Y/Z) of the OpenCV camera frame (x right, y down, z
forward) to distorted ones with COLMAP's formulas for its models ``SIMPLE_RADIAL``, ``RADIAL``,
``OPENCV`` and ``FULL_OPENCV``; only the forward direction is needed (3D -> photo).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from xmesh.errors import InputError

#: COLMAP camera model -> (parameter names in order, distortion kind)
MODELS = {
    "SIMPLE_PINHOLE": (("f", "cx", "cy"), None),
    "PINHOLE": (("fx", "fy", "cx", "cy"), None),
    "SIMPLE_RADIAL": (("f", "cx", "cy", "k1"), "radial"),
    "RADIAL": (("f", "cx", "cy", "k1", "k2"), "radial"),
    "OPENCV": (("fx", "fy", "cx", "cy", "k1", "k2", "p1", "p2"), "opencv"),
    "FULL_OPENCV": (("fx", "fy", "cx", "cy", "k1", "k2", "p1", "p2", "k3", "k4", "k5", "k6"), "full_opencv"),
}
DISTORTION_NAMES = ("k1", "k2", "p1", "p2", "k3", "k4", "k5", "k6")


@dataclass(frozen=True)
class Intrinsics:
    """fx, fy, cx, cy in pixels; width, height of the photo (None where unknown); distortion
    coefficients by name (k1..k6 radial, p1, p2 tangential; absent ones are 0)."""

    fx: float
    fy: float
    cx: float
    cy: float
    width: int | None = None
    height: int | None = None
    distortion: dict = field(default_factory=dict)

    @property
    def distorted(self) -> bool:
        return any(float(v) != 0.0 for v in self.distortion.values())

    def scaled_to(self, width: int, height: int, what: str) -> Intrinsics:
        """These intrinsics for the same photo stored at another size (e.g. COLMAP ran on a smaller
        copy). Width and height must scale alike (within a pixel); InputError otherwise."""
        if self.width is None or self.height is None or (width, height) == (self.width, self.height):
            return Intrinsics(self.fx, self.fy, self.cx, self.cy, width, height, dict(self.distortion))
        sx, sy = width / self.width, height / self.height
        if abs(sx * self.height - height) > 1.0 or abs(sy * self.width - width) > 1.0:
            raise InputError(
                f"{what}: the photo is {width}x{height} pixels but its camera was calibrated at "
                f"{self.width}x{self.height}, another aspect ratio; use the photo the camera was "
                "calibrated on (or one scaled uniformly from it)"
            )
        return Intrinsics(self.fx * sx, self.fy * sy, self.cx * sx, self.cy * sy, width, height, dict(self.distortion))

    def distort(self, x, y):
        """Normalised undistorted coordinates -> normalised distorted ones (COLMAP's formulas)."""
        if not self.distorted:
            return x, y
        d = {name: float(self.distortion.get(name, 0.0)) for name in DISTORTION_NAMES}
        r2 = x * x + y * y
        radial = 1.0 + d["k1"] * r2 + d["k2"] * r2 * r2 + d["k3"] * r2**3
        radial = radial / (1.0 + d["k4"] * r2 + d["k5"] * r2 * r2 + d["k6"] * r2**3)
        xy = x * y
        xd = x * radial + 2.0 * d["p1"] * xy + d["p2"] * (r2 + 2.0 * x * x)
        yd = y * radial + 2.0 * d["p2"] * xy + d["p1"] * (r2 + 2.0 * y * y)
        return xd, yd

    def project(self, camera_points) -> tuple[np.ndarray, np.ndarray]:
        """OpenCV camera-frame points (..., 3) -> (pixel coordinates (..., 2) as (u, v), in front (...) bool)."""
        p = np.asarray(camera_points, dtype=np.float64)
        z = p[..., 2]
        front = z > 0
        safe = np.where(front, z, 1.0)
        xd, yd = self.distort(p[..., 0] / safe, p[..., 1] / safe)
        return np.stack([self.fx * xd + self.cx, self.fy * yd + self.cy], axis=-1), front

    def inside(self, uv) -> np.ndarray:
        """Whether pixel coordinates (..., 2) lie on the photo (always True where its size is unknown)."""
        uv = np.asarray(uv, dtype=np.float64)
        if self.width is None or self.height is None:
            return np.ones(uv.shape[:-1], dtype=bool)
        return (uv[..., 0] >= 0) & (uv[..., 0] <= self.width) & (uv[..., 1] >= 0) & (uv[..., 1] <= self.height)


def from_model(model: str, width: int | None, height: int | None, params, what: str) -> Intrinsics:
    """Intrinsics from a COLMAP camera model name and its parameter list."""
    if model not in MODELS:
        raise InputError(
            f"{what}: camera model {model!r} is not supported; supported: {', '.join(MODELS)}. "
            "Undistort the images with `colmap image_undistorter` (it writes PINHOLE cameras) "
            "and use its sparse model"
        )
    names, _ = MODELS[model]
    params = [float(p) for p in params]
    if len(params) != len(names):
        raise InputError(
            f"{what}: camera model {model} takes {len(names)} parameters ({' '.join(names)}), got {len(params)}"
        )
    values = dict(zip(names, params))
    fx = values.get("fx", values.get("f"))
    fy = values.get("fy", values.get("f"))
    if not (np.isfinite(params).all() and fx > 0 and fy > 0):
        raise InputError(f"{what}: camera parameters {params} must be finite with focal lengths > 0")
    distortion = {k: v for k, v in values.items() if k in DISTORTION_NAMES}
    return Intrinsics(fx, fy, values["cx"], values["cy"], width, height, distortion)
