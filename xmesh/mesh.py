"""The output mesh: ``Mesh`` (vertices, faces, coarse_vertices), its OBJ / XYZ / PLY / GLB writers, OBJ / PLY readers.

In memory: vertices (V, 3) float32, faces (F, 3) int64, 0-based. OBJ files are 1-based. Writers go
through ``atomic_write`` (the old file survives a failed write) and print coordinates with '%.9g',
enough digits for every float32 to read back bit for bit. Readers: OBJ (v / f lines; normals,
texture coordinates, groups and materials ignored; 'f a/b/c' syntax, negative indices, polygons
fanned into triangles) and PLY (ascii, binary_little_endian and binary_big_endian; vertex x/y/z
and a face list ``vertex_indices`` or ``vertex_index``).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from xmesh.errors import FileFormatError, InputError, MissingFileError
from xmesh.io.atomic import atomic_output
from xmesh.io.gltf import glb_bytes

FLOAT_FORMAT = "%.9g"  # 9 significant digits round-trip any float32


def _as_array(values, what: str) -> np.ndarray:
    try:
        return np.asarray(values)
    except (ValueError, TypeError) as exc:
        raise InputError(f"Mesh: {what} cannot be read as an array ({exc})") from None


def _as_vertices(values, name: str) -> np.ndarray:
    array = _as_array(values, f"{name} (expected shape (V, 3))")
    if array.dtype == np.bool_ or not (
        np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)
    ):
        raise InputError(f"Mesh: {name} has dtype {array.dtype}; expected real numbers, shape (V, 3)")
    if array.ndim != 2 or array.shape[1] != 3:
        raise InputError(f"Mesh: {name} has shape {array.shape}; expected (V, 3)")
    with np.errstate(over="ignore", invalid="ignore"):
        array = np.ascontiguousarray(array, dtype=np.float32)
    if not np.all(np.isfinite(array)):
        row = int(np.argmax(~np.all(np.isfinite(array), axis=1)))
        raise InputError(f"Mesh: {name} row {row} is {array[row].tolist()}; expected finite coordinates")
    return array


def _as_faces(values, num_vertices: int) -> np.ndarray:
    array = _as_array(values, "faces (expected shape (F, 3))")
    if array.size == 0 and array.ndim in (1, 2):
        array = array.reshape(0, 3).astype(np.int64)  # [] and the like: no faces
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise InputError(f"Mesh: faces have dtype {array.dtype}; expected integer vertex indices, shape (F, 3)")
    if array.ndim != 2 or array.shape[1] != 3:
        raise InputError(f"Mesh: faces have shape {array.shape}; expected (F, 3) triangles")
    array = np.ascontiguousarray(array, dtype=np.int64)
    if array.size and (array.min() < 0 or array.max() >= num_vertices):
        bad = (array < 0) | (array >= num_vertices)
        row = int(np.argmax(bad.any(axis=1)))
        raise InputError(
            f"Mesh: face {row} is {array[row].tolist()}; expected 0-based vertex indices in [0, {num_vertices - 1}]"
        )
    return array


@dataclass
class Mesh:
    """A triangle mesh: vertices (V, 3) float32, faces (F, 3) int64 0-based, optional coarse_vertices (V, 3).

    ``coarse_vertices`` is the stage-1 (MVP2M) mesh on the same faces, when the network produced it.
    Arrays are converted to those dtypes and validated on construction.
    """

    vertices: np.ndarray
    faces: np.ndarray
    coarse_vertices: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.vertices = _as_vertices(self.vertices, "vertices")
        self.faces = _as_faces(self.faces, len(self.vertices))
        if self.coarse_vertices is not None:
            self.coarse_vertices = _as_vertices(self.coarse_vertices, "coarse_vertices")
            if self.coarse_vertices.shape != self.vertices.shape:
                raise InputError(
                    f"Mesh: coarse_vertices have shape {self.coarse_vertices.shape}; expected {self.vertices.shape} "
                    "like vertices (same faces)"
                )

    def coarse(self) -> Mesh:
        """The coarse (stage-1) mesh on the same faces; InputError when there is none."""
        if self.coarse_vertices is None:
            raise InputError("Mesh.coarse: this mesh has no coarse_vertices")
        return Mesh(self.coarse_vertices, self.faces)

    def to_obj(self, path: str | os.PathLike) -> Path:
        """Write a Wavefront OBJ: 'v x y z' ('%.9g') then 'f a b c' (1-based)."""
        with atomic_output(path, "w", "OBJ") as handle:
            self._write_obj(handle)
        return Path(path)

    def _write_obj(self, handle: IO[str]) -> None:
        handle.write(f"# xmesh: {len(self.vertices)} vertices, {len(self.faces)} faces\n")
        _write_rows(handle, "v " + " ".join([FLOAT_FORMAT] * 3), self.vertices)
        _write_rows(handle, "f %d %d %d", self.faces + 1)

    def to_xyz(self, path: str | os.PathLike) -> Path:
        """Write the vertices as a point cloud, one 'x y z' ('%.9g') per line."""
        with atomic_output(path, "w", "XYZ") as handle:
            _write_rows(handle, " ".join([FLOAT_FORMAT] * 3), self.vertices)
        return Path(path)

    def to_ply(self, path: str | os.PathLike, binary: bool = False) -> Path:
        """Write a PLY: ASCII by default, binary_little_endian with ``binary=True``."""
        with atomic_output(path, "wb" if binary else "w", "PLY") as handle:
            self._write_ply(handle, binary)
        return Path(path)

    def to_glb(self, path: str | os.PathLike) -> Path:
        """Write a binary glTF 2.0 file (``.glb``, :mod:`xmesh.io.gltf`)."""
        with atomic_output(path, "wb", "GLB") as handle:
            handle.write(glb_bytes(self.vertices, self.faces))
        return Path(path)

    def encode(self, fmt: str) -> bytes:
        """The bytes of the file the writer of ``fmt`` writes: "obj", "ply" (binary little-endian),
        "ply-ascii" or "glb"."""
        if fmt == "obj":
            text = io.StringIO()
            self._write_obj(text)
            return text.getvalue().encode("ascii")
        if fmt == "ply-ascii":
            text = io.StringIO()
            self._write_ply(text, binary=False)
            return text.getvalue().encode("ascii")
        if fmt == "ply":
            data = io.BytesIO()
            self._write_ply(data, binary=True)
            return data.getvalue()
        if fmt == "glb":
            return glb_bytes(self.vertices, self.faces)
        raise InputError(f"Mesh.encode: format {fmt!r}; expected one of obj, ply, ply-ascii, glb")

    def _write_ply(self, handle, binary: bool) -> None:
        if len(self.vertices) > np.iinfo(np.int32).max:
            raise InputError(f"Mesh.to_ply: {len(self.vertices)} vertices exceed PLY int32 face indices")
        header = (
            "ply\n"
            f"format {'binary_little_endian' if binary else 'ascii'} 1.0\n"
            "comment written by xmesh\n"
            f"element vertex {len(self.vertices)}\n"
            "property float x\nproperty float y\nproperty float z\n"
            f"element face {len(self.faces)}\n"
            "property list uchar int vertex_indices\n"
            "end_header\n"
        )
        if binary:
            face_records = np.empty(len(self.faces), dtype=[("n", "u1"), ("idx", "<i4", (3,))])
            face_records["n"] = 3
            face_records["idx"] = self.faces
            handle.write(header.encode("ascii"))
            _write_binary(handle, self.vertices.astype("<f4"))
            _write_binary(handle, face_records)
        else:
            handle.write(header)
            _write_rows(handle, " ".join([FLOAT_FORMAT] * 3), self.vertices)
            _write_rows(handle, "3 %d %d %d", self.faces)


def _write_rows(handle: IO[str], fmt: str, rows: np.ndarray) -> None:
    """Write one formatted line per row ('%.9g' on float32 values converted exactly to Python floats)."""
    if len(rows):
        np.savetxt(handle, rows, fmt=fmt, delimiter=" ", newline="\n")


def _write_binary(handle: IO[bytes], records: np.ndarray) -> None:
    """Write an array's raw bytes (C order, as its dtype says)."""
    handle.write(np.ascontiguousarray(records).tobytes())


