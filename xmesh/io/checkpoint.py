"""Read TensorFlow V2 checkpoints (``PREFIX.index`` + ``PREFIX.data-NNNNN-of-MMMMM``) without TensorFlow.

Layout, as far as this reader needs it:

* ``PREFIX.index`` is a LevelDB-format table (SSTable). Its last 48 bytes are a footer: two block
  handles (metaindex, index; each a pair of varints offset/size), zero padding to 40 bytes, and
  the 8-byte little-endian magic 0xdb4775248b80fb57. The index block maps a separator key to the
  handle of each data block. Every block is followed by a 1-byte compression type and the masked
  CRC-32C of block + type byte, which is verified here. **Only compression type 0 (none) is
  supported**: that is what TensorFlow writes for checkpoints; a Snappy-compressed table (type 1)
  raises FileFormatError.
* Block entries are prefix-compressed: varints (shared, non_shared, value_length), the key's
  non-shared tail, then the value; the block ends with uint32 restart offsets and their count.
* The entry under the empty key is a ``BundleHeaderProto`` (num_shards, endianness, version);
  every other entry is a ``BundleEntryProto`` (dtype, shape, shard_id, offset, size, crc32c,
  slices) whose bytes live in shard ``PREFIX.data-{shard:05d}-of-{num_shards:05d}``, checked
  against the masked CRC-32C in the entry.

Partitioned (sliced) variables and string tensors are listed by :func:`read_index` but cannot be
read. Public API: :func:`resolve_prefix`, :func:`read_index`, :func:`read_checkpoint`, :func:`convert`.
"""

from __future__ import annotations

import math
import os
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xmesh.errors import ChecksumError, FileFormatError, InputError, MissingFileError
from xmesh.io.atomic import atomic_output
from xmesh.io.crc32c import crc32c, unmask

__all__ = ["TensorInfo", "resolve_prefix", "read_index", "read_checkpoint", "convert"]

_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_LEN = 48
_BLOCK_TRAILER_LEN = 5

# TensorFlow DataType enum -> NumPy dtype (little-endian; byte order fixed up from the header).
_DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<f4"),  # DT_FLOAT
    2: np.dtype("<f8"),  # DT_DOUBLE
    3: np.dtype("<i4"),  # DT_INT32
    4: np.dtype("u1"),  # DT_UINT8
    5: np.dtype("<i2"),  # DT_INT16
    6: np.dtype("i1"),  # DT_INT8
    8: np.dtype("<c8"),  # DT_COMPLEX64
    9: np.dtype("<i8"),  # DT_INT64
    10: np.dtype("?"),  # DT_BOOL
    17: np.dtype("<u2"),  # DT_UINT16
    18: np.dtype("<c16"),  # DT_COMPLEX128
    19: np.dtype("<f2"),  # DT_HALF
    22: np.dtype("<u4"),  # DT_UINT32
    23: np.dtype("<u8"),  # DT_UINT64
}
_DTYPE_NAMES = {7: "DT_STRING", 14: "DT_BFLOAT16", 20: "DT_RESOURCE", 21: "DT_VARIANT"}


@dataclass(frozen=True)
class TensorInfo:
    """Where one variable lives: NumPy dtype, shape, shard number, byte offset/size, unmasked CRC-32C.

    ``dtype`` is None for TensorFlow types NumPy cannot hold (strings, bfloat16, ...); ``sliced``
    is True for partitioned variables. Neither kind can be read by :func:`read_checkpoint`.
    """

    dtype: np.dtype | None
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc: int
    sliced: bool = False
    tf_dtype: int = 1


# --------------------------------------------------------------------------- protobuf wire format


def _varint(buf: bytes, pos: int, where: str) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise FileFormatError(f"{where}: truncated varint (data ends at byte {len(buf)})")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise FileFormatError(f"{where}: malformed varint longer than 10 bytes at byte {pos}")


def _proto_fields(buf: bytes, where: str) -> list[tuple[int, int | bytes]]:
    """Decode one protobuf message into (field number, value): ints for varint/fixed, bytes for length-delimited."""
    fields: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos, where)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise FileFormatError(f"{where}: invalid protobuf field number 0 at byte {pos}")
        if wire == 0:
            value, pos = _varint(buf, pos, where)
        elif wire == 1 or wire == 5:
            width = 8 if wire == 1 else 4
            if pos + width > len(buf):
                raise FileFormatError(f"{where}: truncated fixed{width * 8} field {number}")
            value = int.from_bytes(buf[pos : pos + width], "little")
            pos += width
        elif wire == 2:
            length, pos = _varint(buf, pos, where)
            if pos + length > len(buf):
                raise FileFormatError(f"{where}: field {number} claims {length} bytes but only {len(buf) - pos} remain")
            value = bytes(buf[pos : pos + length])
            pos += length
        else:
            raise FileFormatError(f"{where}: unsupported protobuf wire type {wire} (field {number})")
        fields.append((number, value))
    return fields


