"""Work that may overlap: a backend's branches (a second queue, a second CUDA stream on CuPy) and the
view-by-view image upload that lets the upload of stage 2's views run beside stage 1."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import requires_cuda
from test_cupy_backend import random_cameras
from tolerance import GPU_MAX_FRACTION, VERTEX_ATOL, assert_mostly_within
from xmesh.backends import get_backend

VIEW_SETS = [(0,), (1, 2), (0, 2), (2,), (0, 1, 2)]


def images(rng, batch=3, views=3, size=9):
    return rng.uniform(0, 1, (batch, views, size, size + 2, 3)).astype(np.float32)


@pytest.mark.parametrize("views", VIEW_SETS)
def test_copy_views_into_writes_those_views_only_numpy(views):
    be = get_backend("numpy")
    host = images(np.random.default_rng(1))
    dst = np.full((9,) + host.shape[2:], np.nan, dtype=np.float32)
    be.copy_views_into(dst, host, views)
    per_sample = dst.reshape(host.shape)
    for v in range(3):
        if v in views:
            np.testing.assert_array_equal(per_sample[:, v], host[:, v])
        else:
            assert np.isnan(per_sample[:, v]).all()


def test_a_cpu_branch_runs_its_blocks_in_place_and_lets_errors_through():
    """On the CPU a branch's blocks run where they stand: what a block writes is there as the block
    ends (before any join), later blocks see it, and an error inside a block reaches the caller."""
    be = get_backend("numpy")
    x = np.zeros(4, dtype=np.float32)
    branch = be.branch()
    with branch:
        x += 1.0
    assert x.tolist() == [1.0] * 4  # done before the join
    with branch:
        y = x * 3.0
    branch.join()
    assert y.tolist() == [3.0] * 4
    with pytest.raises(ZeroDivisionError):  # __exit__ must not swallow it
        with be.branch():
            raise ZeroDivisionError("raised inside the branch")


@requires_cuda
@pytest.mark.parametrize("views", VIEW_SETS)
def test_copy_views_into_writes_those_views_only_cupy(cp, gb, views):
    rng = np.random.default_rng(2)
    host = images(rng, batch=4)
    dst = cp.full((12,) + host.shape[2:], np.nan, dtype=cp.float32)
    gb.copy_views_into(dst, host, views)
    per_sample = dst.get().reshape(host.shape)
    for v in range(3):
        if v in views:
            np.testing.assert_array_equal(per_sample[:, v], host[:, v])
        else:
            assert np.isnan(per_sample[:, v]).all()
    # a non-contiguous float64 host array is converted first
    wide = np.ascontiguousarray(images(rng, batch=4).astype(np.float64).transpose(1, 0, 2, 3, 4)).transpose(
        1, 0, 2, 3, 4
    )
    gb.copy_views_into(dst, wide, (0, 1, 2))
    np.testing.assert_array_equal(dst.get().reshape(host.shape), wide.astype(np.float32))
    with pytest.raises(ValueError, match="C-contiguous float32"):
        gb.copy_views_into(dst[:6], host, (0,))


@requires_cuda
def test_a_stream_branch_orders_its_work_with_the_main_stream(cp, gb):
    """The branch starts after what the current stream queued before it was made (a long chain of
    kernels, so a missing wait would read an unfinished x), and work after the join waits for it."""
    x = cp.zeros(1 << 24, dtype=cp.float32)
    for _ in range(40):
        x += 1.0
    branch = gb.branch()
    for _ in range(40):  # queued on the main stream after the branch was made: not waited for
        x += 0.0
    with branch:
        y = x * 2.0  # reads x as it was when the branch was made (40 everywhere)
        for _ in range(20):
            y += 1.0
    branch.join()
    z = y + 1.0
    assert branch.stream is not cp.cuda.get_current_stream()
    np.testing.assert_array_equal(z.get(), np.full(x.size, 101.0, dtype=np.float32))


@requires_cuda
def test_upload_beside_stage1_equals_a_device_input(cp):
    """Host images take the view-by-view upload (stage 2's views on the branch, beside stage 1); device
    images the plain path. Eagerly, at a batch above the graph limit, the meshes agree within the
    tolerance of two GPU runs (the upload's stream may change which algorithms cuBLAS picks)."""
    from xmesh import Reconstructor
    from xmesh.io.weights import synthetic_weights
    from xmesh.template_gen import generate_template

    rng = np.random.default_rng(5)
    host = rng.uniform(0, 1, (3, 3, 224, 224, 3)).astype(np.float32)
    cameras = random_cameras(rng, 3)
    model = Reconstructor(synthetic_weights(5), template=generate_template(), backend="cupy", graphs=False)
    from_host = [a.get() for a in model.run(host, cameras)]
    from_device = [a.get() for a in model.run(cp.asarray(host), cameras)]
    for h, d in zip(from_host, from_device):
        assert np.isfinite(h).all()
        assert_mostly_within(h, d, VERTEX_ATOL, GPU_MAX_FRACTION)
