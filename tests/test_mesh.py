"""Mesh: validation, OBJ / XYZ / PLY writers and readers, atomic writes."""

from __future__ import annotations

import numpy as np
import pytest

import xmesh.mesh as mesh_module
from xmesh.errors import FileFormatError, InputError, MissingFileError
from xmesh.io.gltf import read_glb
from xmesh.mesh import Mesh, read_mesh, read_obj, read_obj_faces, read_ply, read_xyz


def _bits(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)


@pytest.fixture()
def tricky_mesh() -> Mesh:
    rng = np.random.default_rng(7)
    vertices = (rng.standard_normal((500, 3)) * 10.0 ** rng.integers(-6, 6, (500, 1))).astype(np.float32)
    vertices[:8] = np.array(
        [
            [0.0, -0.0, 1.0],
            [np.float32(1e-45), -np.float32(1.2e-38), 3.4028235e38],
            [0.1, 1 / 3, -2 / 3],
            [np.nextafter(np.float32(1), np.float32(2)), 16777217, -7e-39],
            [1e-10, 123456.789, -0.8],
            [5e-324, 1, 2],
            [np.pi, np.e, -1e30],
            [2.5, 3.5, -4.5],
        ],
        dtype=np.float64,
    ).astype(np.float32)
    faces = rng.integers(0, 500, (900, 3))
    return Mesh(vertices, faces, coarse_vertices=vertices * 0.5)


def test_read_official_demo_output(demo_dir):
    mesh = read_obj(demo_dir / "predict.obj")
    assert mesh.vertices.shape == (2466, 3) and mesh.vertices.dtype == np.float32
    assert mesh.faces.shape == (4928, 3) and mesh.faces.dtype == np.int64
    assert mesh.faces.min() == 0 and mesh.faces.max() == 2465
    assert mesh.coarse_vertices is None
    assert np.array_equal(mesh.vertices[0], np.array([-0.10415806, -0.006068296, -0.7009228], np.float32))
    # face3.obj holds only the face lines of the official demo; predict.obj uses the same faces
    faces = read_obj_faces(demo_dir / "face3.obj")
    assert faces.shape == (4928, 3) and np.array_equal(faces, mesh.faces)
    assert faces[0].tolist() == [0, 618, 619]
    with pytest.raises(FileFormatError, match=r"face3\.obj.*line 1.*defines 0 vertices.*read_obj_faces"):
        read_obj(demo_dir / "face3.obj")


def test_mesh_validation():
    v = np.zeros((4, 3))
    mesh = Mesh(v, [[0, 1, 2], [1, 2, 3]])
    assert mesh.vertices.dtype == np.float32 and mesh.faces.dtype == np.int64
    assert Mesh(v, np.zeros((0, 3), np.int32)).faces.shape == (0, 3)
    assert Mesh(v, []).faces.shape == (0, 3)
    with pytest.raises(InputError, match=r"vertices has shape \(4, 2\); expected \(V, 3\)"):
        Mesh(np.zeros((4, 2)), [[0, 1, 2]])
    bad = v.copy()
    bad[2, 1] = np.nan
    with pytest.raises(InputError, match="vertices row 2 .*expected finite"):
        Mesh(bad, [[0, 1, 2]])
    with pytest.raises(InputError, match=r"face 1 is \[1, 2, 4\]; expected 0-based vertex indices in \[0, 3\]"):
        Mesh(v, [[0, 1, 2], [1, 2, 4]])
    with pytest.raises(InputError, match="face 0 is"):
        Mesh(v, [[-1, 1, 2]])
    with pytest.raises(InputError, match="faces have dtype float64"):
        Mesh(v, [[0.0, 1.0, 2.0]])
    with pytest.raises(InputError, match=r"faces have shape \(1, 4\)"):
        Mesh(v, [[0, 1, 2, 3]])
    with pytest.raises(InputError, match="coarse_vertices have shape"):
        Mesh(v, [[0, 1, 2]], coarse_vertices=np.zeros((3, 3)))
    with pytest.raises(InputError, match="coarse_vertices row 0"):
        Mesh(v, [[0, 1, 2]], coarse_vertices=np.full((4, 3), np.inf))
    with pytest.raises(InputError, match="no coarse_vertices"):
        mesh.coarse()
    coarse = Mesh(v, [[0, 1, 2]], coarse_vertices=v + 1).coarse()
    assert np.array_equal(coarse.vertices, v + 1) and coarse.coarse_vertices is None