def _typed(value: int | bytes, want: type, where: str, field: str) -> int | bytes:
    """A field's value, checked to have the wire type its schema says (a number or a length-delimited blob)."""
    if not isinstance(value, want):
        kind = "a number" if want is int else "a nested message"
        raise FileFormatError(f"{where}: field {field} has the wrong protobuf wire type; expected {kind}")
    return value


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _parse_shape(buf: bytes, where: str) -> tuple[int, ...]:
    dims = []
    for number, value in _proto_fields(buf, where):
        if number == 2:  # repeated Dim {int64 size = 1; string name = 2}
            size = 0
            for dnum, dval in _proto_fields(_typed(value, bytes, where, "shape.dim"), where):
                if dnum == 1:
                    size = _signed64(_typed(dval, int, where, "shape.dim.size"))
            dims.append(size)
        elif number == 3 and value:
            raise FileFormatError(f"{where}: tensor shape has unknown rank; a stored tensor needs a full shape")
    return tuple(dims)


# --------------------------------------------------------------------------- SSTable


def _read_block(data: bytes, offset: int, size: int, path: Path, what: str) -> bytes:
    end = offset + size + _BLOCK_TRAILER_LEN
    if offset < 0 or size < 0 or end > len(data) - _FOOTER_LEN:
        raise FileFormatError(
            f"{path}: {what} block at byte {offset} (size {size}) runs past the end of the table "
            f"({len(data)} bytes); the index file is truncated or not a TensorFlow checkpoint index"
        )
    block = data[offset : offset + size]
    ctype = data[offset + size]
    stored = int.from_bytes(data[offset + size + 1 : end], "little")
    if unmask(stored) != crc32c(data[offset : offset + size + 1]):
        raise ChecksumError(
            f"{path}: CRC-32C mismatch in the {what} block at byte {offset} (size {size}): "
            f"the index file is corrupt; expected an intact TensorFlow checkpoint index"
        )
    if ctype != 0:
        kind = {1: "Snappy", 2: "zlib"}.get(ctype, "unknown")
        raise FileFormatError(
            f"{path}: {what} block at byte {offset} uses compression type {ctype} ({kind}); "
            f"xmesh reads only uncompressed tables (type 0), which is what TensorFlow writes for checkpoints"
        )
    return block