# ----------------------------------------------------------------------------------------- readers


def _read_text(path: Path, what: str) -> list[str]:
    if not path.exists():
        raise MissingFileError(f"{what} file {str(path)!r} does not exist")
    if path.is_dir():
        raise InputError(f"{what} path {str(path)!r} is a directory; expected a file")
    try:
        return path.read_bytes().decode("utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        raise FileFormatError(
            f"{what} file {str(path)!r} is not UTF-8 text (byte {exc.start}); expected an ASCII {what} file"
        ) from exc


def _obj_index(token: str, count: int, where: str) -> int:
    """An OBJ vertex reference -> 0-based index. Negative references are relative to the ``count``
    vertices defined so far; positive ones are 1-based and checked once the whole file is read."""
    head = token.split("/", 1)[0]
    try:
        value = int(head)
    except ValueError:
        raise FileFormatError(f"{where}: face vertex {token!r} is not an integer index") from None
    if value == 0 or count + value < 0 or value > np.iinfo(np.int32).max:
        raise FileFormatError(
            f"{where}: face vertex {token!r} is out of range; expected 1-based indices, or negative ones "
            f"down to -{count} ({count} vertices defined so far)"
        )
    return value - 1 if value > 0 else count + value


def _fan(polygon: list[int]) -> Iterable[tuple[int, int, int]]:
    """Triangulate a polygon (a0, a1, ..., an) as the fan (a0, ai, ai+1)."""
    for i in range(1, len(polygon) - 1):
        yield polygon[0], polygon[i], polygon[i + 1]


