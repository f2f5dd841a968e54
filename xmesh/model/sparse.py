"""Sparse products and scatter-adds for the training passes, on NumPy (SciPy) or CuPy (cupyx).

A backward pass sums gradients into gathered rows. ``np.add.at`` exists on NumPy only, so the sum
is a sparse product there (a deterministic row loop in SciPy) and ``cupy.add.at`` on CuPy.
The array library is read from ``xp`` (array-api-compat's namespace), the dtype from the arrays,
so float32 and float64 take the same path.
"""

from __future__ import annotations

from array_api_compat import is_cupy_namespace


def scatter_add(xp, index, values, size: int):
    """Rows ``values[i]`` summed into row ``index[i]`` of a zero (size, ...) array: the backward of
    ``xp.take(x, index, axis=0)`` for a 1-D ``index`` of len(values)."""
    tail = tuple(values.shape[1:])
    flat = xp.reshape(values, (values.shape[0], -1))
    if is_cupy_namespace(xp):
        import cupy

        out = xp.zeros((size, flat.shape[1]), dtype=values.dtype)
        cupy.add.at(out, index, flat)
        return xp.reshape(out, (size,) + tail)
    import numpy as np
    import scipy.sparse

    n = int(index.shape[0])
    rows = scipy.sparse.csr_matrix((np.ones(n, dtype=values.dtype), (np.asarray(index), np.arange(n))), shape=(size, n))
    return xp.reshape(xp.asarray(rows @ np.asarray(flat)), (size,) + tail)


def sparse_matrix(xp, host_matrix, dtype):
    """A host SciPy sparse matrix as ``xp``'s CSR matrix of ``dtype`` (SciPy or cupyx)."""
    import scipy.sparse

    csr = scipy.sparse.csr_matrix(host_matrix, dtype=dtype)
    if is_cupy_namespace(xp):
        import cupyx.scipy.sparse

        return cupyx.scipy.sparse.csr_matrix(csr)
    return csr


def sparse_product(xp, matrix, x):
    """``matrix @ x[b]`` for every sample of a batched (B,N,C) ``x``, as one product of (N, B*C)."""
    batch, n, c = x.shape
    if batch == 1:
        return xp.reshape(xp.asarray(matrix @ x[0]), (1, matrix.shape[0], c))
    columns = xp.reshape(xp.permute_dims(x, (1, 0, 2)), (n, batch * c))
    out = xp.reshape(xp.asarray(matrix @ columns), (matrix.shape[0], batch, c))
    return xp.permute_dims(out, (1, 0, 2))


def scatter_add_rows(xp, index, values, size: int):
    """The backward of ``xp.take(x, index, axis=1)`` for batched x (B,size,C) and a 1-D ``index``:
    the rows of ``values`` (B,len(index),C) summed into a zero (B,size,C)."""
    batch, k, c = values.shape
    columns = xp.reshape(xp.permute_dims(values, (1, 0, 2)), (k, batch * c))
    out = xp.reshape(scatter_add(xp, index, columns, size), (size, batch, c))
    return xp.permute_dims(out, (1, 0, 2))
