"""How far two runs of the network may differ, and the one check of it.

../shared/golden/README.md: float32 everywhere, and the projection casts pixel positions to integers
(stage 1) and takes floor/ceil (stage 2), so a last-bit difference can move one sample to the
neighbouring pixel; all but a handful of vertices lie within 1e-5. Two code paths of xmesh itself
(a batch and a lone sample, one BLAS thread or two, the server and the command line, a GPU and the
CPU) round their float32 products differently in the same way, so they are compared within these
tolerances, never bit for bit."""

from __future__ import annotations

import numpy as np

# golden/README.md's 1e-5; "a handful" as tests/test_golden.py allows the stage-2 outliers: 0.5% of
# the vertices, 12 of the 2466 (a batch of three against lone samples moves about 6 of them past 1e-5).
VERTEX_ATOL = 1e-5
VERTEX_MAX_FRACTION = 0.005
# A GPU against the NumPy backend, end to end (tests/test_cupy_backend.py): cuDNN and cuBLAS sum in
# other orders, and a 1e-6 change of a stage-1 coordinate can change the pixel it reads.
GPU_ATOL = 1e-4
GPU_MAX_FRACTION = 0.01


def assert_mostly_within(
    got, want, atol: float = VERTEX_ATOL, fraction: float = VERTEX_MAX_FRACTION, label=None
) -> None:
    """At most ``fraction`` of the vertices (rows of the last axis, over any leading axes) of ``got``
    differ from ``want`` by more than ``atol`` in a coordinate; the shapes agree and all are finite."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (label, got.shape, want.shape)
    assert np.isfinite(got).all(), (label, "not finite")
    error = np.abs(got.astype(np.float64) - want.astype(np.float64)).max(axis=-1)
    beyond = float((error > atol).mean())
    assert beyond <= fraction, (label, f"{beyond:.2%} of the vertices beyond {atol}", float(error.max()))


def assert_same_mesh(got, want, atol: float = VERTEX_ATOL, fraction: float = VERTEX_MAX_FRACTION, label=None) -> None:
    """The same faces (integers: exactly) and vertices within ``assert_mostly_within``'s tolerance."""
    np.testing.assert_array_equal(got.faces, want.faces)
    assert_mostly_within(got.vertices, want.vertices, atol, fraction, label)