def test_obj_round_trip_bit_equal(tmp_path, tricky_mesh):
    path = tricky_mesh.to_obj(tmp_path / "out.obj")
    back = read_obj(path)
    assert np.array_equal(_bits(back.vertices), _bits(tricky_mesh.vertices))
    assert np.array_equal(back.faces, tricky_mesh.faces)
    text = path.read_text().splitlines()
    assert text[1].startswith("v ") and text[-1].startswith("f ")
    assert [int(t) for t in text[-1].split()[1:]] == (tricky_mesh.faces[-1] + 1).tolist()  # 1-based
    assert np.array_equal(_bits(read_mesh(path).vertices), _bits(tricky_mesh.vertices))


def test_xyz_round_trip_bit_equal(tmp_path, tricky_mesh):
    path = tricky_mesh.to_xyz(tmp_path / "points.xyz")
    assert len(path.read_text().splitlines()) == 500
    assert np.array_equal(_bits(read_xyz(path)), _bits(tricky_mesh.vertices))


@pytest.mark.parametrize("binary", [False, True])
def test_ply_round_trip_bit_equal(tmp_path, tricky_mesh, binary):
    path = tricky_mesh.to_ply(tmp_path / "out.ply", binary=binary)
    head = path.read_bytes()[:40]
    assert head.startswith(b"ply\nformat " + (b"binary_little_endian" if binary else b"ascii") + b" 1.0\n")
    back = read_ply(path)
    assert np.array_equal(_bits(back.vertices), _bits(tricky_mesh.vertices))
    assert np.array_equal(back.faces, tricky_mesh.faces)
    assert np.array_equal(read_mesh(path).faces, tricky_mesh.faces)


def test_empty_mesh_round_trips(tmp_path):
    empty = Mesh(np.zeros((0, 3)), np.zeros((0, 3), int))
    assert read_obj(empty.to_obj(tmp_path / "e.obj")).vertices.shape == (0, 3)
    for binary in (False, True):
        assert read_ply(empty.to_ply(tmp_path / f"e{binary}.ply", binary=binary)).faces.shape == (0, 3)
    assert read_xyz(empty.to_xyz(tmp_path / "e.xyz")).shape == (0, 3)


def test_obj_reader_syntax(tmp_path):
    path = tmp_path / "syntax.obj"
    path.write_text(
        "# comment\nmtllib x.mtl\no thing\n"
        "v 0 0 0\nv 1 0 0 1.0\nv 1 1 0 0.5 0.5 0.5\nv 0 1 0\n"
        "vt 0 0\nvt 1 0\nvn 0 0 1\ng group\nusemtl red\ns off\n"
        "f 1/1/1 2/2/1 3/2/1\n"
        "f 1//1 3//1 4//1   # inline comment\n"
        "f 1 2 3 4\n"  # quad -> fan
        "f -4 -3 -2\n"  # negative: relative to the 4 vertices so far
        "v 2 2 2\n"
        "f -1 1 2\n"
        "l 1 2\n"
    )
    mesh = read_obj(path)
    assert mesh.vertices.shape == (5, 3)
    assert mesh.vertices[2].tolist() == [1, 1, 0]
    assert mesh.faces.tolist() == [[0, 1, 2], [0, 2, 3], [0, 1, 2], [0, 2, 3], [0, 1, 2], [4, 0, 1]]


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("v 0 0\n", r"line 1: vertex line .* does not start with 3 numbers"),
        ("v 0 0 0\nv 1 x 0\n", r"line 2: vertex line"),
        ("v 0 0 0\nv 0 nan 0\n", r"line 2: vertex .*not finite"),
        ("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2\n", r"line 4: face .*has 2 vertices; expected at least 3"),
        ("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 a\n", r"line 4: face vertex 'a' is not an integer"),
        ("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 0 1 2\n", r"line 4: face vertex '0' is out of range"),
        ("v 0 0 0\nv 1 0 0\nv 0 1 0\nf -1 -2 -4\n", r"line 4: face vertex '-4' is out of range"),
        ("v 0 0 0\nv 1 0 0\nv 0 1 0\n\nf 1 2 3\nf 1 2 9\n", r"line 6: face references vertex 9; the file defines 3"),
        ("v 0 0 1e39\n", r"vertex 0 has a coordinate beyond the float32 range"),
    ],
)
def test_obj_reader_errors(tmp_path, text, pattern):
    path = tmp_path / "bad.obj"
    path.write_text(text)
    with pytest.raises(FileFormatError, match=pattern) as info:
        read_obj(path)
    assert "bad.obj" in str(info.value)


