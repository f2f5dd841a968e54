"""The client of ``xmesh serve`` (standard library only): the request ``xmesh reconstruct --server URL``
sends, from Python as well.

    mesh = xmesh.serve.client.reconstruct_remote("http://127.0.0.1:8000", ["a.png", "b.png", "c.png"],
                                                 cameras="cameras.txt")
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xmesh.errors import InputError, XmeshError
from xmesh.io.cameras import load_cameras
from xmesh.io.gltf import read_glb
from xmesh.mesh import Mesh

WARNINGS_HEADER = "X-Xmesh-Warnings"  # a JSON list (ASCII) of what xmesh reconstruct would warn of the inputs


class ServerError(XmeshError):
    """The server refused the request or could not be reached; ``status`` is its HTTP status (0: none)."""

    def __init__(self, message: str, status: int = 0, field: str | None = None):
        super().__init__(message)
        self.status, self.field = status, field


def multipart_body(images: Sequence[tuple[str, bytes]], fields: dict[str, str]) -> tuple[bytes, str]:
    """(body, content type) of a multipart/form-data request: ``images`` as files of field "images"."""
    boundary = f"xmesh-{uuid.uuid4().hex}"
    parts = []
    for name, data in images:
        safe = name.replace('"', "_").replace("\r", "_").replace("\n", "_")
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="images"; filename="{safe}"\r\n'
            f"Content-Type: application/octet-stream\r\n\r\n".encode()
            + data
            + b"\r\n"
        )
    for key, value in fields.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n{value}\r\n'.encode())
    parts.append(f"--{boundary}--\r\n".encode("ascii"))
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def _image(item: Any, index: int) -> tuple[str, bytes]:
    if isinstance(item, (str, os.PathLike)):
        path = Path(item)
        try:
            return path.name, path.read_bytes()
        except OSError as exc:
            raise InputError(f"image {index} {str(path)!r}: cannot be read ({exc.strerror})") from None
    if isinstance(item, (bytes, bytearray)):
        return f"image{index}.png", bytes(item)
    raise InputError(f"image {index}: a {type(item).__name__}; expected a path or the bytes of a PNG/JPEG file")


def request_fields(cameras: Any = None, poses: Any = None, views: Sequence[int] | None = None) -> dict[str, str]:
    """The "cameras" field (rows from an array or camera file, as ``xmesh reconstruct --cameras`` reads
    them) or the "poses" field (a poses.json path or its content)."""
    if (cameras is None) == (poses is None):
        raise InputError("give exactly one of cameras= (camera rows or a camera file) and poses= (a poses.json)")
    if cameras is not None:
        rows = load_cameras(cameras, views=views)
        return {"cameras": json.dumps([[float(v) for v in row] for row in rows])}
    if isinstance(poses, (str, os.PathLike)):
        try:
            return {"poses": Path(poses).read_text(encoding="utf-8")}
        except OSError as exc:
            raise InputError(f"poses {str(poses)!r}: cannot be read ({exc.strerror})") from None
    return {"poses": json.dumps(poses)}


def check_url(url: str) -> str:
    """``url`` without a trailing slash; InputError when it lacks its http:// or https:// (or its host)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        bare = url.split("://", 1)[-1]
        raise InputError(
            f"server URL {url!r}: expected http://HOST:PORT or https://HOST:PORT, "
            f"e.g. http://{bare or '127.0.0.1:8000'}"
        )
    return url.rstrip("/")


def post(
    url: str, images: Sequence[Any], fields: dict[str, str], fmt: str = "glb", timeout: float = 300.0
) -> tuple[bytes, Any]:
    """POST the request to ``{url}/v1/reconstruct?format=fmt``: (body, headers) of a success (the headers
    looked up case-insensitively); else ServerError."""
    target = check_url(url) + "/v1/reconstruct?" + urllib.parse.urlencode({"format": fmt})
    files = [_image(item, i) for i, item in enumerate(images)]
    body, content_type = multipart_body(files, fields)
    request = urllib.request.Request(target, data=body, method="POST", headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read(), response.headers
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read())
        except ValueError:
            detail = {}
        field = detail.get("field")
        raise ServerError(
            f"server {url}: {exc.code}: {(field + ': ') if field else ''}{detail.get('error', exc.reason)}",
            exc.code,
            field,
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ServerError(f"server {url}: cannot be reached ({reason}); expected a running xmesh serve") from None


def remote_mesh(url: str, images: Sequence[Any], fields: dict[str, str], timeout: float = 300.0) -> tuple[Mesh, Any]:
    """(the mesh, the answer's headers) of the request with ``fields`` (:func:`request_fields`); the
    server's warnings about the inputs (its X-Xmesh-Warnings header) are Python warnings here, as
    the same images given to ``xmesh.reconstruct`` give."""
    body, headers = post(url, images, fields, "glb", timeout)
    for text in json.loads(headers.get(WARNINGS_HEADER) or "[]"):
        warnings.warn(text, stacklevel=2)
    vertices, faces = read_glb(body, f"the answer of {url}")
    return Mesh(np.array(vertices), faces), headers


def reconstruct_remote(
    url: str,
    images: Sequence[Any],
    cameras: Any = None,
    poses: Any = None,
    views: Sequence[int] | None = None,
    timeout: float = 300.0,
) -> Mesh:
    """The mesh ``xmesh serve`` at ``url`` reconstructs from 3 images (paths or file bytes) and their
    ``cameras`` (rows or a camera file) or ``poses`` (a poses.json path or content): on the NumPy
    backend, exactly the mesh a local ``xmesh.reconstruct`` gives for the same inputs and weights."""
    return remote_mesh(url, images, request_fields(cameras, poses, views), timeout)[0]
