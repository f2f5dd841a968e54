"""Binary glTF 2.0 (``.glb``), what web viewers load: one triangle mesh, written and read back.

Layout (glTF 2.0 specification, "GLB File Format Specification"): a 12-byte header (magic ``glTF``,
version 2, total length), then a JSON chunk padded with spaces and a BIN chunk padded with zeros,
each chunk's length a multiple of 4. The mesh is one primitive: POSITION (float32 VEC3, with the
min/max the specification requires) and triangle indices (uint32), little-endian. Coordinates are
written as they are (no change of axes).
"""

from __future__ import annotations

import json
import struct

import numpy as np

from xmesh.errors import FileFormatError

MAGIC = 0x46546C67  # b"glTF" read as a little-endian uint32
VERSION = 2
CHUNK_JSON = 0x4E4F534A  # b"JSON"
CHUNK_BIN = 0x004E4942  # b"BIN\0"
FLOAT = 5126  # accessor componentType: float32
UNSIGNED_INT = 5125  # accessor componentType: uint32
ARRAY_BUFFER, ELEMENT_ARRAY_BUFFER = 34962, 34963
TRIANGLES = 4


def _padded(data: bytes, fill: bytes) -> bytes:
    return data + fill * (-len(data) % 4)


def glb_bytes(vertices: np.ndarray, faces: np.ndarray, generator: str = "xmesh") -> bytes:
    """The ``.glb`` file of a triangle mesh: vertices (V, 3) float32, faces (F, 3) 0-based indices."""
    positions = np.ascontiguousarray(vertices, dtype="<f4").reshape(-1, 3)
    indices = np.ascontiguousarray(faces, dtype="<u4").reshape(-1, 3)
    binary = positions.tobytes() + indices.tobytes()
    position_accessor = {"bufferView": 0, "componentType": FLOAT, "count": len(positions), "type": "VEC3"}
    if len(positions):
        columns = np.ascontiguousarray(
            positions.T
        )  # x, y, z each contiguous: far quicker to reduce than (V, 3)'s axis 0
        position_accessor["min"] = columns.min(axis=1).tolist()
        position_accessor["max"] = columns.max(axis=1).tolist()
    document = {
        "asset": {"version": "2.0", "generator": generator},
        "scene": 0,
        "scenes": [{"nodes": [0]}],
        "nodes": [{"mesh": 0}],
        "meshes": [{"primitives": [{"attributes": {"POSITION": 0}, "indices": 1, "mode": TRIANGLES}]}],
        "buffers": [{"byteLength": len(binary)}],
        "bufferViews": [
            {"buffer": 0, "byteOffset": 0, "byteLength": positions.nbytes, "target": ARRAY_BUFFER},
            {"buffer": 0, "byteOffset": positions.nbytes, "byteLength": indices.nbytes, "target": ELEMENT_ARRAY_BUFFER},
        ],
        "accessors": [
            position_accessor,
            {"bufferView": 1, "componentType": UNSIGNED_INT, "count": indices.size, "type": "SCALAR"},
        ],
    }
    json_chunk = _padded(json.dumps(document, separators=(",", ":")).encode("utf-8"), b" ")
    bin_chunk = _padded(binary, b"\0")
    total = 12 + 8 + len(json_chunk) + 8 + len(bin_chunk)
    return b"".join(
        [
            struct.pack("<III", MAGIC, VERSION, total),
            struct.pack("<II", len(json_chunk), CHUNK_JSON),
            json_chunk,
            struct.pack("<II", len(bin_chunk), CHUNK_BIN),
            bin_chunk,
        ]
    )


def _chunk(data: bytes, offset: int, kind: int, what: str, where: str) -> tuple[bytes, int]:
    if offset + 8 > len(data):
        raise FileFormatError(f"{where}: the {what} chunk's header is missing (file ends at byte {len(data)})")
    length, found = struct.unpack_from("<II", data, offset)
    if found != kind:
        raise FileFormatError(f"{where}: chunk type 0x{found:08x} where the {what} chunk (0x{kind:08x}) belongs")
    if length % 4 or offset + 8 + length > len(data):
        raise FileFormatError(
            f"{where}: the {what} chunk's length {length} is not a multiple of 4 or runs past the file"
        )
    return data[offset + 8 : offset + 8 + length], offset + 8 + length