def test_reader_file_errors(tmp_path):
    with pytest.raises(MissingFileError, match=r"nope\.obj"):
        read_obj(tmp_path / "nope.obj")
    with pytest.raises(MissingFileError, match=r"nope\.ply"):
        read_ply(tmp_path / "nope.ply")
    binary = tmp_path / "bin.obj"
    binary.write_bytes(b"v 0 0 0\n\xff\xfe\x81")
    with pytest.raises(FileFormatError, match=r"bin\.obj.*not UTF-8"):
        read_obj(binary)
    xyz = tmp_path / "bad.xyz"
    xyz.write_text("1 2 3\n4 5\n")
    with pytest.raises(FileFormatError, match=r"bad\.xyz.*line 2"):
        read_xyz(xyz)
    with pytest.raises(InputError, match=r"extension '\.stl'"):
        read_mesh(tmp_path / "x.stl")


def test_ply_ascii_with_extra_properties_and_polygons(tmp_path):
    path = tmp_path / "extra.ply"
    path.write_text(
        "ply\nformat ascii 1.0\ncomment made by hand\nobj_info test\n"
        "element vertex 4\nproperty double x\nproperty double y\nproperty double z\n"
        "property float nx\nproperty uchar red\n"
        "element face 2\nproperty uchar flags\nproperty list uchar uint vertex_index\n"
        "element edge 1\nproperty int vertex1\nproperty int vertex2\n"
        "end_header\n"
        "0 0 0 1 255\n1 0 0 1 255\n\n1 1 0 1 255\n0 1 0.25 1 255\n"
        "0 4 0 1 2 3\n1 3 3 2 1\n"
        "0 1\n"
    )
    mesh = read_ply(path)
    assert mesh.vertices.tolist()[3] == [0, 1, 0.25]
    assert mesh.faces.tolist() == [[0, 1, 2], [0, 2, 3], [3, 2, 1]]


