"""Fuzzing the file readers with hypothesis: only ``XmeshError`` subclasses may come out, and no hang.

Inputs are random bytes and mutations (bit flips, overwrites, insertions, deletions, truncation)
of real files: the TensorFlow-written checkpoint (``golden/tf_ckpt``), the golden template pickle,
a demo PNG, and OBJ/PLY files. For the checkpoint index a second strategy re-computes the block
CRC after mutating, so the fuzz reaches the entry and protobuf parsers behind the checksum.
Every call runs under a ``signal.alarm`` guard. Property tests check that meshes written by
``to_obj`` / ``to_ply`` / ``to_xyz`` read back bit for bit.

Examples are derandomized (the same every run) unless XMESH_FUZZ_RANDOM is set; XMESH_FUZZ_EXAMPLES
sets the number per test (default 150; the round trips run two thirds of it).
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xmesh.errors import XmeshError
from xmesh.io import safe_pickle
from xmesh.io.checkpoint import _varint, read_checkpoint, read_index
from xmesh.io.crc32c import crc32c, mask
from xmesh.io.images import load_image
from xmesh.io.template import load_template
from xmesh.mesh import Mesh, read_obj, read_ply, read_xyz

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
CKPT = SHARED / "golden" / "tf_ckpt"
SUBSET = "meshnet_subset.ckpt-5"
SHARD = f"{SUBSET}.data-00000-of-00001"
TIMEOUT_S = 20

FUZZ = settings(
    max_examples=int(os.environ.get("XMESH_FUZZ_EXAMPLES", "150")),
    deadline=None,
    database=None,
    derandomize=os.environ.get("XMESH_FUZZ_RANDOM") is None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class Hang(Exception):
    pass


def only_xmesh_errors(call, *args):
    """Run ``call``; any exception other than an XmeshError, or running past TIMEOUT_S, fails the test."""

    def alarm(signum, frame):
        raise Hang(f"{getattr(call, '__name__', call)} ran longer than {TIMEOUT_S} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(TIMEOUT_S)
    try:
        return call(*args)
    except XmeshError as exc:
        assert str(exc), "an XmeshError without a message"
        return exc
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# --------------------------------------------------------------------------------- mutations

MUTATION = st.tuples(
    st.sampled_from(["flip", "set", "insert", "delete", "truncate"]),
    st.integers(0, 2**32),  # position, taken modulo the length
    st.integers(0, 255),
    st.binary(min_size=1, max_size=16),
)


def mutate(data: bytes, mutations) -> bytes:
    buf = bytearray(data)
    for kind, pos, value, chunk in mutations:
        if not buf:
            buf.extend(chunk)
            continue
        at = pos % len(buf)
        if kind == "flip":
            buf[at] ^= 1 << (value % 8)
        elif kind == "set":
            buf[at] = value
        elif kind == "insert":
            buf[at:at] = chunk
        elif kind == "delete":
            del buf[at : at + 1 + value % 64]
        else:
            del buf[at:]
    return bytes(buf)


MUTATIONS = st.lists(MUTATION, min_size=1, max_size=4)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# --------------------------------------------------------------------------------- checkpoint


@functools.cache
def original(path: Path) -> bytes:
    """A reference file's bytes (a function, not a fixture: hypothesis would print fixtures on failure)."""
    return path.read_bytes()


def ckpt_bytes() -> tuple[bytes, bytes]:
    return original(CKPT / f"{SUBSET}.index"), original(CKPT / SHARD)


