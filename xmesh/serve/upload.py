"""One ``POST /v1/reconstruct`` request's fields -> the network's inputs, checked before anything is queued.

The fields are those of ``xmesh reconstruct``: ``images`` (three PNG or JPEG files, in view order),
and ``cameras`` (the three five-number rows as JSON) or ``poses`` (the ``--poses`` JSON; the photos
are then prepared as ``xmesh reconstruct --poses`` prepares them, their alpha marking the object).
Images are decoded with the same function as image files (:func:`xmesh.io.images.decode_image_bytes`),
after their size is read from the file's header, so that a small file claiming a huge picture is
refused before any pixel is decoded. Every refusal is an :class:`UploadError` naming the field.
"""

from __future__ import annotations

import asyncio
import json
import math
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xmesh.errors import InputError, XmeshError
from xmesh.io.cameras import load_cameras
from xmesh.io.images import NUM_VIEWS, decode_image_bytes, load_images, prepare_image_u8, rendering_warning

MAX_PIXELS = 64_000_000  # a 48-megapixel phone photo fits; a 30000x30000 "bomb" does not
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_START = b"\xff\xd8"
# JPEG markers whose segment holds the frame size (SOF0-SOF15 but DHT, JPG and DAC)
JPEG_FRAMES = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


class UploadError(InputError):
    """A request the server refuses: ``status`` (an HTTP 4xx), the ``field`` at fault and what was wrong."""

    def __init__(self, field: str, message: str, status: int = 400):
        super().__init__(f"{field}: {message}")
        self.field, self.message, self.status = field, message, status

    def body(self) -> dict:
        return {"error": self.message, "field": self.field, "status": self.status}


@dataclass(repr=False)
class Sample:
    """What a worker needs for one request (picklable): the network's ``images`` (3, 224, 224, 3), uint8
    where the photos are 8-bit (a quarter of the bytes to queue; ``xmesh.io.images.images_to_unit``
    gives the float32 input, bit for bit), else float32; camera ``rows`` (3, 5) float32;
    ``photo_cameras`` (posed photos) puts the mesh in their world; ``stamps`` the ``time.monotonic()``
    of the steps it went through (the answer's Server-Timing header); ``warnings`` what ``xmesh
    reconstruct`` would warn of these images (those unlike a rendering), answered with the mesh."""

    images: np.ndarray
    rows: np.ndarray
    photo_cameras: Any = None
    stamps: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)

    def place(self, mesh):
        return mesh if self.photo_cameras is None else self.photo_cameras.place(mesh)

    def __repr__(self) -> str:
        # short: LitServe formats every request it queues into a debug message, logged or not, and NumPy's
        # summary of the pixels would take a millisecond
        posed = ", posed" if self.photo_cameras is not None else ""
        return f"Sample(images {self.images.dtype}{list(self.images.shape)}{posed})"


def image_size(data: bytes, field: str) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR or a JPEG's frame header, without decoding pixels."""
    if data.startswith(PNG_SIGNATURE):
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise UploadError(field, "a PNG without its IHDR header; expected a whole PNG file")
        return struct.unpack(">II", data[16:24])
    if data.startswith(JPEG_START):
        offset = 2
        while offset + 4 <= len(data):
            if data[offset] != 0xFF:
                break
            marker = data[offset + 1]
            if marker == 0xFF:  # fill byte
                offset += 1
                continue
            if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
                offset += 2
                continue
            (length,) = struct.unpack(">H", data[offset + 2 : offset + 4])
            if marker in JPEG_FRAMES and offset + 9 <= len(data):
                height, width = struct.unpack(">HH", data[offset + 5 : offset + 9])
                return width, height
            offset += 2 + length
        raise UploadError(field, "a JPEG whose frame header (its size) was not found; expected a whole JPEG file")
    raise UploadError(field, f"not a PNG or JPEG file (it starts with {data[:8]!r}); expected PNG or JPEG photos")


def decode_upload(data: bytes, field: str) -> np.ndarray:
    """An uploaded PNG/JPEG -> the array an image file of it decodes to; its size is checked first."""
    if not data:
        raise UploadError(field, "an empty file; expected a PNG or JPEG photo")
    width, height = image_size(data, field)
    if width < 1 or height < 1 or width * height > MAX_PIXELS:
        raise UploadError(
            field,
            f"the header says {width}x{height} pixels; expected at least 1x1 and at most "
            f"{MAX_PIXELS // 1_000_000} megapixels (refused before decoding)",
            status=413,
        )
    try:
        return decode_image_bytes(data, "the file")
    except XmeshError as exc:
        raise UploadError(field, str(exc)) from None


