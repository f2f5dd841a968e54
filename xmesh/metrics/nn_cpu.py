"""Nearest neighbours on the CPU with SciPy's k-d tree (exact, float64)."""

from __future__ import annotations

import numpy as np


def nearest_index(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Index into ``b`` of the nearest point for each row of ``a``.

    ``a`` (N,3) and ``b`` (M,3) are validated float64 host arrays. The tree is built and queried in
    float64, so the returned index is a true nearest neighbour (among exact ties, any one of them).
    Returns int64 (N,).
    """
    from scipy.spatial import cKDTree  # imported at first use: a tenth of a second, not needed on the GPU

    tree = cKDTree(b)
    _, index = tree.query(a, k=1, workers=-1)
    return np.asarray(index, dtype=np.int64)
