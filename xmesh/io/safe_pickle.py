"""A restricted unpickler for the data pickles of this field (templates, ground-truth points).

The official files are Python 2 pickles of NumPy arrays, tuples, lists and dicts. Unpickling them
with :mod:`pickle` would let a crafted file call any importable function. This loader resolves
only the handful of globals that NumPy arrays need; any other global is refused *before* it is
called, with :class:`~xmesh.errors.UnsafePickleError` naming the file and the global.
"""

from __future__ import annotations

import codecs
import io
import os
import pickle
import struct
from typing import Any

import numpy as np

from ..errors import FileFormatError, MissingFileError, UnsafePickleError


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    """Python 3 writes ``bytes`` into protocol-2 pickles as ``_codecs.encode(str, 'latin1')``."""
    try:
        name = codecs.lookup(encoding).name
    except (LookupError, TypeError):
        name = None
    if name not in ("iso8859-1", "latin-1", "utf-8"):
        raise UnsafePickleError(f"pickle asks for the text codec {encoding!r}; only latin-1/utf-8 are allowed")
    return codecs.encode(text, encoding)


# Arrays created without data (their bytes come later from the pickle, or never) are capped so a
# crafted shape cannot reserve memory that later validation would touch.
_MAX_EMPTY_BYTES = 1 << 30


def _empty_array(shape, dtype) -> np.ndarray:
    dtype = _dtype(dtype)
    try:
        dims = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    except (TypeError, ValueError):
        raise UnsafePickleError(f"pickle asks for an array of shape {shape!r}; expected a tuple of sizes") from None
    count = 1
    for d in dims:
        count *= max(d, 0)
    if count * max(dtype.itemsize, 1) > _MAX_EMPTY_BYTES:
        raise UnsafePickleError(
            f"pickle asks for an empty array of shape {dims} ({dtype}), more than {_MAX_EMPTY_BYTES} bytes; refused"
        )
    return np.ndarray.__new__(np.ndarray, dims, dtype)


def _ndarray(shape, dtype=float, buffer=None, offset=0, strides=None, order=None):
    """``numpy.ndarray(...)`` called by a pickle: same arguments, but no object dtype and no huge empty arrays."""
    if buffer is None:
        return _empty_array(shape, dtype)
    return np.ndarray(shape, _dtype(dtype), buffer, offset, strides, order)


def _ndarray_reconstruct(cls, shape, dtype_code):
    if cls is not np.ndarray and cls is not _ndarray:
        raise UnsafePickleError(f"pickle asks to rebuild an array of class {getattr(cls, '__name__', cls)!r}")
    return _empty_array(shape, dtype_code)


def _numpy_scalar(dtype, data=None):
    if not isinstance(dtype, np.dtype) or dtype.hasobject:
        raise UnsafePickleError("pickle asks for a NumPy scalar of an object dtype")
    return np.frombuffer(data if data is not None else b"\0" * dtype.itemsize, dtype=dtype, count=1)[0]


def _frombuffer(buf, dtype, shape, order):
    """Protocol-5 pickles of arrays: ``numpy._core.numeric._frombuffer``."""
    dtype = _dtype(dtype)
    return np.frombuffer(buf, dtype=dtype).reshape(shape, order=order).copy()


def _dtype(obj, align=False, copy=False):
    dt = np.dtype(obj, align=align, copy=copy)
    if dt.hasobject:
        raise UnsafePickleError(f"pickle asks for the object dtype {obj!r}: arrays of Python objects are refused")
    return dt


# (module, name) -> the callable or class handed to the unpickler.
_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy", "ndarray"): _ndarray,
    ("numpy", "dtype"): _dtype,
    ("numpy.core.multiarray", "_reconstruct"): _ndarray_reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _ndarray_reconstruct,
    ("numpy.core.multiarray", "scalar"): _numpy_scalar,
    ("numpy._core.multiarray", "scalar"): _numpy_scalar,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("_codecs", "encode"): _latin1_encode,
    ("__builtin__", "set"): set,
    ("builtins", "set"): set,
    ("__builtin__", "frozenset"): frozenset,
    ("builtins", "frozenset"): frozenset,
    ("collections", "OrderedDict"): dict,
}


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file, source: str):
        super().__init__(file, encoding="latin1", fix_imports=False)
        self._source = source

    def find_class(self, module: str, name: str):
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise UnsafePickleError(
                f"{self._source}: the pickle asks for '{module}.{name}', which is not a data type this loader "
                "admits (only NumPy arrays, numbers, strings, lists, tuples and dicts); nothing in it was run. "
                "If this file is yours, re-save it with plain NumPy arrays."
            ) from None

    def persistent_load(self, pid):
        raise UnsafePickleError(f"{self._source}: the pickle refers to persistent object {pid!r}; refused")


def loads(data: bytes, source: str = "<bytes>") -> Any:
    """Unpickle ``data`` admitting only NumPy arrays and plain containers; ``source`` names it in errors."""
    try:
        return _RestrictedUnpickler(io.BytesIO(data), source).load()
    except UnsafePickleError as exc:
        if str(exc).startswith(f"{source}:"):
            raise
        raise UnsafePickleError(f"{source}: {exc}; nothing in it was run") from None
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
        OverflowError,
        MemoryError,
        UnicodeError,
        RecursionError,
        struct.error,
    ) as exc:
        raise FileFormatError(
            f"{source}: not a readable data pickle ({type(exc).__name__}: {exc}); expected a Python pickle "
            "of NumPy arrays as written by the original code"
        ) from None


def load(path: str | os.PathLike, what: str = "pickle") -> Any:
    """Read and restricted-unpickle the file at ``path``; ``what`` says what it should hold, for errors."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise MissingFileError(f"{path}: no such {what} file") from None
    except IsADirectoryError:
        raise FileFormatError(f"{path}: is a folder, expected a {what} file") from None
    except OSError as exc:
        raise FileFormatError(f"{path}: cannot read the {what} file ({exc.strerror})") from None
    return loads(data, source=path)
