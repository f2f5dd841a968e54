"""Write TensorFlow V2 checkpoints (``PREFIX.index`` + ``PREFIX.data-00000-of-00001``) without TensorFlow.

The files are laid out as TensorFlow's own ``BundleWriter`` lays them out, so that the original's code
(``tf.train.Saver.restore``), TensorFlow's tools and :mod:`xmesh.io.checkpoint` all read them:

* the data shard holds each tensor's raw little-endian bytes, one after another in name order, with no
  padding;
* the index is a LevelDB-format table (TensorFlow's options: no compression, 256 KiB data blocks, a
  restart point every 16 entries, one per index entry) mapping the empty key to a ``BundleHeaderProto``
  (one shard, little-endian, version 1) and each name to a ``BundleEntryProto`` (dtype, shape, offset,
  size and the masked CRC-32C of the tensor's bytes);
* a ``checkpoint`` state file beside them names the prefix, as ``tf.train.Saver`` writes it.

Each file is written atomically, the data shard first, then the index, then the state file, so an
interrupted save leaves the previous checkpoint readable. Public API: :func:`write_checkpoint`.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from xmesh.errors import InputError
from xmesh.io.atomic import atomic_output
from xmesh.io.crc32c import crc32c, mask

__all__ = ["write_checkpoint"]

_TABLE_MAGIC = 0xDB4775248B80FB57
_BLOCK_SIZE = 262144  # TensorFlow's table::Options().block_size
_RESTART_INTERVAL = 16  # table::Options().block_restart_interval (the index block uses 1)
_FOOTER_LEN = 48
_BUNDLE_VERSION = 1  # TensorFlow's kTensorBundleVersion (min consumer 0 is proto3's default)

# NumPy dtype -> TensorFlow's DataType enum, for the types a checkpoint of model weights holds.
_TF_DTYPES = {
    np.dtype(np.float32): 1,
    np.dtype(np.float64): 2,
    np.dtype(np.int32): 3,
    np.dtype(np.uint8): 4,
    np.dtype(np.int16): 5,
    np.dtype(np.int8): 6,
    np.dtype(np.int64): 9,
    np.dtype(np.bool_): 10,
    np.dtype(np.uint16): 17,
    np.dtype(np.float16): 19,
    np.dtype(np.uint32): 22,
    np.dtype(np.uint64): 23,
}


def _varint(value: int) -> bytes:
    out = bytearray()
    value = int(value)
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field_varint(number: int, value: int) -> bytes:
    """A proto3 varint field; the default 0 is left out, as protobuf serialises it."""
    return _varint(number << 3) + _varint(value) if value else b""


def _field_message(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _header_proto() -> bytes:
    version = _field_varint(1, _BUNDLE_VERSION)
    return _field_varint(1, 1) + _field_message(3, version)  # num_shards 1, endianness LITTLE (0), version


def _entry_proto(tf_dtype: int, shape: tuple[int, ...], offset: int, size: int, crc: int) -> bytes:
    shape_proto = b"".join(_field_message(2, _field_varint(1, dim)) for dim in shape)
    out = _field_varint(1, tf_dtype) + _field_message(2, shape_proto)
    out += _field_varint(4, offset) + _field_varint(5, size)
    masked = mask(crc)
    return out + (b"\x35" + struct.pack("<I", masked) if masked else b"")  # field 6, fixed32


class _BlockBuilder:
    """One LevelDB block: prefix-compressed entries, then the restart offsets and their count."""

    def __init__(self, restart_interval: int):
        self.interval = restart_interval
        self.buffer = bytearray()
        self.restarts = [0]
        self.counter = 0
        self.last_key = b""

    def empty(self) -> bool:
        return not self.buffer

    def size_estimate(self) -> int:
        return len(self.buffer) + 4 * len(self.restarts) + 4

    def add(self, key: bytes, value: bytes) -> None:
        shared = 0
        if self.counter < self.interval:
            limit = min(len(key), len(self.last_key))
            while shared < limit and key[shared] == self.last_key[shared]:
                shared += 1
        else:
            self.restarts.append(len(self.buffer))
            self.counter = 0
        self.buffer += _varint(shared) + _varint(len(key) - shared) + _varint(len(value))
        self.buffer += key[shared:] + value
        self.last_key = key
        self.counter += 1

    def finish(self) -> bytes:
        return (
            bytes(self.buffer)
            + b"".join(struct.pack("<I", r) for r in self.restarts)
            + struct.pack("<I", len(self.restarts))
        )


def _shortest_separator(start: bytes, limit: bytes) -> bytes:
    """LevelDB's bytewise FindShortestSeparator: a short key k with start <= k < limit."""
    common = 0
    while common < min(len(start), len(limit)) and start[common] == limit[common]:
        common += 1
    if common < min(len(start), len(limit)):
        byte = start[common]
        if byte < 0xFF and byte + 1 < limit[common]:
            return start[:common] + bytes([byte + 1])
    return start


