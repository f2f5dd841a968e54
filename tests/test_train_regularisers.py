"""The CNN's L2 regulariser (xmesh/train/regularisers.py) against float64, on NumPy and CuPy, and the
replayed step's two-launch table of it (xmesh/train/regularisers_cupy.py) against the array-API one."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import requires_cuda
from gradcheck import namespace, namespaces
from xmesh.io.weights import synthetic_weights
from xmesh.train import regularisers as reg


@pytest.fixture(scope="module")
def kernels():
    """The stage-2 CNN's 18 kernels of the synthetic weights, float32 (12.8 million values)."""
    return {name: np.asarray(v, np.float32) for name, v in reg.cnn_kernels(synthetic_weights(1), 2).items()}


def exact_penalty(kernels: dict) -> float:
    return reg.CNN_FACTOR / 2 * sum(float(np.sum(v.astype(np.float64) ** 2)) for v in kernels.values())


def assert_gradients_are_the_factor_times_the_kernels(grads: dict, kernels: dict) -> None:
    """Each gradient is ``factor * W`` rounded once to float32: within half an ulp of the float64 product."""
    assert list(grads) == list(kernels)
    for name, value in kernels.items():
        got = np.asarray(grads[name].get() if hasattr(grads[name], "get") else grads[name])
        assert got.shape == value.shape and got.dtype == np.float32, name
        exact = np.float64(np.float32(reg.CNN_FACTOR)) * value.astype(np.float64)
        assert np.all(np.abs(got - exact) <= 0.5 * np.spacing(np.abs(got).astype(np.float32))), name


@pytest.mark.parametrize("name", namespaces())
def test_the_cnn_regulariser_is_the_float64_one(kernels, name):
    xp = namespace(name)
    loss, grads = reg.l2_penalty(xp, {n: xp.asarray(v) for n, v in kernels.items()}, reg.CNN_FACTOR)
    assert abs(float(loss) - exact_penalty(kernels)) <= 1e-5 * exact_penalty(kernels)
    assert_gradients_are_the_factor_times_the_kernels(grads, kernels)


@requires_cuda
@pytest.mark.gpu
def test_the_table_penalty_is_the_float64_one_in_two_launches(kernels):
    """The table's loss within float32 summation error of the float64 sum (its blocks add in another
    order than the array-API sums), its gradients the one rounding of each product, and the variables
    unchanged; a second call on the same table takes new values of the same arrays."""
    from xmesh.train.regularisers_cupy import L2Table

    xp = namespace("cupy")
    variables = {n: xp.asarray(v) for n, v in kernels.items()}
    table = L2Table(xp, variables)
    loss, grads = table.penalty(reg.CNN_FACTOR)
    exact = exact_penalty(kernels)
    assert abs(float(loss) - exact) <= 1e-5 * exact
    assert_gradients_are_the_factor_times_the_kernels(grads, kernels)
    for n, v in kernels.items():
        np.testing.assert_array_equal(variables[n].get(), v)
    doubled = {n: 2 * v for n, v in kernels.items()}
    for n, v in doubled.items():
        variables[n][...] = xp.asarray(v)
    loss, grads = table.penalty(reg.CNN_FACTOR)
    assert abs(float(loss) - 4 * exact) <= 4e-5 * exact
    assert_gradients_are_the_factor_times_the_kernels(grads, doubled)
