"""The training passes' dense products (xmesh/model/products.py): which products a lent GEMM takes, and
the CuPy backend's lent 3xTF32 GEMM against float64 products within float32's accuracy."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import requires_cuda
from xmesh.model import products


@pytest.fixture
def recorded():
    """A lent product that records the shapes it is given and answers ``a @ b``."""
    calls = []

    def product(a, b):
        calls.append((tuple(a.shape), tuple(b.shape)))
        return a @ b

    before = products.lend(product)
    yield calls
    products.lend(before)


def test_only_large_float32_products_are_lent(recorded):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 150, 40)).astype(np.float32)
    wide = rng.standard_normal((40, 130)).astype(np.float32)
    out = products.matmul(a, wide)
    np.testing.assert_allclose(out, a @ wide, rtol=1e-5, atol=1e-5)
    assert out.shape == (2, 150, 130) and recorded == [((300, 40), (40, 130))]
    products.matmul(a, wide[:, :100])  # a narrow output
    products.matmul(a[:, :50], wide)  # few rows
    products.matmul(a.astype(np.float64), wide.astype(np.float64))  # float64 (the gradient checks)
    assert len(recorded) == 1
    products.matmul(np.ascontiguousarray(wide.T), wide)  # a (130, 40) transposed weight
    assert recorded[-1] == ((130, 40), (40, 130))


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape",
    [
        ((4000, 339), (339, 384)),
        ((2, 2150, 192), (192, 384)),
        ("T", (5000, 339), (5000, 384)),
        ("T", (9000, 192), (9000, 384)),
        ("T", (120000, 340), (120000, 384)),  # rows padded as the projection's; K split over the blocks
    ],
)
def test_the_cupy_backends_lent_product_keeps_float32_accuracy(shape):
    import cupy

    from xmesh.backends import get_backend

    get_backend("cupy")  # lends its GEMM
    rng = np.random.default_rng(1)
    transposed = shape[0] == "T"
    a_shape, b_shape = shape[1:] if transposed else shape
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    da, db = cupy.asarray(a), cupy.asarray(b)
    if a_shape[-1] == 340:  # the first 339 of 340 floats a row: 16-byte aligned rows, M not a multiple of 4
        a, da = a[:, :339], da[:, :339]
    ours = cupy.asnumpy(products.matmul(da.T if transposed else da, db))
    exact = (a.T if transposed else a).astype(np.float64) @ b.astype(np.float64)
    cublas = cupy.asnumpy((da.T if transposed else da) @ db)
    error = np.linalg.norm(ours - exact) / np.linalg.norm(exact)
    reference = np.linalg.norm(cublas - exact) / np.linalg.norm(exact)
    print(f"{shape}: products.matmul {error:.2e}, cuBLAS float32 {reference:.2e}")
    assert error <= max(4 * reference, 1e-6)