def _finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse_cameras(text: str) -> np.ndarray:
    """The ``cameras`` field: JSON [[azimuth, elevation, 0, distance, 25], x3] -> (3, 5) float32 rows."""
    try:
        rows = json.loads(text)
    except ValueError as exc:
        raise UploadError("cameras", f"not JSON ({exc}); expected three rows of five numbers") from None
    if not (
        isinstance(rows, list) and len(rows) == NUM_VIEWS and all(isinstance(r, list) and len(r) == 5 for r in rows)
    ):
        raise UploadError(
            "cameras",
            f"{text[:120]!r}; expected three rows of five numbers [azimuth, elevation, 0, distance, 25], one per image",
        )
    for i, row in enumerate(rows):
        for j, value in enumerate(row):
            if not _finite_number(value):
                raise UploadError("cameras", f"row {i} column {j} is {value!r}; expected a finite number")
    try:
        return load_cameras(np.asarray(rows, dtype=np.float64))
    except InputError as exc:
        raise UploadError("cameras", str(exc)) from None


_DECODE_THREADS = 8
_pool: ThreadPoolExecutor | None = None


def _decoders() -> ThreadPoolExecutor:
    """The threads that decode a request's images side by side (OpenCV lets go of the GIL while it decodes);
    made on first use, in the server process that uses them."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(_DECODE_THREADS, thread_name_prefix="xmesh-decode")
    return _pool


def _decode_view(index: int, name: str, data: bytes, as_view: bool):
    """(upload ``index`` of field images decoded, the network's uint8 view of it where it is one already,
    else None)."""
    image = decode_upload(data, f"images[{index}] ({name!r})")
    if not as_view:
        return image, None
    try:
        return image, prepare_image_u8(image, f"images[{index}]")
    except InputError as exc:
        raise UploadError("images", str(exc)) from None


def _loaded(decoded: list[np.ndarray], rows: np.ndarray) -> Sample:
    try:
        return Sample(load_images(decoded), rows)
    except InputError as exc:
        raise UploadError("images", str(exc)) from None


async def prepare(files: list[tuple[str, bytes]], cameras: str | None, poses: str | None) -> Sample:
    """The checked network inputs of one request: ``files`` the (file name, bytes) of field ``images``.
    Awaited in the event loop, which hands each image to the decoding threads itself (no hop to another
    thread first); the first image at fault, in view order, names the refusal."""
    if (cameras is None) == (poses is None):
        raise UploadError(
            "cameras",
            "give exactly one of the fields 'cameras' (three camera rows as JSON) "
            "or 'poses' (the poses JSON of xmesh reconstruct --poses)",
        )
    if len(files) != NUM_VIEWS:
        raise UploadError(
            "images", f"{len(files)} file(s); Pixel2Mesh++ needs exactly {NUM_VIEWS} photos, in view order"
        )
    rows = parse_cameras(cameras) if cameras is not None else None
    loop, pool = asyncio.get_running_loop(), _decoders()
    outcomes = await asyncio.gather(
        *(
            loop.run_in_executor(pool, _decode_view, i, name, data, rows is not None)
            for i, (name, data) in enumerate(files)
        ),
        return_exceptions=True,
    )
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    decoded = [image for image, _ in outcomes]
    if rows is None:
        return await loop.run_in_executor(pool, _posed, files, decoded, poses)
    # camera rows take renderings: the warnings of xmesh reconstruct --cameras for images unlike them
    said = [
        rendering_warning(image, f"view {i + 1} ({name!r})") for i, ((name, _), image) in enumerate(zip(files, decoded))
    ]
    views = [view for _, view in outcomes]
    if all(view is not None for view in views):
        sample = Sample(np.stack(views), rows)
    else:
        sample = await loop.run_in_executor(pool, _loaded, decoded, rows)
    sample.warnings = [warning for warning in said if warning]
    return sample


def _posed(files, decoded, poses: str) -> Sample:
    from xmesh.cameras import from_poses

    try:
        content = json.loads(poses)
    except ValueError as exc:
        raise UploadError("poses", f"not JSON ({exc}); expected the poses JSON of xmesh reconstruct --poses") from None
    if not isinstance(content, (dict, list)):
        raise UploadError("poses", "expected a JSON object with a 'views' list (or the list of views)")
    names = [name or f"image{i}" for i, (name, _) in enumerate(files)]
    try:
        cameras = from_poses(content, names)
    except InputError as exc:
        raise UploadError("poses", str(exc)) from None
    try:
        return Sample(cameras.prepare_images(decoded), cameras.rows, cameras)
    except InputError as exc:
        raise UploadError("images", str(exc)) from None
