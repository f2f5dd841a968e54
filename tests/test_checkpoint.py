"""CRC-32C and the TensorFlow-free V2 checkpoint reader, against a checkpoint TensorFlow itself wrote."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from xmesh.errors import ChecksumError, FileFormatError, InputError, MissingFileError
from xmesh.io import crc32c as crcmod
from xmesh.io.checkpoint import convert, read_checkpoint, read_index, resolve_prefix
from xmesh.io.crc32c import crc32c, mask, unmask

SUBSET = "meshnet_subset.ckpt-5"
SHARD = f"{SUBSET}.data-00000-of-00001"


# ----------------------------------------------------------------------------- CRC-32C


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"", 0x00000000),
        (b"123456789", 0xE3069283),
        (bytes(32), 0x8A9136AA),
        (b"\xff" * 32, 0x62A8AB43),
        (bytes(range(32)), 0x46DD794E),
        (bytes(range(31, -1, -1)), 0x113FDB5C),
    ],
)
def test_crc32c_known_vectors(data, expected):
    assert crc32c(data) == expected
    assert crc32c(np.frombuffer(data, dtype=np.uint8)) == expected
    # the pure-Python fallback loop computes the same value as the compiled one
    state = crcmod._crc_loop(data, 0xFFFFFFFF, crcmod._PY_TABLES)
    assert state ^ 0xFFFFFFFF == expected


def test_crc32c_continuation_and_arrays():
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 100_003, dtype=np.uint8)
    whole = crc32c(data)
    for cut in (0, 1, 7, 8, 9, 50_000, 100_003):
        assert crc32c(data[cut:], crc32c(data[:cut])) == whole
    floats = rng.standard_normal((37, 5)).astype(np.float32)
    assert crc32c(floats) == crc32c(floats.tobytes())
    assert crc32c(np.asfortranarray(floats)) == crc32c(floats.tobytes())
    flipped = data.copy()
    flipped[12345] ^= 0x10
    assert crc32c(flipped) != whole


def test_mask_unmask():
    assert mask(0) == 0xA282EAD8
    assert mask(0x8000) == (1 + 0xA282EAD8) & 0xFFFFFFFF  # bit 15 rotates down to bit 0
    for value in (0, 1, 0xE3069283, 0xFFFFFFFF, 0x12345678):
        assert unmask(mask(value)) == value
        assert mask(value) != value


# ----------------------------------------------------------------------------- the TF-written checkpoint


@pytest.fixture(scope="module")
def expected_subset(golden_dir):
    with np.load(golden_dir / "tf_ckpt" / "meshnet_subset_expected.npz") as npz:
        return {k.replace("|", "/"): npz[k] for k in npz.files}


@pytest.fixture()
def ckpt_copy(golden_dir, tmp_path) -> Path:
    for name in (f"{SUBSET}.index", SHARD, "checkpoint"):
        shutil.copy(golden_dir / "tf_ckpt" / name, tmp_path / name)
        (tmp_path / name).chmod(0o644)
    return tmp_path / SUBSET


def _assert_bit_equal(got: dict, expected: dict):
    assert sorted(got) == sorted(expected)
    for name, want in expected.items():
        assert got[name].dtype == want.dtype, name
        assert got[name].shape == want.shape, name
        assert got[name].tobytes() == want.tobytes(), name


def test_tf_checkpoint_bit_exact(golden_dir, expected_subset):
    got = read_checkpoint(golden_dir / "tf_ckpt" / SUBSET)
    assert len(got) == 52
    _assert_bit_equal(got, expected_subset)
    assert all(a.flags.writeable and a.flags.c_contiguous for a in got.values())


def test_tf_checkpoint_index_entries(golden_dir, expected_subset):
    index = read_index(golden_dir / "tf_ckpt" / f"{SUBSET}.index")
    assert sorted(index) == sorted(expected_subset)
    end = 0
    for name, info in sorted(index.items(), key=lambda kv: kv[1].offset):
        arr = expected_subset[name]
        assert info.dtype == np.float32 and info.shape == arr.shape and info.shard == 0
        assert info.size == arr.nbytes and info.offset >= end
        # the entry stores the masked CRC; read_index hands back the plain CRC-32C of the bytes
        assert info.crc == crc32c(arr.tobytes())
        end = info.offset + info.size
    assert end == (golden_dir / "tf_ckpt" / SHARD).stat().st_size


def test_prefix_forms(golden_dir, expected_subset):
    folder = golden_dir / "tf_ckpt"
    assert resolve_prefix(folder) == folder / SUBSET  # via the 'checkpoint' text file
    assert resolve_prefix(folder / f"{SUBSET}.index") == folder / SUBSET
    assert resolve_prefix(folder / SHARD) == folder / SUBSET
    name = "meshnet/pixel2mesh/graph_drb_blk2_layer_5/localgconv_12_vars/bias:0"
    got = read_checkpoint(str(folder), names=[name])
    assert list(got) == [name] and got[name].tobytes() == expected_subset[name].tobytes()
    with pytest.raises(InputError, match="conv2d_9/W:0"):
        read_checkpoint(folder, names=["meshnet/cnn/conv2d_9/W:0"])


def test_official_indexes_match_manifest(shared_dir):
    folder = shared_dir / "official_index"
    manifest = {e["name"]: tuple(e["shape"]) for e in json.loads((folder / "manifest.json").read_text())}
    assert len(manifest) == 237
    union: dict[str, tuple] = {}
    for stem, prefix, count in (("meshnetmvp2m.ckpt-50", "meshnetmvp2m/", 165), ("meshnet.ckpt-10", "meshnet/", 72)):
        index = read_index(folder / f"{stem}.index")
        assert len(index) == count
        assert all(n.startswith(prefix) for n in index)
        assert not set(index) & set(union)
        for name, info in index.items():
            assert info.dtype == np.dtype("float32"), name
            assert info.size == int(np.prod(info.shape)) * 4, name
            union[name] = info.shape
    assert union == manifest


def test_missing_index_and_folder(tmp_path):
    with pytest.raises(MissingFileError, match="nothing.ckpt.index"):
        read_index(tmp_path / "nothing.ckpt")
    with pytest.raises(MissingFileError, match="'checkpoint' file"):
        read_index(tmp_path)


# ----------------------------------------------------------------------------- corruption


def test_flipped_tensor_byte_names_variable(ckpt_copy):
    index = read_index(ckpt_copy)
    victim = "meshnet/cnn/conv2d_5/W:0"
    info = index[victim]
    shard = ckpt_copy.parent / SHARD
    raw = bytearray(shard.read_bytes())
    raw[info.offset + info.size // 2] ^= 0x01
    shard.write_bytes(bytes(raw))
    with pytest.raises(ChecksumError) as err:
        read_checkpoint(ckpt_copy)
    assert victim in str(err.value) and SHARD in str(err.value)
    # other variables in the same shard are still readable on their own
    others = [n for n in index if n != victim]
    assert len(read_checkpoint(ckpt_copy, names=others)) == 51


def test_truncated_shard(ckpt_copy):
    shard = ckpt_copy.parent / SHARD
    full = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[: full // 2])
    with pytest.raises(FileFormatError) as err:
        read_checkpoint(ckpt_copy)
    msg = str(err.value)
    assert "truncated" in msg and str(full // 2) in msg and str(full) in msg and SHARD in msg


def test_missing_shard(ckpt_copy):
    (ckpt_copy.parent / SHARD).unlink()
    with pytest.raises(MissingFileError, match=SHARD):
        read_checkpoint(ckpt_copy)
    assert len(read_index(ckpt_copy)) == 52  # the index alone is still readable


@pytest.mark.parametrize("content", [b"", b"short", bytes(range(256)) * 3, b"\x00" * 48])
def test_garbage_index(tmp_path, content):
    (tmp_path / "bad.index").write_bytes(content)
    with pytest.raises(FileFormatError, match="bad.index"):
        read_index(tmp_path / "bad")


def test_flipped_index_byte_is_block_checksum_error(ckpt_copy):
    index_path = ckpt_copy.parent / f"{SUBSET}.index"
    raw = bytearray(index_path.read_bytes())
    raw[40] ^= 0x20  # inside the first data block (variable names)
    index_path.write_bytes(bytes(raw))
    with pytest.raises(ChecksumError, match="block"):
        read_index(ckpt_copy)


def test_convert_round_trip(ckpt_copy, tmp_path, expected_subset):
    out = tmp_path / "out" / "weights.npz"
    assert convert(ckpt_copy, out) == out
    with np.load(out) as npz:
        got = {k: npz[k] for k in npz.files}
    _assert_bit_equal(got, expected_subset)
    assert sorted(p.name for p in out.parent.iterdir()) == ["weights.npz"]  # no temp files left


# ----------------------------------------------------------------------------- hand-built tables
# A minimal writer of the same format (uncompressed, one data block), to cover dtypes, several shards,
# big-endian bundles, and the rejection of compressed tables and string tensors.


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value) -> bytes:
    if isinstance(value, bytes):
        return _varint(number << 3 | 2) + _varint(len(value)) + value
    return _varint(number << 3) + _varint(value)


def _block(entries) -> bytes:
    body = b"".join(_varint(0) + _varint(len(k)) + _varint(len(v)) + k + v for k, v in entries)
    return body + struct.pack("<II", 0, 1)


def _table(entries, ctype: int = 0) -> bytes:
    out = bytearray()

    def put(block: bytes) -> bytes:
        handle = _varint(len(out)) + _varint(len(block))
        trailer = bytes([ctype])
        out.extend(block + trailer + struct.pack("<I", mask(crc32c(block + trailer))))
        return handle

    data_handle = put(_block(entries))
    meta_handle = put(struct.pack("<II", 0, 1))
    index_handle = put(_block([(entries[-1][0] + b"\xff", data_handle)]))
    footer = (meta_handle + index_handle).ljust(40, b"\x00") + struct.pack("<Q", 0xDB4775248B80FB57)
    return bytes(out) + footer


def _write_bundle(prefix: Path, tensors: dict, num_shards: int = 2, big_endian: bool = False, ctype: int = 0):
    """tensors: name -> (tf dtype enum, array); tensor k goes to shard k % num_shards."""
    shards = [bytearray() for _ in range(num_shards)]
    entries = [(b"", _field(1, num_shards) + _field(2, int(big_endian)) + _field(3, _field(1, 1)))]
    for k, (name, (tf_dtype, arr)) in enumerate(sorted(tensors.items())):
        arr = np.asarray(arr)
        raw = arr.astype(arr.dtype.newbyteorder(">" if big_endian else "<")).tobytes()
        shard = k % num_shards
        shape = b"".join(_field(2, _field(1, d)) for d in arr.shape)
        entry = (
            _field(1, tf_dtype)
            + _field(2, shape)
            + (_field(3, shard) if shard else b"")
            + _field(4, len(shards[shard]))
            + _field(5, len(raw))
            + _varint(6 << 3 | 5)
            + struct.pack("<I", mask(crc32c(raw)))
        )
        entries.append((name.encode(), entry))
        shards[shard].extend(raw)
    Path(f"{prefix}.index").write_bytes(_table(entries, ctype))
    for s, data in enumerate(shards):
        Path(f"{prefix}.data-{s:05d}-of-{num_shards:05d}").write_bytes(bytes(data))


_TYPED = {
    "a/f64:0": (2, np.linspace(-1, 1, 6).reshape(2, 3)),
    "b/i32:0": (3, np.arange(-5, 5, dtype=np.int32)),
    "c/u8:0": (4, np.arange(250, 256, dtype=np.uint8)),
    "d/i16:0": (5, np.array([-32768, 7, 32767], dtype=np.int16)),
    "e/i8:0": (6, np.array([[-128, 0], [1, 127]], dtype=np.int8)),
    "f/i64:0": (9, np.array(2**40 + 3, dtype=np.int64)),  # a scalar, like global_step
    "g/bool:0": (10, np.array([True, False, True])),
    "h/f16:0": (19, np.array([0.5, -2.0, 65504.0], dtype=np.float16)),
    "i/f32:0": (1, np.zeros((0, 4), dtype=np.float32)),  # empty tensor
}


@pytest.mark.parametrize("big_endian", [False, True])
def test_dtypes_and_shards(tmp_path, big_endian):
    _write_bundle(tmp_path / "m.ckpt", _TYPED, num_shards=3, big_endian=big_endian)
    index = read_index(tmp_path / "m.ckpt")
    assert {info.shard for info in index.values()} == {0, 1, 2}
    got = read_checkpoint(tmp_path / "m.ckpt")
    assert sorted(got) == sorted(_TYPED)
    for name, (_, want) in _TYPED.items():
        assert got[name].dtype == want.dtype.newbyteorder("=") and got[name].dtype.isnative, name
        assert got[name].shape == want.shape, name
        np.testing.assert_array_equal(got[name], want)


def test_compressed_table_rejected(tmp_path):
    _write_bundle(tmp_path / "z.ckpt", {"x:0": (1, np.ones(3, np.float32))}, num_shards=1, ctype=1)
    with pytest.raises(FileFormatError, match="compression type 1.*Snappy.*type 0"):
        read_index(tmp_path / "z.ckpt")


def test_string_tensor_rejected(tmp_path):
    _write_bundle(tmp_path / "s.ckpt", {"x:0": (7, np.zeros(2, np.uint8)), "y:0": (1, np.ones(2, np.float32))})
    assert read_index(tmp_path / "s.ckpt")["x:0"].dtype is None
    assert read_checkpoint(tmp_path / "s.ckpt", ["y:0"])["y:0"].tolist() == [1.0, 1.0]
    with pytest.raises(FileFormatError, match="DT_STRING"):
        read_checkpoint(tmp_path / "s.ckpt")


def test_unknown_dtype_rejected(tmp_path):
    _write_bundle(tmp_path / "u.ckpt", {"x:0": (77, np.zeros(2, np.uint8))}, num_shards=1)
    with pytest.raises(FileFormatError, match="dtype enum 77"):
        read_index(tmp_path / "u.ckpt")
