"""Photos -> the network's input views: masked on white, resampled through the network's camera.

The original loader takes a ShapeNet rendering (RGBA, the network's intrinsics at 137 px), sets
every pixel whose alpha is 0 to white, resizes it to 224x224 (INTER_LINEAR) and divides by 255.
Here a photo of any size and intrinsics goes through the same steps, the resize generalised to a
reprojection: each output pixel (centre (c + 0.5, r + 0.5)) is the ray of the network's camera for
that view (focal 248 px, principal point (112, 112) at 224 px), turned into the photo's camera
(same centre; roll and aim may differ) and projected with the photo's intrinsics and distortion.
Where that mapping is the plain resize (the network's intrinsics, no roll, aimed at the object
centre) the original loader itself runs, so its output is bit for bit the original's. Otherwise
the photo is first shrunk (INTER_AREA) where it holds more than twice the needed resolution, then
sampled bilinearly in float64; rays that miss the photo read white.

Object pixels: the photo's alpha channel (alpha 0 is background, as in the original), or a mask
(any size-matched image; nonzero above half its range is object), which replaces the alpha.

``cameras`` below is a :class:`~xmesh.photo.views.PhotoCameras` (whose ``prepare_images`` calls
:func:`prepare_photos`).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import cv2
import numpy as np

from xmesh.errors import InputError
from xmesh.io.images import IMAGE_SIZE, NETWORK_SHAPE, NUM_VIEWS, decode_file, prepare_image, scale_of, to_bgr_or_bgra
from xmesh.model.camera import CENTER, FOCAL
from xmesh.photo.posed import view_label

RESIZE_MATCH_PX = 1e-6  # mapping within this of the plain resize: the original loader runs
SHRINK_ABOVE = 2.0  # photo pixels per output pixel above which the photo is shrunk first


def _decoded(item, what: str) -> np.ndarray:
    if isinstance(item, (str, os.PathLike)):
        return decode_file(Path(item))
    if isinstance(item, np.ndarray):
        return item
    raise InputError(f"{what}: a {type(item).__name__}; expected a path or an image array")


def load_mask(item, what: str, shape: tuple | None = None) -> np.ndarray:
    """A mask (path or array) as a bool (H, W) array: alpha of a 4-channel image, the brightest colour
    channel otherwise, object where above half the range. ``shape``: the photo's (H, W), which the
    mask must match. An empty mask is an InputError."""
    mask = np.asarray(_decoded(item, what))
    if mask.ndim == 3:
        mask = mask[:, :, -1] if mask.shape[2] in (2, 4) else mask.max(axis=2)
    if mask.ndim != 2:
        raise InputError(f"{what}: shape {mask.shape}; expected an (H, W) mask image")
    if shape is not None and mask.shape != tuple(shape):
        raise InputError(
            f"{what}: the mask is {mask.shape[1]}x{mask.shape[0]} pixels but its photo is "
            f"{shape[1]}x{shape[0]}; expected a mask of the photo's size"
        )
    binary = mask.copy() if mask.dtype == np.bool_ else mask.astype(np.float64) > 0.5 * scale_of(mask, what)
    if not binary.any():
        raise InputError(
            f"{what} is empty (no pixel marks the object); expected the object's pixels above half "
            "the mask's range (white on black)"
        )
    return binary


def network_rays() -> np.ndarray:
    """The network camera's rays through each output pixel centre, OpenCV axes: (224, 224, 3)."""
    centres = np.arange(IMAGE_SIZE, dtype=np.float64) + 0.5
    u, v = np.meshgrid(centres, centres)
    return np.stack([(u - CENTER) / FOCAL, (v - CENTER) / FOCAL, np.ones_like(u)], axis=-1)


def source_coordinates(cameras, index: int, intrinsics) -> tuple[np.ndarray, np.ndarray]:
    """Per output pixel, the photo's continuous pixel coordinates (224, 224, 2) and whether the ray
    points into the photo's camera (in front of it)."""
    view = cameras.views[index]
    turn = view.rotation @ cameras.virtual_rotation(index).T  # network camera -> photo camera
    return intrinsics.project(network_rays() @ turn.T)


def _resize_mapping(uv: np.ndarray, width: int, height: int) -> bool:
    """Whether the mapping is cv2.resize's from a width x height image (pixel-centre aligned)."""
    centres = np.arange(IMAGE_SIZE, dtype=np.float64) + 0.5
    u, v = np.meshgrid(centres * width / IMAGE_SIZE, centres * height / IMAGE_SIZE)
    return bool(np.abs(uv[..., 0] - u).max() <= RESIZE_MATCH_PX and np.abs(uv[..., 1] - v).max() <= RESIZE_MATCH_PX)


