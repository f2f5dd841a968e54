"""float32 coordinates as ``'%.18e'`` text (``np.savetxt``'s default) and ``'%.9g'`` text (OBJ vertex
lines, :meth:`xmesh.mesh.Mesh.to_obj`), in compiled code.

Python formats a float as '%.18e' with exact arithmetic at about 0.5 us a number, which makes the
text of a predicted mesh (7,398 numbers) cost 4 ms; written for every sample of a test set, that
bounds the whole evaluation. A float32 value is M * 2**E with M < 2**24, so its P significant
digits are round(M * 10**k / 2**-E) for k = P - 1 - floor(log10(v)): for ``|v|`` in [1e-12, 2**23)
the product fits in 128 bits, here two 64-bit words. The result is rounded half to even on the
exact value, as C's printf and Python do; any value outside that range (and NaN, infinity) is
formatted by Python instead. The output is byte for byte what Python's ``%`` gives.
"""

from __future__ import annotations

import numba
import numpy as np

_MASK32 = (1 << 32) - 1
_POW10 = [10**k for k in range(32)]  # 2**24 * 10**31 < 2**128
POW10_HI = np.array([p >> 64 for p in _POW10], dtype=np.uint64)
POW10_LO = np.array([p & ((1 << 64) - 1) for p in _POW10], dtype=np.uint64)
POW10_U64 = np.array([10**k for k in range(20)], dtype=np.uint64)
FIELD_BYTES = 27  # at most: '-d.dddddddddddddddddde-xxx' and a space or a newline


@numba.njit(cache=True)
def _mul_small(hi, lo, m):
    """(hi, lo) * m for m < 2**32, as (hi, lo) (the caller keeps the product under 2**128)."""
    m = np.uint64(m)
    mask = np.uint64(0xFFFFFFFF)
    l0 = (lo & mask) * m
    l1 = (lo >> np.uint64(32)) * m + (l0 >> np.uint64(32))
    new_lo = (l0 & mask) | ((l1 & mask) << np.uint64(32))
    new_hi = hi * m + (l1 >> np.uint64(32))
    return new_hi, new_lo


@numba.njit(cache=True)
def _digits(mant, exp2, k, pow_hi, pow_lo, limit):
    """(fits, q): q = round(mant * 10**k * 2**exp2) for exp2 < 0, half to even; fits is False when
    the quotient before rounding is ``limit`` or more (k was one too high)."""
    hi, lo = _mul_small(pow_hi[k], pow_lo[k], mant)
    s = -exp2
    one = np.uint64(1)
    if s >= 128:
        return False, np.uint64(0)
    if s >= 64:
        q_hi = np.uint64(0)
        q_lo = hi >> np.uint64(s - 64)
        rem_hi = hi & ((one << np.uint64(s - 64)) - one)
        rem_lo = lo
        if s > 64:
            half_hi, half_lo = one << np.uint64(s - 65), np.uint64(0)
        else:
            half_hi, half_lo = np.uint64(0), one << np.uint64(63)
    else:
        q_hi = hi >> np.uint64(s)
        q_lo = (lo >> np.uint64(s)) | (hi << np.uint64(64 - s))
        rem_hi = np.uint64(0)
        rem_lo = lo & ((one << np.uint64(s)) - one)
        half_hi, half_lo = np.uint64(0), one << np.uint64(s - 1)
    if q_hi != np.uint64(0) or q_lo >= limit:
        return False, np.uint64(0)
    q = q_lo
    if rem_hi > half_hi or (rem_hi == half_hi and rem_lo > half_lo):
        q += one
    elif rem_hi == half_hi and rem_lo == half_lo and (q & one) == one:
        q += one
    return True, q


@numba.njit(cache=True)
def _decimal(word, sig, pow_hi, pow_lo, pow_u64):
    """The float32 with bits ``word`` to ``sig`` significant digits: (status, negative, q, e10) with
    value ~ q * 10**(e10 - sig + 1), 10**(sig-1) <= q < 10**sig; status 1 for zero, -1 where Python
    must format it (NaN, infinity, |v| < 1e-12 or >= 2**23), else 0."""
    bits = np.int64(word)
    negative = (bits >> 31) == 1
    biased = (bits >> 23) & 0xFF
    frac = bits & 0x7FFFFF
    if biased == 255:
        return -1, negative, np.uint64(0), 0
    if biased == 0:
        mant, exp2 = frac, -149
    else:
        mant, exp2 = frac | 0x800000, biased - 150
    if mant == 0:
        return 1, negative, np.uint64(0), 0
    value = np.float64(mant) * 2.0**exp2
    if value < 1e-12 or exp2 >= 0:
        return -1, negative, np.uint64(0), 0
    e10 = np.int64(np.floor(np.log10(value)))
    low, limit = pow_u64[sig - 1], pow_u64[sig]
    for _ in range(3):  # log10 may be one off near a power of ten: correct it
        k = sig - 1 - e10
        if k < 0 or k > 31:
            return -1, negative, np.uint64(0), 0
        fits, q = _digits(mant, exp2, k, pow_hi, pow_lo, limit)
        if not fits:
            e10 += 1
        elif q < low:
            e10 -= 1
        else:
            if q == limit:  # rounding carried into one more digit
                q = low
                e10 += 1
            return 0, negative, q, e10
    return -1, negative, np.uint64(0), 0