def _block_entries(block: bytes, path: Path, what: str) -> Iterable[tuple[bytes, bytes]]:
    where = f"{path}: {what} block"
    if len(block) < 4:
        raise FileFormatError(f"{where} is {len(block)} bytes, shorter than its 4-byte restart count")
    (num_restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    limit = len(block) - 4 - 4 * num_restarts
    if limit < 0:
        raise FileFormatError(f"{where} claims {num_restarts} restart points, more than its {len(block)} bytes hold")
    pos = 0
    key = b""
    while pos < limit:
        shared, pos = _varint(block, pos, where)
        non_shared, pos = _varint(block, pos, where)
        vlen, pos = _varint(block, pos, where)
        if shared > len(key) or pos + non_shared + vlen > limit:
            raise FileFormatError(f"{where}: malformed entry at byte {pos} (bad key prefix or length)")
        key = key[:shared] + block[pos : pos + non_shared]
        pos += non_shared
        yield key, block[pos : pos + vlen]
        pos += vlen


def _table_entries(path: Path) -> list[tuple[bytes, bytes]]:
    data = path.read_bytes()
    if len(data) < _FOOTER_LEN:
        raise FileFormatError(
            f"{path}: {len(data)} bytes is too short for a TensorFlow checkpoint index "
            f"(expected a LevelDB table with a {_FOOTER_LEN}-byte footer)"
        )
    footer = data[-_FOOTER_LEN:]
    magic = int.from_bytes(footer[-8:], "little")
    if magic != _TABLE_MAGIC:
        raise FileFormatError(
            f"{path}: table magic is {magic:#018x}, expected {_TABLE_MAGIC:#018x}: "
            f"not a TensorFlow V2 checkpoint .index file (or it is truncated)"
        )
    where = f"{path}: footer"
    _meta_off, pos = _varint(footer, 0, where)
    _meta_size, pos = _varint(footer, pos, where)
    index_off, pos = _varint(footer, pos, where)
    index_size, pos = _varint(footer, pos, where)
    if pos > _FOOTER_LEN - 8:
        raise FileFormatError(f"{where}: block handles overrun the footer")
    index_block = _read_block(data, index_off, index_size, path, "index")
    entries: list[tuple[bytes, bytes]] = []
    for _sep, handle in _block_entries(index_block, path, "index"):
        off, hpos = _varint(handle, 0, f"{path}: block handle")
        size, _ = _varint(handle, hpos, f"{path}: block handle")
        entries.extend(_block_entries(_read_block(data, off, size, path, "data"), path, "data"))
    return entries


# --------------------------------------------------------------------------- bundle


@dataclass(frozen=True)
class _Bundle:
    prefix: Path
    num_shards: int
    big_endian: bool
    tensors: dict[str, TensorInfo]

    def shard_path(self, shard: int) -> Path:
        return Path(f"{self.prefix}.data-{shard:05d}-of-{self.num_shards:05d}")


def _parse_entry(value: bytes, where: str, big_endian: bool) -> TensorInfo:
    tf_dtype, shape, shard, offset, size, crc, sliced = 0, (), 0, 0, 0, 0, False
    for number, val in _proto_fields(value, where):
        if number == 1:
            tf_dtype = _typed(val, int, where, "dtype")
        elif number == 2:
            shape = _parse_shape(_typed(val, bytes, where, "shape"), where)
        elif number == 3:
            shard = _typed(val, int, where, "shard_id")
        elif number == 4:
            offset = _signed64(_typed(val, int, where, "offset"))
        elif number == 5:
            size = _signed64(_typed(val, int, where, "size"))
        elif number == 6:
            crc = unmask(_typed(val, int, where, "crc32c"))
        elif number == 7:
            sliced = True
    dtype = _DTYPES.get(tf_dtype)
    if dtype is not None and big_endian:
        dtype = dtype.newbyteorder(">")
    if tf_dtype not in _DTYPES and tf_dtype not in _DTYPE_NAMES:
        raise FileFormatError(f"{where}: unknown TensorFlow dtype enum {tf_dtype}")
    if any(d < 0 for d in shape) or offset < 0 or size < 0:
        raise FileFormatError(f"{where}: negative shape, offset or size ({shape}, {offset}, {size})")
    return TensorInfo(dtype, shape, int(shard), offset, size, crc, sliced, int(tf_dtype))


def resolve_prefix(path: str | os.PathLike) -> Path:
    """The checkpoint prefix named by ``path``: a prefix, its ``.index`` or ``.data-*`` file, or a folder
    holding a ``checkpoint`` file (whose ``model_checkpoint_path`` is used). Raises MissingFileError."""
    p = Path(path)
    if p.is_dir():
        state = p / "checkpoint"
        if not state.is_file():
            raise MissingFileError(
                f"{p}: folder has no 'checkpoint' file; pass a checkpoint prefix (PREFIX with PREFIX.index beside it)"
            )
        match = re.search(r'^\s*model_checkpoint_path\s*:\s*"((?:[^"\\]|\\.)*)"', state.read_text(), re.M)
        if not match:
            raise FileFormatError(
                f'{state}: no model_checkpoint_path line; expected e.g. model_checkpoint_path: "model.ckpt-10"'
            )
        named = Path(re.sub(r"\\(.)", r"\1", match.group(1)))
        p = named if named.is_absolute() else p / named
    elif p.suffix == ".index":
        p = p.with_suffix("")
    else:
        m = re.fullmatch(r"(.*)\.data-\d{5}-of-\d{5}", str(p))
        if m:
            p = Path(m.group(1))
    index = Path(f"{p}.index")
    if not index.is_file():
        raise MissingFileError(f"{index}: checkpoint index not found (from {os.fspath(path)!r}); expected PREFIX.index")
    return p


def _read_bundle(path: str | os.PathLike) -> _Bundle:
    prefix = resolve_prefix(path)
    index = Path(f"{prefix}.index")
    entries = _table_entries(index)
    if not entries or entries[0][0] != b"":
        raise FileFormatError(f"{index}: no bundle header (entry with the empty key); not a TensorFlow V2 checkpoint")
    num_shards, big_endian = 1, False
    for number, val in _proto_fields(entries[0][1], f"{index}: bundle header"):
        if number == 1:
            num_shards = _typed(val, int, f"{index}: bundle header", "num_shards")
        elif number == 2:
            big_endian = _typed(val, int, f"{index}: bundle header", "endianness") == 1
    if num_shards < 1:
        raise FileFormatError(f"{index}: bundle header says {num_shards} shards; expected at least 1")
    tensors: dict[str, TensorInfo] = {}
    for key, value in entries[1:]:
        if key.startswith(b"\x00"):  # encoded slice keys of partitioned variables
            continue
        try:
            name = key.decode("utf-8")
        except UnicodeDecodeError:
            raise FileFormatError(f"{index}: variable name {key!r} is not UTF-8") from None
        info = _parse_entry(value, f"{index}: entry {name!r}", big_endian)
        if info.shard >= num_shards and not info.sliced:
            raise FileFormatError(f"{index}: {name!r} is in shard {info.shard} but the header says {num_shards} shards")
        tensors[name] = info
    return _Bundle(prefix, int(num_shards), big_endian, tensors)


def read_index(path: str | os.PathLike) -> dict[str, TensorInfo]:
    """Variable name -> :class:`TensorInfo` for the checkpoint named by ``path`` (prefix, ``.index`` or folder)."""
    return _read_bundle(path).tensors


def read_checkpoint(path: str | os.PathLike, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Read variables (all, or ``names`` as stored, e.g. ``meshnet/cnn/conv2d_1/W:0``) into NumPy arrays.

    Every tensor's bytes are checked against its CRC-32C (ChecksumError names variable and shard).
    """
    bundle = _read_bundle(path)
    if names is None:
        wanted = list(bundle.tensors)
    else:
        wanted = [names] if isinstance(names, str) else list(names)
        unknown = [n for n in wanted if n not in bundle.tensors]
        if unknown:
            raise InputError(
                f"names: {len(unknown)} not in checkpoint {bundle.prefix}: {unknown[:10]}"
                f"{' ...' if len(unknown) > 10 else ''}; it holds {len(bundle.tensors)} variables, "
                f"e.g. {list(bundle.tensors)[:3]}"
            )
    by_shard: dict[int, list[str]] = {}
    for name in wanted:
        info = bundle.tensors[name]
        if info.sliced:
            raise FileFormatError(
                f"{bundle.prefix}.index: {name!r} is a partitioned (sliced) variable; xmesh cannot read those"
            )
        if info.dtype is None:
            raise FileFormatError(
                f"{bundle.prefix}.index: {name!r} has dtype {_DTYPE_NAMES[info.tf_dtype]}; "
                f"xmesh reads numeric and bool tensors only"
            )
        expected = math.prod(info.shape) * info.dtype.itemsize
        if expected != info.size:
            raise FileFormatError(
                f"{bundle.prefix}.index: {name!r} has shape {info.shape} of {info.dtype} "
                f"({expected} bytes) but its entry says {info.size} bytes"
            )
        by_shard.setdefault(info.shard, []).append(name)
    out: dict[str, np.ndarray] = {}
    for shard, shard_names in sorted(by_shard.items()):
        shard_path = bundle.shard_path(shard)
        if not shard_path.is_file():
            raise MissingFileError(f"{shard_path}: checkpoint data shard not found (named by {bundle.prefix}.index)")
        actual = shard_path.stat().st_size
        need = max(bundle.tensors[n].offset + bundle.tensors[n].size for n in shard_names)
        if actual < need:
            raise FileFormatError(
                f"{shard_path}: data shard is {actual} bytes but the index needs at least {need}; the file is truncated"
            )
        with open(shard_path, "rb") as f:
            for name in shard_names:
                info = bundle.tensors[name]
                f.seek(info.offset)
                raw = f.read(info.size)
                if crc32c(raw) != info.crc:
                    raise ChecksumError(
                        f"{shard_path}: CRC-32C mismatch for variable {name!r} "
                        f"(bytes {info.offset}..{info.offset + info.size}); the data shard is corrupt"
                    )
                arr = np.frombuffer(raw, dtype=info.dtype).reshape(info.shape)
                out[name] = arr.astype(info.dtype.newbyteorder("="), copy=True)
    return {n: out[n] for n in wanted}


def convert(path: str | os.PathLike | Sequence[str | os.PathLike], out_npz: str | os.PathLike) -> Path:
    """Read every variable of a checkpoint, or of several (the official release has one per stage), and
    write them to ``out_npz`` (keys = checkpoint names), atomically. A name held by two of the
    checkpoints is refused (InputError naming it and both)."""
    out = Path(out_npz)
    if out.is_dir():
        raise InputError(f"{out}: the output .npz is a folder; expected the path of a file to write")
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    arrays: dict[str, np.ndarray] = {}
    source: dict[str, str] = {}
    for one in paths:
        for name, array in read_checkpoint(one).items():
            if name in arrays:
                raise InputError(
                    f"{os.fspath(one)}: variable {name!r} is also in {source[name]}; expected checkpoints "
                    "with different variables (such as the official meshnetmvp2m and meshnet ones)"
                )
            arrays[name], source[name] = array, os.fspath(one)
    with atomic_output(out, "wb", "output .npz") as handle:
        np.savez(handle, **arrays)
    return out