def _accessor_array(document: dict, binary: bytes, index: int, component: int, kind: str, where: str) -> np.ndarray:
    try:
        accessor = document["accessors"][index]
        view = document["bufferViews"][accessor["bufferView"]]
        count, start, length = int(accessor["count"]), int(view.get("byteOffset", 0)), int(view["byteLength"])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise FileFormatError(f"{where}: accessor {index} or its bufferView is incomplete ({exc!r})") from None
    if accessor.get("componentType") != component or accessor.get("type") != kind:
        raise FileFormatError(
            f"{where}: accessor {index} is {accessor.get('componentType')}/{accessor.get('type')}; "
            f"expected {component}/{kind}"
        )
    width = 3 if kind == "VEC3" else 1
    needed = count * width * 4 + int(accessor.get("byteOffset", 0))
    if view.get("buffer") != 0 or start % 4 or needed > length or start + length > len(binary):
        raise FileFormatError(f"{where}: accessor {index}'s bufferView lies outside the BIN chunk or is misaligned")
    begin = start + int(accessor.get("byteOffset", 0))
    dtype = "<f4" if component == FLOAT else "<u4"
    return np.frombuffer(binary, dtype=dtype, count=count * width, offset=begin).reshape(count, width)


def read_glb(data: bytes, where: str = "GLB") -> tuple[np.ndarray, np.ndarray]:
    """(vertices (V, 3) float32, faces (F, 3) int64) of a ``.glb`` holding one indexed triangle primitive,
    checked against the layout of the specification; anything else is a FileFormatError."""
    if len(data) < 12:
        raise FileFormatError(f"{where}: {len(data)} bytes; a GLB file starts with a 12-byte header")
    magic, version, total = struct.unpack_from("<III", data, 0)
    if magic != MAGIC or version != VERSION or total != len(data):
        raise FileFormatError(
            f"{where}: header magic 0x{magic:08x}, version {version}, length {total} for "
            f"{len(data)} bytes; expected glTF version 2 and the file's length"
        )
    json_chunk, offset = _chunk(data, 12, CHUNK_JSON, "JSON", where)
    binary, offset = _chunk(data, offset, CHUNK_BIN, "BIN", where)
    if offset != len(data):
        raise FileFormatError(f"{where}: {len(data) - offset} bytes after the BIN chunk")
    try:
        document = json.loads(json_chunk.decode("utf-8"))
        primitive = document["meshes"][0]["primitives"][0]
        positions, indices = primitive["attributes"]["POSITION"], primitive["indices"]
    except (UnicodeDecodeError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise FileFormatError(
            f"{where}: the JSON chunk holds no mesh primitive with POSITION and indices ({exc!r})"
        ) from None
    if document.get("asset", {}).get("version") != "2.0" or primitive.get("mode", TRIANGLES) != TRIANGLES:
        raise FileFormatError(f"{where}: expected asset version 2.0 and a triangle primitive (mode 4)")
    if document["buffers"][0].get("byteLength", -1) > len(binary):
        raise FileFormatError(f"{where}: buffer 0 is longer than the BIN chunk")
    vertices = _accessor_array(document, binary, positions, FLOAT, "VEC3", where)
    flat = _accessor_array(document, binary, indices, UNSIGNED_INT, "SCALAR", where).reshape(-1)
    if flat.size % 3 or (flat.size and int(flat.max()) >= len(vertices)):
        raise FileFormatError(
            f"{where}: {flat.size} indices, largest {int(flat.max(initial=0))}, for "
            f"{len(vertices)} vertices; expected whole triangles of existing vertices"
        )
    accessor = document["accessors"][positions]
    if len(vertices) and (
        accessor.get("min") != [float(v) for v in vertices.min(axis=0)]
        or accessor.get("max") != [float(v) for v in vertices.max(axis=0)]
    ):
        raise FileFormatError(f"{where}: POSITION's min/max are not the positions' bounds")
    return vertices.astype(np.float32), flat.reshape(-1, 3).astype(np.int64)