def _parse_obj(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vertices (V, 3) float64, triangles (F, 3) int64 and each triangle's line number; indices not range-checked
    against V (a faces-only file such as the official face3.obj references vertices it lacks)."""
    vertices: list[tuple[float, float, float]] = []
    faces: list[tuple[int, int, int]] = []
    face_lines: list[int] = []
    for lineno, line in enumerate(_read_text(path, "OBJ"), start=1):
        tokens = line.split("#", 1)[0].split()
        if not tokens:
            continue
        where = f"OBJ file {str(path)!r}, line {lineno}"
        if tokens[0] == "v":
            try:
                xyz = (float(tokens[1]), float(tokens[2]), float(tokens[3]))
            except (ValueError, IndexError):
                raise FileFormatError(f"{where}: vertex line {line.strip()!r} does not start with 3 numbers") from None
            if not all(np.isfinite(xyz)):
                raise FileFormatError(f"{where}: vertex {line.strip()!r} is not finite; expected finite coordinates")
            vertices.append(xyz)
        elif tokens[0] == "f":
            if len(tokens) < 4:
                raise FileFormatError(
                    f"{where}: face {line.strip()!r} has {len(tokens) - 1} vertices; expected at least 3"
                )
            polygon = [_obj_index(t, len(vertices), where) for t in tokens[1:]]
            triangles = list(_fan(polygon))
            faces.extend(triangles)
            face_lines.extend([lineno] * len(triangles))
    verts = np.asarray(vertices, dtype=np.float64).reshape(-1, 3)
    tris = np.asarray(faces, dtype=np.int64).reshape(-1, 3)
    tris_lines = np.asarray(face_lines, dtype=np.int64)
    return verts, tris, tris_lines


def read_obj(path: str | os.PathLike) -> Mesh:
    """Read an OBJ: 'v' and 'f' lines (any other statement ignored); polygons become triangle fans."""
    path = Path(path)
    verts, faces, lines = _parse_obj(path)
    if len(faces) and faces.max() >= len(verts):
        row = int(np.argmax((faces >= len(verts)).any(axis=1)))
        raise FileFormatError(
            f"OBJ file {str(path)!r}, line {int(lines[row])}: face references vertex {int(faces[row].max()) + 1}; "
            f"the file defines {len(verts)} vertices"
            + (" (a faces-only file: read it with read_obj_faces)" if len(verts) == 0 else "")
        )
    return _mesh_from_lists(verts, faces, f"OBJ file {str(path)!r}")


def read_obj_faces(path: str | os.PathLike) -> np.ndarray:
    """The triangles (F, 3) int64, 0-based, of an OBJ file's 'f' lines, ignoring its vertices
    (for faces-only files such as the official face3.obj). Negative indices need 'v' lines before."""
    _, faces, _ = _parse_obj(Path(path))
    return faces


def _mesh_from_lists(vertices, faces, where: str) -> Mesh:
    with np.errstate(over="ignore"):
        verts = np.asarray(vertices, dtype=np.float64).reshape(-1, 3).astype(np.float32)
    if not np.all(np.isfinite(verts)):
        row = int(np.argmax(~np.all(np.isfinite(verts), axis=1)))
        raise FileFormatError(f"{where}: vertex {row} has a coordinate beyond the float32 range (about 3.4e38)")
    return Mesh(verts, np.asarray(faces, dtype=np.int64).reshape(-1, 3))


def read_xyz(path: str | os.PathLike) -> np.ndarray:
    """Read a point cloud of 'x y z' lines (extra columns ignored) -> (N, 3) float32."""
    path = Path(path)
    points = []
    for lineno, line in enumerate(_read_text(path, "XYZ"), start=1):
        tokens = line.split("#", 1)[0].replace(",", " ").split()
        if not tokens:
            continue
        try:
            xyz = [float(t) for t in tokens[:3]]
        except ValueError:
            xyz = []
        if len(xyz) != 3 or not all(np.isfinite(xyz)):
            raise FileFormatError(
                f"XYZ file {str(path)!r}, line {lineno}: {line.strip()!r}; expected 3 finite numbers 'x y z'"
            )
        points.append(xyz)
    return np.asarray(points, dtype=np.float64).reshape(-1, 3).astype(np.float32)


# PLY -------------------------------------------------------------------------------------------

_PLY_TYPES = {
    "char": "i1",
    "int8": "i1",
    "uchar": "u1",
    "uint8": "u1",
    "short": "i2",
    "int16": "i2",
    "ushort": "u2",
    "uint16": "u2",
    "int": "i4",
    "int32": "i4",
    "uint": "u4",
    "uint32": "u4",
    "float": "f4",
    "float32": "f4",
    "double": "f8",
    "float64": "f8",
}
_PLY_FORMATS = {"ascii": None, "binary_little_endian": "<", "binary_big_endian": ">"}
_FACE_LISTS = ("vertex_indices", "vertex_index")


@dataclass
class _PlyElement:
    name: str
    count: int
    properties: list  # (name, type) for scalars; (name, count_type, item_type) for lists


def _parse_ply_header(data: bytes, where: str) -> tuple[str, list[_PlyElement], int]:
    """(format, elements, byte offset of the body) from the start of a PLY file."""
    end = data.find(b"end_header")
    if not data.startswith(b"ply") or end < 0:
        raise FileFormatError(f"{where}: not a PLY file (it must start with 'ply' and hold 'end_header')")
    newline = data.find(b"\n", end)
    body = len(data) if newline < 0 else newline + 1
    try:
        lines = data[:end].decode("ascii").splitlines()
    except UnicodeDecodeError:
        raise FileFormatError(f"{where}: the PLY header is not ASCII text") from None
    fmt = None
    elements: list[_PlyElement] = []
    for lineno, line in enumerate(lines, start=1):
        tokens = line.split()
        at = f"{where}, line {lineno}"
        if not tokens or tokens[0] in ("ply", "comment", "obj_info"):
            continue
        try:
            if tokens[0] == "format":
                if tokens[1] not in _PLY_FORMATS:
                    raise FileFormatError(f"{at}: format {tokens[1]!r}; expected one of {sorted(_PLY_FORMATS)}")
                fmt = tokens[1]
            elif tokens[0] == "element":
                elements.append(_PlyElement(tokens[1], int(tokens[2]), []))
                if elements[-1].count < 0:
                    raise ValueError
            elif tokens[0] == "property":
                if not elements:
                    raise FileFormatError(f"{at}: property before any element")
                if tokens[1] == "list":
                    elements[-1].properties.append((tokens[4], _PLY_TYPES[tokens[2]], _PLY_TYPES[tokens[3]]))
                else:
                    elements[-1].properties.append((tokens[2], _PLY_TYPES[tokens[1]]))
            else:
                raise FileFormatError(f"{at}: unknown header statement {tokens[0]!r}")
        except FileFormatError:
            raise
        except (IndexError, KeyError, ValueError):
            raise FileFormatError(f"{at}: malformed header line {line!r}") from None
    if fmt is None:
        raise FileFormatError(f"{where}: the PLY header has no 'format' line")
    return fmt, elements, body


def _ply_ascii_body(lines: list[str], elements: list[_PlyElement], first_line: int, where: str) -> dict:
    """Element name -> list of per-record property dicts, from the ASCII body lines."""
    out: dict = {}
    position = 0
    for element in elements:
        records = []
        for _ in range(element.count):
            while position < len(lines) and not lines[position].strip():
                position += 1
            if position >= len(lines):
                raise FileFormatError(f"{where}: file ends before all {element.count} '{element.name}' records")
            lineno = first_line + position
            tokens = lines[position].split()
            position += 1
            record, k = {}, 0
            try:
                for prop in element.properties:
                    if len(prop) == 2:
                        record[prop[0]] = float(tokens[k])
                        k += 1
                    else:
                        n = int(tokens[k])
                        record[prop[0]] = [int(t) for t in tokens[k + 1 : k + 1 + n]]
                        if len(record[prop[0]]) != n:
                            raise IndexError
                        k += 1 + n
                if k != len(tokens):
                    raise IndexError
            except (IndexError, ValueError):
                raise FileFormatError(
                    f"{where}, line {lineno}: {lines[lineno - first_line].strip()!r} does not match the "
                    f"'{element.name}' properties {[p[0] for p in element.properties]}"
                ) from None
            records.append(record)
        out[element.name] = records
    return out


def _ply_uniform_lists(data: bytes, offset: int, order: str, element: _PlyElement):
    """Fast path for an element of one list property whose records all have the same length
    (the usual triangle list): (list of {name: indices}, new offset), or None to parse record by record."""
    if len(element.properties) != 1 or element.count == 0:
        return None
    name, count_type, item_type = element.properties[0]
    count_dtype = np.dtype(order + count_type)
    if offset + count_dtype.itemsize > len(data):
        return None
    n = int(np.frombuffer(data, dtype=count_dtype, count=1, offset=offset)[0])
    dtype = np.dtype([("n", count_dtype), ("idx", order + item_type, (n,))])
    if n < 1 or offset + dtype.itemsize * element.count > len(data):
        return None
    table = np.frombuffer(data, dtype=dtype, count=element.count, offset=offset)
    if not np.all(table["n"] == n):
        return None
    rows = table["idx"].astype(np.int64).tolist()
    return [{name: row} for row in rows], offset + dtype.itemsize * element.count


def _ply_binary_body(data: bytes, offset: int, order: str, elements: list[_PlyElement], where: str) -> dict:
    """Element name -> structured array (scalar-only elements) or list of record dicts."""
    out: dict = {}
    for element in elements:
        if all(len(p) == 2 for p in element.properties):
            dtype = np.dtype([(p[0], order + p[1]) for p in element.properties])
            size = dtype.itemsize * element.count
            if offset + size > len(data):
                raise FileFormatError(f"{where}: file ends inside the '{element.name}' element (truncated)")
            out[element.name] = np.frombuffer(data, dtype=dtype, count=element.count, offset=offset)
            offset += size
            continue
        uniform = _ply_uniform_lists(data, offset, order, element)
        if uniform is not None:
            out[element.name], offset = uniform
            continue
        records = []
        for index in range(element.count):
            record = {}
            for prop in element.properties:
                dtype = np.dtype(order + prop[1])
                if offset + dtype.itemsize > len(data):
                    raise FileFormatError(f"{where}: file ends inside '{element.name}' record {index} (truncated)")
                value = np.frombuffer(data, dtype=dtype, count=1, offset=offset)[0]
                offset += dtype.itemsize
                if len(prop) == 3:
                    item = np.dtype(order + prop[2])
                    n = int(value)
                    if offset + n * item.itemsize > len(data):
                        raise FileFormatError(f"{where}: file ends inside '{element.name}' record {index} (truncated)")
                    value = np.frombuffer(data, dtype=item, count=n, offset=offset).astype(np.int64).tolist()
                    offset += n * item.itemsize
                record[prop[0]] = value
            records.append(record)
        out[element.name] = records
    return out


def read_ply(path: str | os.PathLike) -> Mesh:
    """Read a PLY (ascii / binary_little_endian / binary_big_endian): vertex x, y, z and face lists."""
    path = Path(path)
    where = f"PLY file {str(path)!r}"
    if not path.exists():
        raise MissingFileError(f"{where} does not exist")
    if path.is_dir():
        raise InputError(f"PLY path {str(path)!r} is a directory; expected a file")
    data = path.read_bytes()
    fmt, elements, body = _parse_ply_header(data, where)
    names = {e.name: e for e in elements}
    if "vertex" not in names:
        raise FileFormatError(f"{where}: no 'element vertex' in the header")
    vertex_props = [p[0] for p in names["vertex"].properties if len(p) == 2]
    if not all(axis in vertex_props for axis in "xyz"):
        raise FileFormatError(f"{where}: the vertex element has properties {vertex_props}; expected x, y and z")
    face_prop = None
    if "face" in names:
        lists = [p[0] for p in names["face"].properties if len(p) == 3]
        face_prop = next((p for p in _FACE_LISTS if p in lists), None)
        if face_prop is None:
            raise FileFormatError(f"{where}: the face element has no list property named {' or '.join(_FACE_LISTS)}")
    if fmt == "ascii":
        header_lines = data[:body].count(b"\n")
        text = data[body:].decode("ascii", errors="replace").splitlines()
        content = _ply_ascii_body(text, elements, header_lines + 1, where)
        verts = np.array([[r["x"], r["y"], r["z"]] for r in content["vertex"]], dtype=np.float64).reshape(-1, 3)
    else:
        content = _ply_binary_body(data, body, _PLY_FORMATS[fmt], elements, where)
        table = content["vertex"]
        verts = np.stack([np.asarray(table[a], dtype=np.float64) for a in "xyz"], axis=1).reshape(-1, 3)
    if not np.all(np.isfinite(verts)):
        row = int(np.argmax(~np.all(np.isfinite(verts), axis=1)))
        raise FileFormatError(f"{where}: vertex {row} is {verts[row].tolist()}; expected finite coordinates")
    faces: list[tuple[int, int, int]] = []
    for index, record in enumerate(content.get("face", [])):
        polygon = record[face_prop]
        if len(polygon) < 3 or min(polygon) < 0 or max(polygon) >= len(verts):
            raise FileFormatError(
                f"{where}: face {index} {polygon} needs at least 3 vertex indices in [0, {len(verts) - 1}]"
            )
        faces.extend(_fan(polygon))
    return _mesh_from_lists(verts, faces, where)


def read_mesh(path: str | os.PathLike) -> Mesh:
    """Read a mesh by file extension: .obj or .ply."""
    suffix = Path(path).suffix.lower()
    if suffix == ".obj":
        return read_obj(path)
    if suffix == ".ply":
        return read_ply(path)
    raise InputError(
        f"mesh file {str(path)!r}: extension {suffix!r} is not a mesh format xmesh reads; expected .obj or .ply"
    )