def test_ply_binary_big_endian_and_mixed_polygons(tmp_path):
    vertices = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0]], dtype=">f8")
    header = (
        b"ply\nformat binary_big_endian 1.0\nelement vertex 4\nproperty double x\nproperty double y\n"
        b"property double z\nelement face 2\nproperty list uchar int vertex_indices\nend_header\n"
    )
    faces = bytes([3]) + np.array([0, 1, 2], ">i4").tobytes() + bytes([4]) + np.array([0, 1, 2, 3], ">i4").tobytes()
    path = tmp_path / "be.ply"
    path.write_bytes(header + vertices.tobytes() + faces)
    mesh = read_ply(path)
    assert np.array_equal(mesh.vertices, vertices.astype(np.float32))
    assert mesh.faces.tolist() == [[0, 1, 2], [0, 1, 2], [0, 2, 3]]
    path.write_bytes(header + vertices.tobytes() + faces[:-3])
    with pytest.raises(FileFormatError, match=r"be\.ply.*truncated"):
        read_ply(path)
    path.write_bytes(header + vertices.tobytes()[:50])
    with pytest.raises(FileFormatError, match=r"be\.ply.*'vertex' element \(truncated\)"):
        read_ply(path)


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("solid stl\n", "not a PLY file"),
        (
            "ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\nproperty float y\nend_header\n0 0\n",
            "expected x, y and z",
        ),
        ("ply\nformat ebcdic 1.0\nelement vertex 0\nend_header\n", r"line 2: format 'ebcdic'"),
        ("ply\nformat ascii 1.0\nelement vertex 1\nproperty quad x\nend_header\n", r"line 4: malformed header"),
        ("ply\nelement vertex 0\nend_header\n", "no 'format' line"),
        (
            "ply\nformat ascii 1.0\nelement vertex 2\nproperty float x\nproperty float y\nproperty float z\n"
            "end_header\n0 0 0\n",
            "file ends before all 2 'vertex' records",
        ),
        (
            "ply\nformat ascii 1.0\nelement vertex 2\nproperty float x\nproperty float y\nproperty float z\n"
            "end_header\n0 0 0\n1 1 one\n",
            r"line 9: '1 1 one' does not match",
        ),
        (
            "ply\nformat ascii 1.0\nelement vertex 3\nproperty float x\nproperty float y\nproperty float z\n"
            "element face 1\nproperty list uchar int vertex_indices\nend_header\n0 0 0\n1 0 0\n0 1 0\n3 0 1 3\n",
            r"face 0 \[0, 1, 3\] needs at least 3 vertex indices in \[0, 2\]",
        ),
        (
            "ply\nformat ascii 1.0\nelement vertex 3\nproperty float x\nproperty float y\nproperty float z\n"
            "element face 1\nproperty list uchar int vertex_indices\nend_header\n0 0 0\n1 0 0\n0 1 0\n3 0 1\n",
            r"line 13: '3 0 1' does not match",
        ),
        (
            "ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\nproperty float y\nproperty float z\n"
            "end_header\n0 inf 0\n",
            "vertex 0 .*expected finite",
        ),
        (
            "ply\nformat ascii 1.0\nelement vertex 0\nproperty float x\nproperty float y\nproperty float z\n"
            "element face 0\nproperty list uchar int corners\nend_header\n",
            "no list property named vertex_indices",
        ),
    ],
)
def test_ply_reader_errors(tmp_path, text, pattern):
    path = tmp_path / "bad.ply"
    path.write_text(text)
    with pytest.raises(FileFormatError, match=pattern) as info:
        read_ply(path)
    assert "bad.ply" in str(info.value)


# --------------------------------------------------------------------------- atomic writes