@numba.njit(cache=True)
def _write_exponent(out, pos, e10):
    out[pos] = 101  # 'e'
    out[pos + 1] = 45 if e10 < 0 else 43
    exponent = -e10 if e10 < 0 else e10
    pos += 2
    if exponent >= 100:
        out[pos] = 48 + exponent // 100
        pos += 1
        exponent %= 100
    out[pos] = 48 + exponent // 10
    out[pos + 1] = 48 + exponent % 10
    return pos + 2


@numba.njit(cache=True)
def _format_e18(word, out, pos, pow_hi, pow_lo, pow_u64):
    """Write '%.18e' of the float32 with bits ``word`` at out[pos:]; the new position, or -1."""
    status, negative, q, e10 = _decimal(word, 19, pow_hi, pow_lo, pow_u64)
    if status < 0:
        return -1
    if negative:
        out[pos] = 45
        pos += 1
    ten = np.uint64(10)
    for j in range(18, -1, -1):  # d.dddddddddddddddddd (zero: all zeros)
        out[pos + (j + 1 if j > 0 else 0)] = np.uint8(48 + (q % ten))
        q //= ten
    out[pos + 1] = 46  # '.'
    return _write_exponent(out, pos + 20, e10)


@numba.njit(cache=True)
def _format_g9(word, out, pos, pow_hi, pow_lo, pow_u64):
    """Write '%.9g' of the float32 with bits ``word`` at out[pos:]; the new position, or -1."""
    status, negative, q, e10 = _decimal(word, 9, pow_hi, pow_lo, pow_u64)
    if status < 0:
        return -1
    if negative:
        out[pos] = 45
        pos += 1
    if status == 1:
        out[pos] = 48
        return pos + 1
    digits = np.empty(9, dtype=np.uint8)
    ten = np.uint64(10)
    for j in range(8, -1, -1):
        digits[j] = np.uint8(48 + (q % ten))
        q //= ten
    last = 8  # '%g' drops trailing zeros of the fraction
    while last > 0 and digits[last] == 48:
        last -= 1
    if e10 < -4 or e10 >= 9:
        out[pos] = digits[0]
        pos += 1
        if last > 0:
            out[pos] = 46
            pos += 1
            for j in range(1, last + 1):
                out[pos] = digits[j]
                pos += 1
        return _write_exponent(out, pos, e10)
    if e10 >= 0:
        for j in range(e10 + 1):
            out[pos] = digits[j]
            pos += 1
        if last > e10:
            out[pos] = 46
            pos += 1
            for j in range(e10 + 1, last + 1):
                out[pos] = digits[j]
                pos += 1
        return pos
    out[pos] = 48
    out[pos + 1] = 46
    pos += 2
    for _ in range(-e10 - 1):
        out[pos] = 48
        pos += 1
    for j in range(last + 1):
        out[pos] = digits[j]
        pos += 1
    return pos


@numba.njit(cache=True)
def _format_rows(words, out, general, prefix, pow_hi, pow_lo, pow_u64, failed):
    pos = 0
    for i in range(words.shape[0]):
        for c in prefix:
            out[pos] = c
            pos += 1
        columns = words.shape[1]
        for j in range(columns):
            start = pos
            if general:
                pos = _format_g9(words[i, j], out, pos, pow_hi, pow_lo, pow_u64)
            else:
                pos = _format_e18(words[i, j], out, pos, pow_hi, pow_lo, pow_u64)
            if pos < 0:
                failed[0] = i
                return start
            out[pos] = 32 if j < columns - 1 else 10
            pos += 1
    return pos


def _rows_text(vertices: np.ndarray, general: bool, prefix: str) -> str:
    values = np.ascontiguousarray(vertices, dtype=np.float32)
    out = np.empty(len(values) * (values.shape[1] * FIELD_BYTES + len(prefix)), dtype=np.uint8)
    failed = np.array([-1], dtype=np.int64)
    end = _format_rows(
        values.view(np.uint32),
        out,
        general,
        np.frombuffer(prefix.encode("ascii"), np.uint8),
        POW10_HI,
        POW10_LO,
        POW10_U64,
        failed,
    )
    head = out[:end].tobytes().decode("ascii")
    if failed[0] < 0:
        return head
    # a value the compiled path leaves to Python: that row and the rest in Python
    rest = values[failed[0] :]
    spec = "%.9g" if general else "%.18e"
    row = prefix + " ".join([spec] * values.shape[1]) + "\n"
    return head[: head.rfind("\n") + 1] + (row * len(rest)) % tuple(rest.astype(np.float64).ravel().tolist())


def obj_vertex_text(vertices: np.ndarray) -> str:
    """``'v %.9g %.9g %.9g\n'`` of each row of float32 (N, 3) ``vertices`` (OBJ vertex lines)."""
    return _rows_text(vertices, True, "v ")


def savetxt_text(rows: np.ndarray) -> str:
    """``'%.18e'`` of each value of float32 (N, C) ``rows``, spaces between and a newline after each
    row, as ``np.savetxt`` writes them (e.g. C = 3 for vertices, 6 for points with normals)."""
    return _rows_text(rows, False, "")
