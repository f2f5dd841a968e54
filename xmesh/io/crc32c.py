"""CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) and TensorFlow's checksum masking.

TensorFlow checkpoints (and the LevelDB-style tables of their ``.index`` files) store *masked*
CRC-32C values: ``mask(crc) = rotate_right(crc, 15) + 0xa282ead8`` (mod 2**32).

The loop is table-driven slicing-by-8, compiled with numba when it imports (hundreds of MB/s);
without numba the same loop runs as plain Python, which is correct but slow (~MB/s).
"""

from __future__ import annotations

import numpy as np

__all__ = ["crc32c", "mask", "unmask", "HAVE_NUMBA"]

_POLY = 0x82F63B78
_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF


def _make_tables() -> np.ndarray:
    """Eight 256-entry tables (int64, values < 2**32): T[0] is the byte-wise table, T[k] advances k more bytes."""
    tables = np.zeros((8, 256), dtype=np.int64)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        tables[0, i] = c
    for k in range(1, 8):
        for i in range(256):
            prev = int(tables[k - 1, i])
            tables[k, i] = (prev >> 8) ^ int(tables[0, prev & 0xFF])
    return tables


_TABLES = _make_tables()


def _crc_loop(data, crc, t):
    """Continue the (already inverted) CRC state ``crc`` over ``data``; generic over numba/Python."""
    n = len(data)
    i = 0
    while i + 8 <= n:
        one = crc ^ (data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24))
        crc = (
            t[7][one & 0xFF]
            ^ t[6][(one >> 8) & 0xFF]
            ^ t[5][(one >> 16) & 0xFF]
            ^ t[4][(one >> 24) & 0xFF]
            ^ t[3][data[i + 4]]
            ^ t[2][data[i + 5]]
            ^ t[1][data[i + 6]]
            ^ t[0][data[i + 7]]
        )
        i += 8
    while i < n:
        crc = t[0][(crc ^ data[i]) & 0xFF] ^ (crc >> 8)
        i += 1
    return crc


try:  # numba is a dependency, but keep the module importable without it
    import numba

    _crc_numba = numba.njit(cache=True, nogil=True)(_crc_loop)
    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only where numba is absent
    _crc_numba = None
    HAVE_NUMBA = False

_PY_TABLES = [list(map(int, row)) for row in _TABLES]


def _as_u8(data) -> np.ndarray:
    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        return data.reshape(-1).view(np.uint8)
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(f"crc32c: data must be bytes-like or a NumPy array, not {type(data).__name__}") from None
    return np.frombuffer(view.cast("B") if view.ndim != 1 or view.format != "B" else view, dtype=np.uint8)


def crc32c(data, crc: int = 0) -> int:
    """CRC-32C of ``data`` (bytes-like or a C-contiguous array's raw bytes), continuing from ``crc``.

    ``crc32c(b + c) == crc32c(c, crc32c(b))``. Returns an int in [0, 2**32).
    """
    if not 0 <= int(crc) <= _U32:
        raise ValueError(f"crc32c: crc must be in [0, 2**32), not {crc!r}")
    state = int(crc) ^ _U32
    if _crc_numba is not None:
        state = int(_crc_numba(_as_u8(data), np.int64(state), _TABLES))
    else:
        state = _crc_loop(bytes(_as_u8(data)), state, _PY_TABLES)
    return (state ^ _U32) & _U32


def mask(crc: int) -> int:
    """TensorFlow's masked form of a CRC: rotate right by 15 bits, add 0xa282ead8 (mod 2**32)."""
    crc = int(crc) & _U32
    return ((((crc >> 15) | (crc << 17)) & _U32) + _MASK_DELTA) & _U32


def unmask(masked: int) -> int:
    """Inverse of :func:`mask`."""
    rot = (int(masked) - _MASK_DELTA) & _U32
    return ((rot >> 17) | (rot << 15)) & _U32
