"""cuBLAS called directly (xmesh/backends/cublas_gemm.py): ``a @ b`` for every operand layout the training
passes give it, against float64 products, and inside a captured CUDA Graph, which CuPy's matmul refuses."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import requires_cuda

pytestmark = [requires_cuda, pytest.mark.gpu]


@pytest.fixture(scope="module")
def blas():
    from xmesh.backends.cublas_gemm import CublasGemm, load_library

    library = load_library()
    assert library is not None, "CuPy's cuBLAS could not be loaded through ctypes"
    return CublasGemm(library)


def _operand(cupy, rng, shape, layout, dtype):
    """A CuPy array of ``shape`` laid out as asked: "c" C-order, "t" a transposed view, "p" the last
    two axes of a (.., cols, rows) array swapped (the hypothesis update's permuted weights)."""
    if layout == "c":
        host = rng.standard_normal(shape).astype(dtype)
        return host, cupy.asarray(host)
    swapped = shape[:-2] + (shape[-1], shape[-2])
    host = rng.standard_normal(swapped).astype(dtype)
    return np.swapaxes(host, -1, -2), cupy.swapaxes(cupy.asarray(host), -1, -2)


@pytest.mark.parametrize(
    "a_shape, a_layout, b_shape, b_layout",
    [
        ((300, 40), "c", (40, 17), "c"),  # a plain product
        ((40, 300), "t", (300, 17), "c"),  # a transposed view (a weight's gradient X^T dY)
        ((300, 17), "c", (17, 40), "t"),  # dY W^T
        ((1, 5000), "c", (5000, 64), "c"),  # a row of ones: a bias's gradient
        ((2, 150, 43), "p", (43, 3), "c"),  # the hypothesis update (B,N,K) @ (K,3)
        ((2, 150, 3), "c", (3, 43), "t"),  # its backward (B,N,3) @ (3,K)
        ((43, 43), "c", (2, 43, 600), "c"),  # a support over the hypothesis axis, broadcast
        ((3, 700, 3), "c", (3, 3, 3), "t"),  # the projection's backward, one 3x3 per sample
        ((2, 1, 50, 8), "c", (3, 8, 5), "c"),  # broadcast leading axes
        ((7, 0), "c", (0, 4), "c"),  # K = 0: zeros
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_products_match_float64(blas, a_shape, a_layout, b_shape, b_layout, dtype):
    import cupy

    rng = np.random.default_rng(3)
    a, da = _operand(cupy, rng, a_shape, a_layout, dtype)
    b, db = _operand(cupy, rng, b_shape, b_layout, dtype)
    ours = blas.matmul(da, db)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert ours.shape == exact.shape and ours.dtype == dtype
    bound = (1e-5 if dtype == np.float32 else 1e-12) * max(np.abs(exact).max(initial=0.0), 1.0)
    np.testing.assert_allclose(cupy.asnumpy(ours), exact, rtol=0, atol=bound * np.sqrt(a_shape[-1] + 1))


def test_other_operands_are_declined(blas):
    import cupy

    x = cupy.ones((4, 4), dtype=cupy.float16)
    assert blas.matmul(x, x) is None
    assert blas.matmul(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32)) is None
    assert blas.matmul(cupy.ones(4, dtype=cupy.float32), cupy.ones((4, 2), dtype=cupy.float32)) is None


def test_a_captured_graph_replays_the_products_on_new_inputs(blas):
    import cupy

    from xmesh.backends import get_backend

    backend = get_backend("cupy")
    rng = np.random.default_rng(5)
    a = cupy.asarray(rng.standard_normal((2, 300, 43)).astype(np.float32))
    b = cupy.asarray(rng.standard_normal((43, 9)).astype(np.float32))

    def products():
        return blas.matmul(blas.matmul(a, b), cupy.ones((9, 4), dtype=cupy.float32))

    graph = backend.capture(products)
    for _ in range(2):
        a[...] = cupy.asarray(rng.standard_normal(a.shape).astype(np.float32))
        out = graph.replay(synchronize=True)
        exact = (cupy.asnumpy(a).astype(np.float64) @ cupy.asnumpy(b)) @ np.ones((9, 4))
        np.testing.assert_allclose(cupy.asnumpy(out), exact, rtol=1e-4, atol=1e-4)