@pytest.mark.parametrize("writer", ["to_obj", "to_xyz", "to_ply"])
def test_failed_write_keeps_old_file(tmp_path, monkeypatch, tricky_mesh, writer):
    target = tmp_path / "mesh.out"
    target.write_text("old content\n")
    real_write_rows = mesh_module._write_rows

    def write_then_fail(handle, fmt, rows):
        real_write_rows(handle, fmt, rows[: len(rows) // 2])  # partial output reaches the temp file
        handle.flush()
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(mesh_module, "_write_rows", write_then_fail)
    with pytest.raises(OSError, match="disk full"):
        getattr(tricky_mesh, writer)(target)
    assert target.read_text() == "old content\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mesh.out"]  # no temp file left behind


def test_failed_binary_ply_keeps_old_file(tmp_path, monkeypatch, tricky_mesh):
    target = tmp_path / "mesh.ply"
    target.write_bytes(b"old")
    real_write_binary = mesh_module._write_binary
    calls = []

    def fail_on_faces(handle, records):
        calls.append(len(records))
        if len(calls) == 2:  # vertices went through; the faces break off halfway
            real_write_binary(handle, records[: len(records) // 2])
            raise OSError("interrupted (simulated)")
        real_write_binary(handle, records)

    monkeypatch.setattr(mesh_module, "_write_binary", fail_on_faces)
    with pytest.raises(OSError, match="interrupted"):
        tricky_mesh.to_ply(target, binary=True)
    assert calls == [500, 900]
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mesh.ply"]


def test_writers_overwrite_and_return_path(tmp_path, tricky_mesh):
    target = tmp_path / "sub" / "m.obj"
    assert tricky_mesh.to_obj(target) == target
    first = target.read_bytes()
    Mesh(tricky_mesh.vertices[:3], [[0, 1, 2]]).to_obj(target)
    assert target.read_bytes() != first and len(read_obj(target).vertices) == 3
    assert sorted(p.name for p in target.parent.iterdir()) == ["m.obj"]


# binary glTF -----------------------------------------------------------------------------------


def _glb_parts(data: bytes):
    """The GLB's header fields and chunks, read as the glTF 2.0 specification lays them out."""
    import json
    import struct

    magic, version, length = struct.unpack_from("<III", data, 0)
    json_length, json_type = struct.unpack_from("<II", data, 12)
    document = json.loads(data[20 : 20 + json_length])
    bin_length, bin_type = struct.unpack_from("<II", data, 20 + json_length)
    binary = data[28 + json_length : 28 + json_length + bin_length]
    return (
        (magic, version, length, json_length, json_type, bin_length, bin_type),
        document,
        binary,
        data[20 : 20 + json_length],
    )


def test_glb_follows_the_binary_gltf_layout_and_reads_back_bit_for_bit(tricky_mesh, tmp_path):
    mesh = tricky_mesh
    data = mesh.encode("glb")
    (magic, version, length, json_length, json_type, bin_length, bin_type), document, binary, raw_json = _glb_parts(
        data
    )
    assert (magic, version, length) == (0x46546C67, 2, len(data))
    assert (json_type, bin_type) == (0x4E4F534A, 0x004E4942)
    assert json_length % 4 == 0 and bin_length % 4 == 0 and 28 + json_length + bin_length == len(data)
    assert raw_json.rstrip(b" ") == raw_json.rstrip()  # JSON padded with spaces
    positions = document["accessors"][document["meshes"][0]["primitives"][0]["attributes"]["POSITION"]]
    view = document["bufferViews"][positions["bufferView"]]
    stored = np.frombuffer(binary, "<f4", positions["count"] * 3, view["byteOffset"]).reshape(-1, 3)
    np.testing.assert_array_equal(_bits(stored), _bits(mesh.vertices))
    assert positions["min"] == stored.min(axis=0).tolist() and positions["max"] == stored.max(axis=0).tolist()
    indices = document["accessors"][document["meshes"][0]["primitives"][0]["indices"]]
    assert indices["componentType"] == 5125 and indices["count"] == mesh.faces.size
    vertices, faces = read_glb(data)
    np.testing.assert_array_equal(_bits(vertices), _bits(mesh.vertices))
    np.testing.assert_array_equal(faces, mesh.faces)
    assert mesh.to_glb(tmp_path / "m.glb").read_bytes() == data


@pytest.mark.parametrize("damage", ["magic", "length", "chunk type", "index past the vertices", "truncated"])
def test_a_damaged_glb_is_refused(tricky_mesh, damage):
    import struct

    data = bytearray(tricky_mesh.encode("glb"))
    if damage == "magic":
        data[0:4] = b"gltf"
    elif damage == "length":
        data[8:12] = struct.pack("<I", len(data) + 4)
    elif damage == "chunk type":
        data[16:20] = b"JSOM"
    elif damage == "index past the vertices":
        data[-4:] = struct.pack("<I", 10**6)
    else:
        data = data[:-8]
    with pytest.raises(FileFormatError):
        read_glb(bytes(data))


def test_encode_gives_the_bytes_the_writers_write(tricky_mesh, tmp_path):
    mesh = tricky_mesh
    assert mesh.encode("obj") == mesh.to_obj(tmp_path / "m.obj").read_bytes()
    assert mesh.encode("ply") == mesh.to_ply(tmp_path / "b.ply", binary=True).read_bytes()
    assert mesh.encode("ply-ascii") == mesh.to_ply(tmp_path / "a.ply").read_bytes()
    with pytest.raises(InputError, match="stl"):
        mesh.encode("stl")
