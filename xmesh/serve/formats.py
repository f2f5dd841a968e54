"""What ``POST /v1/reconstruct`` answers: the mesh as OBJ (default), binary PLY or binary glTF, chosen by
``?format=`` or the Accept header; or, for the page, a JSON "preview" with a picture and all three files."""

from __future__ import annotations

import base64
import json

import cv2
import numpy as np

from xmesh.io.images import images_to_unit
from xmesh.mesh import Mesh
from xmesh.pictures.panels import caption, framed_border, hstack, vstack
from xmesh.pictures.views import PANEL_SIZE, image_panel, mesh_panel
from xmesh.serve.upload import Sample, UploadError

MEDIA_TYPES = {
    "obj": "model/obj",
    "ply": "application/x-ply",
    "glb": "model/gltf-binary",
    "preview": "application/json",
}
ACCEPTED = {
    "model/obj": "obj",
    "text/plain": "obj",
    "application/x-ply": "ply",
    "application/ply": "ply",
    "model/ply": "ply",
    "model/gltf-binary": "glb",
    "application/json": "preview",
}
MESH_FORMATS = ("obj", "ply", "glb")
QUICK_FORMATS = ("ply", "glb")  # binary: a mesh's arrays copied out, well under a millisecond (OBJ text: tens)
MESH_COLOR = (0.55, 0.68, 0.85)


def choose_format(query: str | None, accept: str | None) -> str:
    """``format`` from the query, else the first media type of Accept that names one, else OBJ."""
    if query is not None:
        if query.lower() not in MEDIA_TYPES:
            raise UploadError("format", f"{query!r}; expected one of {', '.join(MEDIA_TYPES)}")
        return query.lower()
    for item in (accept or "").split(","):
        media = item.split(";", 1)[0].strip().lower()
        if media in ACCEPTED:
            return ACCEPTED[media]
    return "obj"


def _network_view(image: np.ndarray) -> np.ndarray:
    """A network input view (224, 224, 3) BGR, uint8 or float in [0, 1] -> RGB uint8."""
    unit = images_to_unit(np, image)
    return np.ascontiguousarray((np.clip(unit, 0.0, 1.0)[:, :, ::-1] * 255.0).round().astype(np.uint8))


def picture(sample: Sample, network_mesh: Mesh, weights_line: str) -> bytes:
    """PNG: the three views as the network saw them, then the coarse and refined meshes framed from
    camera 1's direction (in the network's frame), with a caption naming the weights."""
    rows = np.asarray(sample.rows, dtype=np.float64)
    panels = [
        image_panel(_network_view(view), PANEL_SIZE, title=f"view {i + 1}") for i, view in enumerate(sample.images)
    ]
    for title, vertices in (
        ("coarse (stage 1)", network_mesh.coarse_vertices),
        ("refined (stage 2)", network_mesh.vertices),
    ):
        panels.append(
            mesh_panel(
                vertices, network_mesh.faces, rows[0], PANEL_SIZE, camera0_row=rows[0], title=title, color=MESH_COLOR
            )[0]
        )
    row = hstack([framed_border(p) for p in panels])
    lines = [
        "xmesh serve: the 3 views as the network saw them -> the coarse and refined meshes, framed to fit",
        weights_line,
    ]
    image = vstack([row, caption(row.shape[1], lines)])
    return cv2.imencode(".png", cv2.cvtColor(image, cv2.COLOR_RGB2BGR))[1].tobytes()


def answer(fmt: str, sample: Sample, network_mesh: Mesh, weights_line: str) -> bytes:
    """The body of the answer in ``fmt``; meshes are in the photos' world for posed photos."""
    mesh = sample.place(network_mesh)
    if fmt in MESH_FORMATS:
        return mesh.encode(fmt)
    files = {name: base64.b64encode(mesh.encode(name)).decode("ascii") for name in MESH_FORMATS}
    return json.dumps(
        {
            "picture": base64.b64encode(picture(sample, network_mesh, weights_line)).decode("ascii"),
            "files": files,
            "vertices": len(mesh.vertices),
            "faces": len(mesh.faces),
            "warnings": sample.warnings,
        }
    ).encode("utf-8")
