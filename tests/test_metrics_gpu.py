"""xmesh.metrics on the GPU: the CUDA kernel and GPU FAISS against a brute-force float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

import xmesh.metrics as metrics
from conftest import requires_cuda
from test_metrics import far_from_thresholds, reference_sqdist, shape_like_pair
from xmesh.errors import InputError, KernelCompileError
from xmesh.metrics import nn_cupy, nn_faiss

pytestmark = [requires_cuda, pytest.mark.gpu]

SIZES = [(1, 1), (1, 300), (255, 257), (513, 100), (2466, 10000)]


@pytest.fixture(scope="module")
def cupy():
    import cupy

    return cupy


def second_gap(a, b):
    """Relative gap between the nearest and second-nearest squared distance of each row of ``a``."""
    d = ((a.astype(np.float64)[:, None, :] - b.astype(np.float64)[None, :, :]) ** 2).sum(axis=-1)
    d.sort(axis=1)
    return (d[:, 1] - d[:, 0]) / np.maximum(d[:, 1], 1e-300)


@pytest.mark.parametrize("n, m", SIZES, ids=lambda v: str(v))
def test_kernel_matches_reference(cupy, n, m):
    pred, gt = shape_like_pair(n, m, seed=n + 3 * m)
    ref = reference_sqdist(pred, gt)
    sqdist, index = nn_cupy.nearest(cupy.asarray(pred), cupy.asarray(gt))
    assert sqdist.dtype == cupy.float32 and index.dtype == cupy.int64 and sqdist.shape == (n,)
    sqdist, index = sqdist.get(), index.get()
    np.testing.assert_allclose(sqdist, ref, rtol=2e-6, atol=0)  # fp32 difference form
    exact = ((pred.astype(np.float64) - gt.astype(np.float64)[index]) ** 2).sum(axis=1)
    np.testing.assert_allclose(exact, ref, rtol=1e-6, atol=0)  # the index is (near-)optimal
    if m > 1:  # where the nearest point is clearly nearest, the kernel must find that very point
        clear = second_gap(pred, gt) > 1e-5
        truth = np.array([np.argmin(((gt.astype(np.float64) - p) ** 2).sum(axis=1)) for p in pred.astype(np.float64)])
        np.testing.assert_array_equal(index[clear], truth[clear])


@pytest.mark.parametrize("n, m", SIZES, ids=lambda v: str(v))
def test_cupy_backend_metrics_match_reference(cupy, n, m):
    pred, gt = shape_like_pair(n, m, seed=7 * n + m)
    d1, d2 = reference_sqdist(pred, gt), reference_sqdist(gt, pred)
    expected = d1.mean() + d2.mean()
    result = metrics.evaluate(cupy.asarray(pred), cupy.asarray(gt))  # auto -> cupy
    assert abs(result["chamfer"] - expected) <= 1e-6 * expected
    sqdist, _ = metrics.nn_distances(pred, gt, backend="cupy")
    assert isinstance(sqdist, cupy.ndarray) and sqdist.dtype == cupy.float64
    np.testing.assert_allclose(sqdist.get(), d1, rtol=1e-6, atol=0)
    if far_from_thresholds(d1, margin=1e-8) and far_from_thresholds(d2, margin=1e-8):
        cpu = metrics.f_score(pred, gt, backend="scipy")
        np.testing.assert_array_equal(list(result["fscore"].values()), cpu)


def test_kernel_batched_with_ragged_lengths(cupy):
    shapes = [(2466, 10000), (100, 7), (1, 1), (777, 4097)]
    pairs = [shape_like_pair(n, m, seed=i) for i, (n, m) in enumerate(shapes)]
    n_max, m_max = max(n for n, _ in shapes), max(m for _, m in shapes)
    a = np.full((len(pairs), n_max, 3), np.nan, dtype=np.float32)  # padding is never read
    b = np.full((len(pairs), m_max, 3), np.nan, dtype=np.float32)
    for i, (p, g) in enumerate(pairs):
        a[i, : len(p)], b[i, : len(g)] = p, g
    len_a = np.array([n for n, _ in shapes])
    len_b = np.array([m for _, m in shapes])
    sqdist, index = nn_cupy.nearest(cupy.asarray(a), cupy.asarray(b), len_a, len_b)
    sqdist, index = sqdist.get(), index.get()
    for i, (p, g) in enumerate(pairs):
        np.testing.assert_allclose(sqdist[i, : len(p)], reference_sqdist(p, g), rtol=2e-6, atol=0)
        assert np.all(sqdist[i, len(p) :] == 0) and np.all(index[i, len(p) :] == -1)
        assert index[i, : len(p)].min() >= 0 and index[i, : len(p)].max() < len(g)

    padded = metrics.chamfer_batch(cupy.asarray(a), cupy.asarray(b), len_a, len_b)  # one launch per pass
    one_by_one = np.array([metrics.chamfer(p, g, backend="scipy") for p, g in pairs])
    np.testing.assert_allclose(padded, one_by_one, rtol=1e-6, atol=0)
    listed = metrics.chamfer_batch([cupy.asarray(p) for p, _ in pairs], [cupy.asarray(g) for _, g in pairs])
    np.testing.assert_allclose(listed, one_by_one, rtol=1e-6, atol=0)  # lists of CuPy arrays: auto -> cupy


@pytest.mark.parametrize("n, m", [(3000, 6466), (300, 257), (2466, 10000)], ids=lambda v: str(v))
def test_the_reference_cloud_in_parts_finds_what_one_walk_finds(cupy, monkeypatch, n, m):
    """A few queries walk the reference cloud in parts (a training step's 3000 ground-truth points
    against 6466 predicted ones: 26 parts on an H200); the parts' merge keeps the lowest index among
    exact ties, so a duplicated reference point is found at its first copy, in an earlier part, and
    every clear nearest point is the one-walk kernel's."""
    pred, gt = shape_like_pair(n, m, seed=n + m)
    copies = np.arange(m // 2, m, 7)
    gt[copies] = gt[: len(copies)]  # exact duplicates far apart in the cloud: ties across parts
    assert nn_cupy.splits(1, n, m) > 1
    parts = [a.get() for a in nn_cupy.nearest(cupy.asarray(pred), cupy.asarray(gt))]
    monkeypatch.setattr(nn_cupy, "BLOCKS_PER_SM", 0)  # one part: the whole cloud in one walk
    assert nn_cupy.splits(1, n, m) == 1
    whole = [a.get() for a in nn_cupy.nearest(cupy.asarray(pred), cupy.asarray(gt))]
    np.testing.assert_allclose(parts[0], whole[0], rtol=2e-6, atol=0)
    np.testing.assert_allclose(parts[0], reference_sqdist(pred, gt), rtol=2e-6, atol=0)
    tied = np.isin(whole[1], np.arange(len(copies)))  # nearest to a point that has a second copy
    assert tied.any() and not np.isin(parts[1], copies).any() and not np.isin(whole[1], copies).any()
    clear = second_gap(pred, gt) > 1e-5
    np.testing.assert_array_equal(parts[1][clear], whole[1][clear])


def test_kernel_rejects_bad_inputs(cupy):
    good = cupy.zeros((4, 3), dtype=cupy.float32)
    with pytest.raises(InputError, match=r"a must be an \(N, 3\) or \(B, N, 3\) array"):
        nn_cupy.nearest(cupy.zeros((0, 3)), good)
    with pytest.raises(InputError, match="same B"):
        nn_cupy.nearest(cupy.zeros((2, 4, 3)), cupy.zeros((3, 4, 3)))
    with pytest.raises(InputError, match=r"lengths_b must lie in \[1, 4\]"):
        nn_cupy.nearest(cupy.zeros((2, 4, 3)), cupy.zeros((2, 4, 3)), lengths_b=[4, 5])
    with pytest.raises(InputError, match="apply only to padded"):
        nn_cupy.nearest(good, good, lengths_a=[4])


def test_compile_failure_names_the_kernel_and_the_log(cupy, monkeypatch):
    from xmesh.backends import cuda_kernels

    monkeypatch.setattr(
        cuda_kernels, "kernel_source", lambda filename: 'extern "C" __global__ void nn_bruteforce() { syntax error }'
    )
    monkeypatch.setenv("XMESH_KERNEL_CACHE_DIR", "")
    cuda_kernels.forget_loaded()
    try:
        with pytest.raises(
            KernelCompileError, match=r"nn_bruteforce \(nn_bruteforce.cu, options \[.*\]\) failed to compile"
        ) as info:
            nn_cupy.nearest(cupy.zeros((2, 3)), cupy.zeros((2, 3)))
        assert "error" in str(info.value)  # the compiler's log is part of the message
    finally:
        cuda_kernels.forget_loaded()


@pytest.mark.skipif(not (nn_faiss.available() and nn_faiss.gpu_available()), reason="needs a GPU build of FAISS")
def test_faiss_gpu_on_cupy_arrays(cupy):
    pred, gt = shape_like_pair(2466, 10000, seed=21)
    sqdist, index = metrics.nn_distances(cupy.asarray(pred), cupy.asarray(gt), backend="faiss")
    assert isinstance(sqdist, cupy.ndarray) and isinstance(index, cupy.ndarray)
    np.testing.assert_array_equal(sqdist.get(), reference_sqdist(pred, gt))
    expected = metrics.chamfer(pred, gt, backend="scipy")
    assert metrics.chamfer(cupy.asarray(pred), cupy.asarray(gt), backend="faiss") == pytest.approx(expected, rel=1e-12)