def _write_ckpt(folder: Path, index: bytes, shard: bytes | None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{SUBSET}.index").write_bytes(index)
    if shard is not None:
        (folder / SHARD).write_bytes(shard)
    return folder / SUBSET


def _read_both(prefix: Path):
    only_xmesh_errors(read_index, prefix)
    only_xmesh_errors(read_checkpoint, prefix)


@FUZZ
@given(mutations=MUTATIONS)
def test_fuzz_checkpoint_index(mutations, work):
    index, shard = ckpt_bytes()
    prefix = _write_ckpt(work / "index", mutate(index, mutations), shard)
    _read_both(prefix)


def _data_block(index: bytes) -> tuple[int, int]:
    """(offset, size) of the index file's one data block, from its footer and index block."""
    footer = index[-48:]
    _, pos = _varint(footer, 0, "footer")
    _, pos = _varint(footer, pos, "footer")
    index_off, pos = _varint(footer, pos, "footer")
    # the index block's first entry: varints shared, non_shared, value length, key, then the handle
    _, p = _varint(index, index_off, "index")
    non_shared, p = _varint(index, p, "index")
    _, p = _varint(index, p, "index")
    p += non_shared
    offset, p = _varint(index, p, "handle")
    size, _ = _varint(index, p, "handle")
    return offset, size


@FUZZ
@given(changes=st.lists(st.tuples(st.integers(0, 2**32), st.integers(0, 255)), min_size=1, max_size=6))
def test_fuzz_checkpoint_index_behind_the_crc(changes, work):
    """Overwrite bytes of the data block and fix its CRC: the entry/proto parsers see the damage."""
    index, shard = ckpt_bytes()
    offset, size = _data_block(index)
    buf = bytearray(index)
    for pos, value in changes:
        buf[offset + pos % size] = value
    crc = mask(crc32c(bytes(buf[offset : offset + size + 1])))
    buf[offset + size + 1 : offset + size + 5] = struct.pack("<I", crc)
    prefix = _write_ckpt(work / "deep", bytes(buf), shard)
    _read_both(prefix)


@FUZZ
@given(mutations=MUTATIONS)
def test_fuzz_checkpoint_shard(mutations, work):
    index, shard = ckpt_bytes()
    prefix = _write_ckpt(work / "shard", index, mutate(shard, mutations))
    _read_both(prefix)


@FUZZ
@given(data=st.binary(max_size=4096))
def test_fuzz_checkpoint_random_bytes(data, work):
    prefix = _write_ckpt(work / "random", data, data)
    _read_both(prefix)


def test_checkpoint_control(work):
    """Control: the unmutated files read, so the fuzz above starts from a valid checkpoint."""
    prefix = _write_ckpt(work / "control", *ckpt_bytes())
    assert len(read_checkpoint(prefix)) == 52
    offset, size = _data_block(ckpt_bytes()[0])
    assert offset == 0 and 0 < size < len(ckpt_bytes()[0])


# --------------------------------------------------------------------------------- pickles


def template_bytes() -> bytes:
    return original(SHARED / "golden" / "template.dat")


@FUZZ
@given(data=st.binary(max_size=2048))
def test_fuzz_pickle_random_bytes(data):
    only_xmesh_errors(safe_pickle.loads, data)


@FUZZ
@given(data=st.binary(max_size=512), protocol=st.integers(2, 5))
def test_fuzz_pickle_after_header(data, protocol):
    """Random opcodes behind a valid PROTO header, so the unpickler gets past the first byte."""
    only_xmesh_errors(safe_pickle.loads, bytes([0x80, protocol]) + data)


@FUZZ
@given(mutations=MUTATIONS)
def test_fuzz_template(mutations, work):
    path = work / "template.dat"
    path.write_bytes(mutate(template_bytes(), mutations))
    only_xmesh_errors(load_template, path)
    only_xmesh_errors(safe_pickle.load, path)


@FUZZ
@given(mutations=st.lists(MUTATION, min_size=1, max_size=3), cut=st.integers(0, 2**32))
def test_fuzz_template_head(mutations, cut, work):
    """Mutations confined to the first 4 KiB (the dict and list opcodes), then a random truncation."""
    head = mutate(template_bytes()[:4096], mutations)
    data = head + template_bytes()[4096:]
    data = data[: len(data) - cut % 64] if cut % 3 == 0 else data
    path = work / "template_head.dat"
    path.write_bytes(data)
    only_xmesh_errors(load_template, path)


def test_template_control(work):
    path = work / "control.dat"
    path.write_bytes(template_bytes())
    assert load_template(path).num_vertices == (156, 618, 2466)


# --------------------------------------------------------------------------------- images


def png_bytes() -> bytes:
    return original(SHARED / "demo" / "plane1.png")


def _check_image(result):
    if not isinstance(result, XmeshError):
        assert result.shape == (224, 224, 3) and result.dtype == np.float32
        assert np.all(np.isfinite(result)) and result.min() >= 0 and result.max() <= 1


@FUZZ
@given(mutations=MUTATIONS)
def test_fuzz_png(mutations, work):
    path = work / "fuzz.png"
    path.write_bytes(mutate(png_bytes(), mutations))
    _check_image(only_xmesh_errors(load_image, path))


@FUZZ
@given(
    data=st.binary(max_size=2048),
    header=st.sampled_from([b"", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"BM", b"GIF89a", b"II*\x00"]),
)
def test_fuzz_image_random_bytes(data, header, work):
    path = work / "random.img"
    path.write_bytes(header + data)
    _check_image(only_xmesh_errors(load_image, path))


def test_png_control(work):
    path = work / "control.png"
    path.write_bytes(png_bytes())
    _check_image(load_image(path))


# --------------------------------------------------------------------------------- meshes


@pytest.fixture(scope="module")
def mesh_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("meshes")
    rng = np.random.default_rng(3)
    mesh = Mesh(rng.standard_normal((12, 3)).astype(np.float32), rng.integers(0, 12, (20, 3)))
    files = {
        "obj": mesh.to_obj(folder / "m.obj").read_bytes() + b"vn 0 0 1\nf 1/1/1 2//2 -1 4\n",
        "ply_ascii": mesh.to_ply(folder / "a.ply").read_bytes(),
        "ply_binary": mesh.to_ply(folder / "b.ply", binary=True).read_bytes(),
    }
    big_endian = files["ply_binary"].replace(b"binary_little_endian", b"binary_big_endian")
    head, body = big_endian.split(b"end_header\n", 1)
    vertices = np.frombuffer(body[: 12 * 12], "<f4").astype(">f4").tobytes()
    records = np.frombuffer(body[12 * 12 :], [("n", "u1"), ("idx", "<i4", (3,))]).astype(
        [("n", "u1"), ("idx", ">i4", (3,))]
    )
    files["ply_big_endian"] = head + b"end_header\n" + vertices + records.tobytes()
    return files


@FUZZ
@given(kind=st.sampled_from(["obj", "ply_ascii", "ply_binary", "ply_big_endian"]), mutations=MUTATIONS)
def test_fuzz_mesh_readers(kind, mutations, mesh_files, work):
    suffix = ".obj" if kind == "obj" else ".ply"
    path = work / f"fuzz{suffix}"
    path.write_bytes(mutate(mesh_files[kind], mutations))
    result = only_xmesh_errors(read_obj if suffix == ".obj" else read_ply, path)
    if isinstance(result, Mesh):
        assert result.vertices.dtype == np.float32 and np.all(np.isfinite(result.vertices))
        assert result.faces.size == 0 or (result.faces.min() >= 0 and result.faces.max() < len(result.vertices))


@FUZZ
@given(
    data=st.binary(max_size=1024),
    header=st.sampled_from(
        [
            b"",
            b"ply\nformat ascii 1.0\n",
            b"ply\nformat binary_little_endian 1.0\n",
            b"v 1 2 3\nf ",
            b"ply\nend_header\n",
        ]
    ),
)
def test_fuzz_mesh_random_bytes(data, header, work):
    for suffix, reader in ((".obj", read_obj), (".ply", read_ply), (".xyz", read_xyz)):
        path = work / f"random{suffix}"
        path.write_bytes(header + data)
        only_xmesh_errors(reader, path)


def test_mesh_controls(mesh_files, work):
    for kind, data in mesh_files.items():
        path = work / f"control.{'obj' if kind == 'obj' else 'ply'}"
        path.write_bytes(data)
        mesh = (read_obj if kind == "obj" else read_ply)(path)
        assert mesh.vertices.shape == (12, 3)
        assert len(mesh.faces) == (20 + 2 if kind == "obj" else 20)  # the extra quad fans into 2 triangles


# --------------------------------------------------------------------------------- round trips

FLOATS = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def meshes(draw):
    count = draw(st.integers(0, 40))
    vertices = np.array(
        draw(st.lists(st.tuples(FLOATS, FLOATS, FLOATS), min_size=count, max_size=count)), dtype=np.float32
    ).reshape(-1, 3)
    faces = draw(st.lists(st.tuples(*[st.integers(0, count - 1)] * 3), max_size=60)) if count else []
    return Mesh(vertices, np.array(faces, dtype=np.int64).reshape(-1, 3))


ROUND_TRIP = settings(FUZZ, max_examples=max(1, FUZZ.max_examples * 2 // 3))


def _same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype == np.float32
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@ROUND_TRIP
@given(mesh=meshes(), writer=st.sampled_from(["obj", "ply_ascii", "ply_binary"]))
def test_mesh_round_trip(mesh, writer, work):
    folder = Path(tempfile.mkdtemp(dir=work))
    try:
        if writer == "obj":
            back = read_obj(mesh.to_obj(folder / "m.obj"))
        else:
            back = read_ply(mesh.to_ply(folder / "m.ply", binary=writer == "ply_binary"))
        _same_bits(back.vertices, mesh.vertices)
        np.testing.assert_array_equal(back.faces, mesh.faces)
        assert back.faces.dtype == np.int64
        assert sorted(p.name for p in folder.iterdir()) == ["m.obj" if writer == "obj" else "m.ply"]
    finally:
        shutil.rmtree(folder)


@ROUND_TRIP
@given(mesh=meshes())
def test_xyz_round_trip(mesh, work):
    path = work / "points.xyz"
    mesh.to_xyz(path)
    _same_bits(read_xyz(path), mesh.vertices)
