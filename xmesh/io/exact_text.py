"""float32 coordinates as ``'%.18e'`` text, the format ``np.savetxt`` writes by default, in compiled code.

Python formats a float as '%.18e' with exact arithmetic at about 0.5 us a number, which makes the
text of a predicted mesh (7,398 numbers) cost 4 ms; written for every sample of a test set, that
bounds the whole evaluation. A float32 value is M * 2**E with M < 2**24, so its 19 significant
digits are round(M * 10**k / 2**-E) for k = 18 - floor(log10(v)): for |v| in [1e-12, 2**23)
the product fits in 128 bits, here two 64-bit words. The result is rounded half to even on the
exact value, as C's printf and Python do; any value outside that range (and NaN, infinity) is
formatted by Python instead. The output is byte for byte what ``'%.18e %.18e %.18e\\n' % row`` gives.
"""
from __future__ import annotations

import numba
import numpy as np

_MASK32 = (1 << 32) - 1
_POW10 = [10 ** k for k in range(32)]  # 2**24 * 10**31 < 2**128
POW10_HI = np.array([p >> 64 for p in _POW10], dtype=np.uint64)
POW10_LO = np.array([p & ((1 << 64) - 1) for p in _POW10], dtype=np.uint64)
_TEN18 = np.uint64(10 ** 18)
_TEN19 = np.uint64(10 ** 19)
ROW_BYTES = 3 * 25 + 3 + 1  # at most: '-d.dddddddddddddddddde-xx' three times, two spaces, a newline


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
def _digits(mant, exp2, k, pow_hi, pow_lo):
    """(fits, q): q = round(mant * 10**k * 2**exp2) for exp2 < 0, half to even; fits is False when
    the quotient before rounding has 20 digits or more (k was one too high)."""
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
    if q_hi != np.uint64(0) or q_lo >= _TEN19:
        return False, np.uint64(0)
    q = q_lo
    if rem_hi > half_hi or (rem_hi == half_hi and rem_lo > half_lo):
        q += one
    elif rem_hi == half_hi and rem_lo == half_lo and (q & one) == one:
        q += one
    return True, q


@numba.njit(cache=True)
def _format_one(word, out, pos, pow_hi, pow_lo):
    """Write '%.18e' of the float32 with bits ``word`` at out[pos:]; the new position, or -1 when
    Python must do it."""
    bits = np.int64(word)
    negative = bits >> 31
    biased = (bits >> 23) & 0xFF
    frac = bits & 0x7FFFFF
    if biased == 255:
        return -1
    if biased == 0:
        mant, exp2 = frac, -149
    else:
        mant, exp2 = frac | 0x800000, biased - 150
    if negative:
        out[pos] = 45  # '-'
        pos += 1
    if mant == 0:
        out[pos] = 48
        out[pos + 1] = 46
        for j in range(18):
            out[pos + 2 + j] = 48
        out[pos + 20] = 101
        out[pos + 21] = 43
        out[pos + 22] = 48
        out[pos + 23] = 48
        return pos + 24
    value = np.float64(mant) * 2.0 ** exp2
    if value < 1e-12 or exp2 >= 0:
        return -1
    e10 = np.int64(np.floor(np.log10(value)))
    found = False
    q = np.uint64(0)
    for _ in range(3):  # log10 may be one off near a power of ten: correct it
        k = 18 - e10
        if k < 0 or k > 31:
            return -1
        fits, q = _digits(mant, exp2, k, pow_hi, pow_lo)
        if not fits:
            e10 += 1
        elif q < _TEN18:
            e10 -= 1
        else:
            found = True
            break
    if not found:
        return -1
    if q == _TEN19:  # rounding carried into a 20th digit
        q = _TEN18
        e10 += 1
    ten = np.uint64(10)
    for j in range(18, -1, -1):  # d.dddddddddddddddddd
        out[pos + (j + 1 if j > 0 else 0)] = np.uint8(48 + (q % ten))
        q //= ten
    out[pos + 1] = 46  # '.'
    pos += 20
    out[pos] = 101  # 'e'
    exponent = e10
    out[pos + 1] = 45 if exponent < 0 else 43
    if exponent < 0:
        exponent = -exponent
    pos += 2
    if exponent >= 100:
        out[pos] = 48 + exponent // 100
        pos += 1
        exponent %= 100
    out[pos] = 48 + exponent // 10
    out[pos + 1] = 48 + exponent % 10
    return pos + 2


@numba.njit(cache=True)
def _format_rows(words, out, pow_hi, pow_lo, failed):
    pos = 0
    for i in range(words.shape[0]):
        for j in range(3):
            start = pos
            pos = _format_one(words[i, j], out, pos, pow_hi, pow_lo)
            if pos < 0:
                failed[0] = i
                return start
            out[pos] = 32 if j < 2 else 10
            pos += 1
    return pos


def savetxt_text(vertices: np.ndarray) -> str:
    """``'%.18e %.18e %.18e\\n'`` of each row of float32 (N, 3) ``vertices``, as np.savetxt writes."""
    values = np.ascontiguousarray(vertices, dtype=np.float32)
    out = np.empty(len(values) * ROW_BYTES, dtype=np.uint8)
    failed = np.array([-1], dtype=np.int64)
    end = _format_rows(values.view(np.uint32), out, POW10_HI, POW10_LO, failed)
    head = out[:end].tobytes().decode("ascii")
    if failed[0] < 0:
        return head
    rest = values[failed[0]:]
    # a value the compiled path leaves to Python: that row and the rest in Python
    row_start = head.rfind("\n") + 1
    return head[:row_start] + ("%.18e %.18e %.18e\n" * len(rest)) % tuple(rest.astype(np.float64).ravel().tolist())