def _short_successor(key: bytes) -> bytes:
    """LevelDB's bytewise FindShortSuccessor: a short key k >= key."""
    for i, byte in enumerate(key):
        if byte != 0xFF:
            return key[:i] + bytes([byte + 1])
    return key


def _table(entries: list[tuple[bytes, bytes]]) -> bytes:
    """A LevelDB table of sorted (key, value) entries, as TensorFlow's TableBuilder writes it."""
    out = bytearray()
    index = _BlockBuilder(1)
    block = _BlockBuilder(_RESTART_INTERVAL)
    pending: tuple[int, int] | None = None

    def write_block(builder: _BlockBuilder) -> tuple[int, int]:
        raw = builder.finish() + b"\x00"  # compression type: none
        handle = (len(out), len(raw) - 1)
        out.extend(raw + struct.pack("<I", mask(crc32c(raw))))
        return handle

    def handle_bytes(handle: tuple[int, int]) -> bytes:
        return _varint(handle[0]) + _varint(handle[1])

    last_key = b""
    for key, value in entries:
        if pending is not None:
            index.add(_shortest_separator(last_key, key), handle_bytes(pending))
            pending = None
        block.add(key, value)
        last_key = key
        if block.size_estimate() >= _BLOCK_SIZE:
            pending = write_block(block)
            block = _BlockBuilder(_RESTART_INTERVAL)
    if not block.empty():
        pending = write_block(block)
    meta = write_block(_BlockBuilder(_RESTART_INTERVAL))
    if pending is not None:
        index.add(_short_successor(last_key), handle_bytes(pending))
    footer = handle_bytes(meta) + handle_bytes(write_block(index))
    out.extend(footer + b"\x00" * (_FOOTER_LEN - 8 - len(footer)) + struct.pack("<Q", _TABLE_MAGIC))
    return bytes(out)


def _checked(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for name, value in arrays.items():
        if not isinstance(name, str) or not name or name.startswith("\x00"):
            raise InputError(
                f"checkpoint variable name {name!r}: expected a non-empty name such as 'meshnet/cnn/conv2d_1/W:0'"
            )
        array = np.asarray(value)
        if array.dtype.newbyteorder("=") not in _TF_DTYPES:
            raise InputError(
                f"checkpoint variable {name!r}: dtype {array.dtype} has no TensorFlow checkpoint type here; "
                f"expected one of {sorted(str(d) for d in _TF_DTYPES)}"
            )
        out[name] = np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")  # 0-d stays 0-d
    return out


def _layout(arrays: dict[str, np.ndarray]) -> tuple[list[tuple[bytes, bytes]], list[str]]:
    """The index entries (header first, then names in byte order) and the order of the data shard."""
    names = sorted(arrays, key=lambda n: n.encode("utf-8"))
    entries = [(b"", _header_proto())]
    offset = 0
    for name in names:
        array = arrays[name]
        tf_dtype = _TF_DTYPES[array.dtype.newbyteorder("=")]
        entries.append((name.encode("utf-8"), _entry_proto(tf_dtype, array.shape, offset, array.nbytes, crc32c(array))))
        offset += array.nbytes
    return entries, names


def write_checkpoint(prefix: str | os.PathLike, arrays: Mapping[str, np.ndarray], state_file: bool = True) -> Path:
    """Write ``arrays`` (name -> array, names as stored, e.g. ``meshnet/cnn/conv2d_1/W:0``) as a TF V2 checkpoint.

    Writes ``PREFIX.data-00000-of-00001`` and ``PREFIX.index``, then (``state_file``) the folder's
    ``checkpoint`` file naming this prefix, so ``tf.train.latest_checkpoint(folder)`` finds it. Returns
    the prefix.
    """
    prefix = Path(prefix)
    checked = _checked(arrays)
    entries, names = _layout(checked)
    with atomic_output(Path(f"{prefix}.data-00000-of-00001"), "wb", "checkpoint data") as handle:
        for name in names:
            handle.write(checked[name].tobytes())
    with atomic_output(Path(f"{prefix}.index"), "wb", "checkpoint index") as handle:
        handle.write(_table(entries))
    if state_file:
        quoted = prefix.name.replace("\\", "\\\\").replace('"', '\\"')
        with atomic_output(prefix.parent / "checkpoint", "w", "checkpoint state") as handle:
            handle.write(f'model_checkpoint_path: "{quoted}"\nall_model_checkpoint_paths: "{quoted}"\n')
    return prefix
