"""Input images: files or arrays -> the network input, (3, 224, 224, 3) float32 BGR in [0, 1].

The loader reproduces the original Pixel2Mesh++ demo bit for bit (checked against the golden
``images``): ``cv2.imread(path, cv2.IMREAD_UNCHANGED)``; for a 4-channel image every pixel whose
alpha is 0 is set to white in all four channels; ``cv2.resize`` to 224x224 with INTER_LINEAR;
divide by 255; keep the first three channels (B, G, R).

Extensions for real-world files, applied before that pipeline so 8-bit colour files are untouched:

* grayscale (H, W) -> three equal channels; gray + alpha (H, W, 2) -> BGRA;
* paletted PNGs and CMYK JPEGs are expanded to BGR(A) by OpenCV itself;
* 16-bit images: alpha == 0 pixels become 65535 and the result is divided by 65535 instead of
  255, i.e. scaled to the same [0, 1] range as 8-bit files;
* float images (e.g. 32-bit TIFF) are taken as already in [0, 1] and checked to be so.

Files are read with ``np.fromfile`` + ``cv2.imdecode`` so non-ASCII paths work, and every
failure (missing, empty, not an image, truncated) raises an ``xmesh.errors`` error naming the file.
Note: like the original, EXIF orientation tags are ignored.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from xmesh.errors import FileFormatError, InputError, MissingFileError

NUM_VIEWS = 3
IMAGE_SIZE = 224
SMALLEST_SIDE = 64  # images with a side below this (under half the renderings' 137) are far from training
NETWORK_SHAPE = (NUM_VIEWS, IMAGE_SIZE, IMAGE_SIZE, 3)
WHITE_SHARE = 0.9  # a rim pixel is white when every channel is at least this share of full scale
WHITE_RIM = 0.9  # share of an image's outermost pixels that must be white when it has no alpha


_QUIET_LOCK = threading.Lock()
_quiet_depth = 0
_saved_level = None


@contextlib.contextmanager
def quiet_opencv():
    """OpenCV's own log lines (e.g. "[ WARN] ... PNG input buffer is incomplete") silenced while
    xmesh decodes, so a bad file shows only xmesh's error; the caller's level comes back after."""
    global _quiet_depth, _saved_level
    logging = cv2.utils.logging
    with _QUIET_LOCK:
        if _quiet_depth == 0:
            _saved_level = logging.getLogLevel()
            logging.setLogLevel(logging.LOG_LEVEL_ERROR)
        _quiet_depth += 1
    try:
        yield
    finally:
        with _QUIET_LOCK:
            _quiet_depth -= 1
            if _quiet_depth == 0:
                logging.setLogLevel(_saved_level)


def decode_file(path: Path) -> np.ndarray:
    """Read and decode one image file exactly as stored (cv2.IMREAD_UNCHANGED)."""
    if not path.exists():
        raise MissingFileError(f"image file {str(path)!r} does not exist; expected a PNG/JPEG/... image file")
    if path.is_dir():
        raise InputError(f"image path {str(path)!r} is a directory; expected an image file")
    try:
        data = np.fromfile(str(path), dtype=np.uint8)
    except OSError as exc:
        raise MissingFileError(
            f"image file {str(path)!r} cannot be read ({exc}); expected a readable image file"
        ) from exc
    return decode_image_bytes(data, f"image file {str(path)!r}")


def decode_image_bytes(data, name: str) -> np.ndarray:
    """Decode an image file's bytes exactly as stored (cv2.IMREAD_UNCHANGED), as a file of them is read;
    ``name`` says where they came from in errors."""
    data = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) else data
    if data.size == 0:
        raise FileFormatError(f"{name} is empty (0 bytes); expected an image file")
    try:
        with quiet_opencv():
            image = cv2.imdecode(data, cv2.IMREAD_UNCHANGED)
    except cv2.error as exc:  # OpenCV raises for some malformed inputs instead of returning None
        image = None
        reason = f" ({str(exc).strip().splitlines()[-1]})"
    else:
        reason = ""
    if image is None:
        raise FileFormatError(
            f"{name} ({data.size} bytes) could not be decoded{reason}: it is corrupt, "
            "truncated or not an image format OpenCV reads; expected e.g. a PNG or JPEG file"
        )
    return image


def scale_of(image: np.ndarray, name: str) -> float:
    """The value that maps to 1.0: 255 for 8-bit, 65535 for 16-bit, 1 for float data."""
    if image.dtype == np.uint8:
        return 255.0
    if image.dtype == np.uint16:
        return 65535.0
    if image.dtype in (np.float32, np.float64, np.float16):
        if not np.all(np.isfinite(image)):
            raise InputError(f"{name}: float image holds NaN or infinite values; expected finite values in [0, 1]")
        low, high = float(image.min(initial=0.0)), float(image.max(initial=0.0))
        if low < 0.0 or high > 1.0:
            raise InputError(
                f"{name}: float image values span [{low:g}, {high:g}]; expected values in [0, 1] "
                "(or pass uint8 / uint16 data, which is divided by 255 / 65535)"
            )
        return 1.0
    raise InputError(
        f"{name}: image dtype {image.dtype} is not supported; expected uint8 (0..255), uint16 (0..65535) "
        "or float in [0, 1]"
    )


def to_bgr_or_bgra(image: np.ndarray, name: str) -> np.ndarray:
    """Bring an (H, W), (H, W, 1|2|3|4) image to 3 (BGR) or 4 (BGRA) channels."""
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 2, 3, 4):
        raise InputError(
            f"{name}: image has shape {image.shape}; expected (H, W) gray or (H, W, C) "
            "with C = 1, 2, 3 (BGR) or 4 (BGRA)"
        )
    if image.shape[0] < 1 or image.shape[1] < 1:
        raise InputError(f"{name}: image has shape {image.shape}; expected at least 1x1 pixels")
    channels = image.shape[2]
    if channels == 1:
        return np.repeat(image, 3, axis=2)
    if channels == 2:  # gray + alpha
        return np.concatenate([np.repeat(image[:, :, :1], 3, axis=2), image[:, :, 1:2]], axis=2)
    return image


def prepare_image(image: np.ndarray, name: str = "image") -> np.ndarray:
    """One decoded image (any size, 1-4 channels, uint8/uint16/float) -> (224, 224, 3) float32 BGR in [0, 1].

    For 8-bit 4-channel input this is exactly the original loader: alpha == 0 pixels set to 255 in
    all channels, INTER_LINEAR resize, /255, first three channels.
    """
    image = np.asarray(image)
    if image.dtype == np.bool_ or not np.issubdtype(image.dtype, np.number):
        raise InputError(f"{name}: image dtype {image.dtype} is not numeric; expected uint8, uint16 or float in [0, 1]")
    image = to_bgr_or_bgra(image, name)
    scale = scale_of(image, name)
    if image.dtype == np.float16:
        image = image.astype(np.float32)
    if image.shape[2] == 4:
        image = image.copy()
        image[image[:, :, 3] == 0] = scale  # the original: img[np.where(img[:,:,3]==0)] = 255
    if image.shape[:2] != (IMAGE_SIZE, IMAGE_SIZE):
        image = cv2.resize(image, (IMAGE_SIZE, IMAGE_SIZE), interpolation=cv2.INTER_LINEAR)
    out = (image / scale).astype(np.float32)[:, :, :3]
    return np.ascontiguousarray(out)


def unlike_a_rendering(image: np.ndarray) -> list[str]:
    """How a decoded image differs from the renderings the network was trained on (ShapeNet's: square,
    colour, the object alone on white or on transparency): reasons to warn, empty when it looks like one."""
    reasons = []
    height, width = image.shape[:2]
    channels = 1 if image.ndim == 2 else image.shape[2]
    if height != width:
        reasons.append(f"it is {width}x{height}, not square, so it is stretched to {IMAGE_SIZE}x{IMAGE_SIZE}")
    if min(height, width) < SMALLEST_SIDE:
        reasons.append(
            f"it is only {width}x{height} pixels, so it is enlarged {IMAGE_SIZE / min(height, width):.3g} "
            f"times to {IMAGE_SIZE}x{IMAGE_SIZE} (the training renderings have 137x137)"
        )
    if channels <= 2:
        reasons.append("it is greyscale")
    if channels in (1, 3):  # no alpha: the background must be white already
        top = np.iinfo(image.dtype).max if np.issubdtype(image.dtype, np.integer) else 1.0
        rim = np.concatenate([image[0], image[-1], image[:, 0], image[:, -1]]).reshape(-1, channels)
        if np.mean(np.all(rim >= WHITE_SHARE * top, axis=1)) < WHITE_RIM:
            reasons.append("its background is not white (and it has no alpha channel)")
    return reasons


def load_image(path: str | os.PathLike, view: int | None = None) -> np.ndarray:
    """Load one image file as the network sees it: (224, 224, 3) float32 BGR in [0, 1]. A file unlike
    the renderings the network was trained on (:func:`unlike_a_rendering`) gives a warning naming
    ``view`` (1-based) and the file."""
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"load_image: path must be a str or os.PathLike, not {type(path).__name__}")
    path = Path(path)
    image = decode_file(path)
    warning = rendering_warning(image, f"view {view} ({path})" if view is not None else str(path))
    if warning:
        warnings.warn(warning, stacklevel=2)
    return prepare_image(image, name=f"image file {str(path)!r}")


def rendering_warning(image: np.ndarray, which: str) -> str | None:
    """The warning for a decoded image unlike the renderings the network was trained on
    (:func:`unlike_a_rendering`), naming it as ``which``; None when it looks like one."""
    reasons = unlike_a_rendering(image) if image.ndim in (2, 3) and min(image.shape[:2]) > 0 else []
    if not reasons:
        return None
    return (
        f"{which}: {'; '.join(reasons)}. The network expects renderings like ShapeNet's: "
        f"{IMAGE_SIZE}x{IMAGE_SIZE} (or 137x137) colour pictures of the object alone on white; for "
        "photos give their camera poses instead (--colmap or --poses, xmesh.cameras)"
    )


def _from_network_array(array: np.ndarray) -> np.ndarray:
    """Validate a ready (3, 224, 224, 3) array; uint8 is divided by 255, anything else must be in [0, 1]."""
    name = "load_images: images array"
    if array.shape[0] != NUM_VIEWS:
        raise InputError(f"{name} holds {array.shape[0]} views (shape {array.shape}); {NUM_VIEWS} views are needed")
    if array.shape != NETWORK_SHAPE:
        raise InputError(
            f"{name} has shape {array.shape}; expected {NETWORK_SHAPE} (views, height, width, BGR). "
            f"Pass a list of {NUM_VIEWS} (H, W, 3) arrays to have them resized"
        )
    if array.dtype == np.bool_ or not (
        np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    ):
        raise InputError(f"{name} has dtype {array.dtype}; expected float in [0, 1] or uint8 (divided by 255)")
    if array.dtype == np.uint8:
        return (array / 255.0).astype(np.float32)
    values = array.astype(np.float32)
    if not np.all(np.isfinite(values)):
        raise InputError(f"{name} holds NaN or infinite values; expected finite values in [0, 1]")
    low, high = float(values.min()), float(values.max())
    if low < 0.0 or high > 1.0:
        raise InputError(
            f"{name} values span [{low:g}, {high:g}]; expected BGR values in [0, 1] (or a uint8 array in 0..255)"
        )
    return np.ascontiguousarray(values)


def load_images(images: Any) -> np.ndarray:
    """The network input, (3, 224, 224, 3) float32 BGR in [0, 1], from one of:

    * a sequence of 3 image paths (str / os.PathLike), loaded by :func:`load_image`;
    * a (3, 224, 224, 3) array: float in [0, 1] (used as is), or uint8 (divided by 255);
    * a sequence of 3 arrays (H, W, 3) BGR (also (H, W), (H, W, 4) BGRA), uint8 / uint16 / float in
      [0, 1], resized to 224x224 like files; paths and arrays may be mixed.
    """
    if isinstance(images, (str, bytes, os.PathLike)):
        raise InputError(
            f"load_images: got a single path {images!r}; {NUM_VIEWS} views are needed, "
            f"pass a sequence of {NUM_VIEWS} paths"
        )
    if isinstance(images, np.ndarray) and images.ndim == 4:
        return _from_network_array(images)
    if isinstance(images, np.ndarray) and images.ndim != 4:
        raise InputError(
            f"load_images: images array has shape {images.shape}; "
            f"expected {NETWORK_SHAPE} or a sequence of {NUM_VIEWS} images"
        )
    if not isinstance(images, Sequence):
        raise InputError(
            f"load_images: images of type {type(images).__name__} not understood; expected a sequence of "
            f"{NUM_VIEWS} paths or arrays, or an array of shape {NETWORK_SHAPE}"
        )
    if len(images) != NUM_VIEWS:
        raise InputError(f"load_images: got {len(images)} images; {NUM_VIEWS} views are needed (one per camera)")
    out = np.empty(NETWORK_SHAPE, dtype=np.float32)
    for i, item in enumerate(images):
        if isinstance(item, (str, os.PathLike)):
            out[i] = load_image(item, view=i + 1)
        elif isinstance(item, np.ndarray):
            out[i] = prepare_image(item, name=f"load_images: image {i}")
        else:
            raise InputError(
                f"load_images: image {i} is a {type(item).__name__}; expected a path or an (H, W, 3) array"
            )
    return out


# 8-bit fast path: the loader keeps 8-bit images as uint8 after the original's resize (which is done
# on uint8 data), and the division by 255 happens where the network runs, through this table: entry
# v is float32(v / 255.0), the same value ``prepare_image`` computes, so both paths give equal bits.
UINT8_TO_UNIT = (np.arange(256, dtype=np.float64) / 255.0).astype(np.float32)


def prepare_image_u8(image: np.ndarray, name: str = "image") -> np.ndarray | None:
    """One decoded 8-bit image -> (224, 224, 3) uint8 BGR: the original loader's steps before its
    division by 255 (alpha == 0 pixels set to 255, INTER_LINEAR resize of the uint8 data, first three
    channels). None for any other dtype, which only :func:`prepare_image` handles. Every step is an
    OpenCV call, which releases the GIL."""
    image = np.asarray(image)
    if image.dtype != np.uint8:
        return None
    image = to_bgr_or_bgra(image, name)
    if image.shape[2] == 4:
        # the colour channels alone from here: each channel is set and resized on its own, so dropping
        # alpha first gives the same bits and spares resizing it and a strided copy of the result
        transparent = cv2.compare(cv2.extractChannel(image, 3), 0, cv2.CMP_EQ)  # 255 where alpha == 0, else 0
        image = cv2.max(cv2.cvtColor(image, cv2.COLOR_BGRA2BGR), cv2.merge([transparent] * 3))
    if image.shape[:2] != (IMAGE_SIZE, IMAGE_SIZE):
        image = cv2.resize(image, (IMAGE_SIZE, IMAGE_SIZE), interpolation=cv2.INTER_LINEAR)
    return np.ascontiguousarray(image)


def load_images_u8(paths: Sequence[str | os.PathLike]) -> np.ndarray:
    """The 3 views of image files as (3, 224, 224, 3) uint8 when every file is 8-bit, else the float32
    network input of :func:`load_images`. ``images_to_unit`` turns the uint8 form into the float32 one."""
    if len(paths) != NUM_VIEWS:
        raise InputError(f"load_images_u8: got {len(paths)} images; {NUM_VIEWS} views are needed (one per camera)")
    decoded = []
    for item in paths:
        path = Path(item)
        decoded.append((path, decode_file(path)))
    out = np.empty(NETWORK_SHAPE, dtype=np.uint8)
    for i, (path, image) in enumerate(decoded):
        ready = prepare_image_u8(image, name=f"image file {str(path)!r}")
        if ready is None:
            return np.stack([prepare_image(img, name=f"image file {str(p)!r}") for p, img in decoded])
        out[i] = ready
    return out


def images_to_unit(xp, images):
    """Network input (float32 in [0, 1]) of a uint8 or float32 image array on the array namespace
    ``xp`` (NumPy or CuPy): uint8 goes through :data:`UINT8_TO_UNIT`, float32 is returned as it is."""
    if images.dtype == xp.uint8:
        return xp.asarray(UINT8_TO_UNIT)[images]
    return images