def bilinear_white(image: np.ndarray, uv: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Sample ``image`` (H, W, C) float64 at continuous coordinates uv (..., 2); white (1.0) outside
    the photo or where ``valid`` is False. Half a pixel past the border repeats the edge pixel."""
    height, width = image.shape[:2]
    x, y = uv[..., 0] - 0.5, uv[..., 1] - 0.5
    inside = valid & (x >= -0.5) & (x <= width - 0.5) & (y >= -0.5) & (y <= height - 0.5)
    x = np.where(inside, x, 0.0)
    y = np.where(inside, y, 0.0)
    x0, y0 = np.floor(x), np.floor(y)
    fx, fy = (x - x0)[..., None], (y - y0)[..., None]
    xa, xb = np.clip(x0, 0, width - 1).astype(np.intp), np.clip(x0 + 1, 0, width - 1).astype(np.intp)
    ya, yb = np.clip(y0, 0, height - 1).astype(np.intp), np.clip(y0 + 1, 0, height - 1).astype(np.intp)
    out = (image[ya, xa] * (1 - fx) + image[ya, xb] * fx) * (1 - fy) + (
        image[yb, xa] * (1 - fx) + image[yb, xb] * fx
    ) * fy
    return np.where(inside[..., None], out, 1.0)


def prepare_photo(cameras, index: int, image, mask=None) -> np.ndarray:
    """One photo (path or array, any size, 1-4 channels, 8/16-bit or float) -> (224, 224, 3) float32
    BGR in [0, 1], as the network's camera for view ``index`` would have seen it on white."""
    view = cameras.views[index]
    label = view_label(index, view)
    what = f"{label}: photo {str(image)!r}" if isinstance(image, (str, os.PathLike)) else f"{label}: photo"
    image = to_bgr_or_bgra(np.asarray(_decoded(image, what)), what)
    scale = scale_of(image, what)
    height, width = image.shape[:2]
    if mask is not None:
        mask_what = f"{label}: mask {str(mask)!r}" if isinstance(mask, (str, os.PathLike)) else f"{label}: mask"
        alpha = load_mask(mask, mask_what, (height, width))
        image = np.concatenate([image[:, :, :3], np.where(alpha, scale, 0).astype(image.dtype)[:, :, None]], axis=2)
    elif image.shape[2] == 4 and not image[:, :, 3].any():
        raise InputError(
            f"{what}: the alpha channel is 0 everywhere, an empty mask; expected the object's pixels to have alpha > 0"
        )
    elif image.shape[2] == 3:
        warnings.warn(
            f"{what}: no mask and no alpha channel, so the photo is used with its background; the "
            "network was trained on objects on white: give a mask (--masks) or an RGBA photo",
            stacklevel=3,
        )
    if image.shape[2] == 4:
        image = image.copy()
        image[image[:, :, 3] == 0] = scale  # the original loader's compositing on white
    intrinsics = view.intrinsics.scaled_to(width, height, what)
    uv, front = source_coordinates(cameras, index, intrinsics)
    if front.all() and _resize_mapping(uv, width, height):
        return prepare_image(image, name=what)
    colour = image[:, :, :3]
    if colour.dtype == np.float16:
        colour = colour.astype(np.float32)
    spacing = _pixel_spacing(uv)
    if spacing > SHRINK_ABOVE:
        size = (max(1, round(width / spacing)), max(1, round(height / spacing)))
        colour = cv2.resize(colour, size, interpolation=cv2.INTER_AREA)
        uv = uv * np.array([size[0] / width, size[1] / height])
    return bilinear_white(colour.astype(np.float64) / scale, uv, front).astype(np.float32)


def _pixel_spacing(uv: np.ndarray) -> float:
    """Photo pixels between neighbouring output pixels (median over the image)."""
    du = np.hypot(*np.moveaxis(np.diff(uv, axis=1), -1, 0))
    dv = np.hypot(*np.moveaxis(np.diff(uv, axis=0), -1, 0))
    return float(np.median(np.concatenate([du.ravel(), dv.ravel()])))


def prepare_photos(cameras, images, masks) -> np.ndarray:
    """The three photos as the network input (3, 224, 224, 3) float32; ``masks`` a sequence of 3
    (entries may be None: that photo's alpha, if any, is used)."""
    if isinstance(images, (str, bytes, os.PathLike)) or not hasattr(images, "__len__"):
        raise InputError(f"images: expected {NUM_VIEWS} photos (paths or arrays), got {images!r}")
    masks = (None,) * NUM_VIEWS if masks is None else masks
    if len(images) != NUM_VIEWS or len(masks) != NUM_VIEWS:
        raise InputError(
            f"got {len(images)} photos and {len(masks)} masks for {NUM_VIEWS} views; give one photo "
            "(and one mask, or none) per camera, in the cameras' order"
        )
    out = np.empty(NETWORK_SHAPE, dtype=np.float32)
    for i in range(NUM_VIEWS):
        out[i] = prepare_photo(cameras, i, images[i], masks[i])
    return out
