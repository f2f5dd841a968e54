"""TF1's Adam (xmesh/train/adam.py): the original's first step from its own gradients, the update rule
against a float64 reference, a state that resumes bit for bit from its arrays, and on CuPy a stage's
updates in two launches (xmesh/train/adam_cupy.py) against the per-variable ones, skipped whole where
anything is not finite."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import requires_cuda
from gradcheck import namespace, namespaces
from xmesh.backends import get_backend
from xmesh.io.weights import synthetic_weights
from xmesh.train.adam import AdamConfig, AdamState, adam_step, advance, apply_updates, step_factor

xp = get_backend("numpy").xp


@pytest.mark.parametrize("prefix,stage", [("s1", 1), ("s2", 2)])
def test_first_step_from_the_originals_gradients_is_the_originals(golden_dir, prefix, stage):
    """Every variable stored whole with its first change: Adam fed the original's own gradient moves it
    as the original's Adam did, to within a float32 rounding of the variable."""
    z = np.load(golden_dir / "train_seed1.npz")
    weights = synthetic_weights(int(z["weights_seed"]), stages=stage)
    names = [str(n) for n in z[f"{prefix}_names"] if f"{prefix}_grad|{n}" in z and f"{prefix}_step1|{n}" in z]
    assert len(names) >= 30
    variables = {name: weights[name].copy() for name in names}
    adam_step(xp, variables, {name: z[f"{prefix}_grad|{name}"] for name in names}, AdamState())
    exact = 0
    for name in names:
        ours, ref = variables[name] - weights[name], z[f"{prefix}_step1|{name}"]
        assert np.all(np.abs(ours - ref) <= np.spacing(np.abs(variables[name]))), name
        exact += int(np.sum(ours == ref))
    total = sum(variables[name].size for name in names)
    print(f"{prefix}: {len(names)} variables, {exact / total:.4%} of their first changes bit for bit")
    assert exact / total >= 0.99


def reference_adam(var, grads, config: AdamConfig):
    """Kingma and Ba's Adam with TF's epsilon outside the square root, in float64."""
    var = var.astype(np.float64)
    m = np.zeros_like(var)
    v = np.zeros_like(var)
    for t, g in enumerate(grads, start=1):
        m = config.beta1 * m + (1 - config.beta1) * g
        v = config.beta2 * v + (1 - config.beta2) * g * g
        lr_t = config.learning_rate * np.sqrt(1 - config.beta2**t) / (1 - config.beta1**t)
        var = var - lr_t * m / (np.sqrt(v) + config.epsilon)
    return var


@pytest.mark.parametrize("library", namespaces())
def test_steps_follow_the_update_rule(library):
    """On NumPy and on CuPy (one kernel a variable there, each operation rounded as NumPy rounds it)."""
    xpd = namespace(library)
    rng = np.random.default_rng(0)
    config = AdamConfig(learning_rate=1e-3)
    start = rng.standard_normal(50).astype(np.float32)
    # gradients far from 0 and near epsilon's scale, where epsilon matters
    grads = [rng.standard_normal(50) * np.where(np.arange(50) < 25, 1.0, 1e-8) for _ in range(6)]
    variables = {"w": xpd.asarray(start.copy())}
    on_host = {"w": start.copy()}
    state, host_state = AdamState(config), AdamState(config)
    for g in grads:
        adam_step(xpd, variables, {"w": xpd.asarray(g.astype(np.float32))}, state)
        adam_step(xp, on_host, {"w": g.astype(np.float32)}, host_state)
    ours = np.asarray(variables["w"].get() if hasattr(variables["w"], "get") else variables["w"])
    expected = reference_adam(start, [g.astype(np.float32).astype(np.float64) for g in grads], config)
    # each step rounds the variables (about 1) to float32: a few 1e-7 over six steps of about 1e-3
    np.testing.assert_allclose(ours - start, expected - start, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(ours, on_host["w"], rtol=2e-7, atol=0)
    assert state.step == 6 and np.isclose(state.beta1_power, 0.9**7, rtol=1e-6)


def test_a_variable_without_gradient_stays():
    variables = {"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)}
    state = AdamState()
    adam_step(xp, variables, {"a": np.full(3, 0.5, np.float32)}, state)
    np.testing.assert_array_equal(variables["b"], np.ones(3, np.float32))
    assert np.all(variables["a"] < 1) and set(state.m) == {"a"}


def test_state_resumes_bit_for_bit_from_its_arrays():
    rng = np.random.default_rng(1)
    grads = [{"w": rng.standard_normal((4, 3)).astype(np.float32)} for _ in range(5)]
    start = rng.standard_normal((4, 3)).astype(np.float32)
    whole = {"w": start.copy()}
    state = AdamState()
    for g in grads:
        adam_step(xp, whole, g, state)
    resumed = {"w": start.copy()}
    first = AdamState()
    for g in grads[:3]:
        adam_step(xp, resumed, g, first)
    arrays = first.arrays()
    saved = AdamState.from_arrays({k: np.array(v, copy=True) for k, v in arrays.items()})
    for g in grads[3:]:
        adam_step(xp, resumed, g, saved)
    np.testing.assert_array_equal(resumed["w"], whole["w"])
    assert saved.step == state.step and saved.beta2_power == state.beta2_power


def _table_setup(cp, rng):
    """Three float32 variables of different sizes (one longer than a block's stretch), and gradient
    arrays that stay where they are (new values copied in; one a matrix's columns), with their table."""
    from xmesh.train.adam_cupy import AdamTable

    shapes = {"a": (3, 5), "b": (7,), "c": (70_000,)}
    start = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    variables = {name: cp.asarray(value.copy()) for name, value in start.items()}
    grads = {name: cp.zeros(shape, dtype=cp.float32) for name, shape in shapes.items()}
    grads["a"] = cp.zeros((3, 12), dtype=cp.float32)[:, 4:9]  # a matrix's columns, as a product's half
    state = AdamState(AdamConfig(learning_rate=1e-3))
    return start, variables, grads, state, AdamTable(cp, grads, variables, state)


@requires_cuda
@pytest.mark.gpu
def test_a_stage_s_updates_in_two_launches_are_the_per_variable_kernels():
    cp = namespace("cupy")
    rng = np.random.default_rng(2)
    start, variables, grads, state, table = _table_setup(cp, rng)
    theirs = {name: cp.asarray(value.copy()) for name, value in start.items()}
    their_state = AdamState(state.config)
    for _ in range(4):
        for g in grads.values():
            g[...] = cp.asarray(rng.standard_normal(g.shape).astype(np.float32) * 10.0 ** rng.integers(-8, 1))
        apply_updates(cp, theirs, grads, their_state, step_factor(their_state))
        advance(their_state)
        marks = cp.zeros(len(grads) + 1, dtype=cp.float32)
        table.mark(cp.ones(3, dtype=cp.float32), marks)
        table.update(marks, cp.asarray([step_factor(state)], dtype=cp.float32))
        advance(state)
        assert not marks.get().any()
    for name in grads:
        for ours, want in ((variables, theirs), (state.m, their_state.m), (state.v, their_state.v)):
            np.testing.assert_allclose(ours[name].get(), want[name].get(), rtol=2e-7, atol=0, err_msg=name)
        assert np.abs(variables[name].get() - start[name]).max() > 1e-4  # they moved


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("where", ["gradient", "loss"])
def test_anything_not_finite_leaves_every_variable_and_moment(where):
    """A NaN in one gradient (marked by name) or an infinite loss (marked as anything only): no update."""
    cp = namespace("cupy")
    rng = np.random.default_rng(3)
    _, variables, grads, state, table = _table_setup(cp, rng)
    for g in grads.values():
        g[...] = cp.asarray(rng.standard_normal(g.shape).astype(np.float32))
    before = {name: (variables[name].get(), state.m[name].get(), state.v[name].get()) for name in grads}
    values = cp.ones(3, dtype=cp.float32)
    if where == "gradient":
        grads["c"][65_432] = cp.nan
        grads["a"].base[1, 10] = cp.nan  # beside the gradient's columns: not read
    else:
        values[0] = cp.inf
    marks = cp.zeros(len(grads) + 1, dtype=cp.float32)
    table.mark(values, marks)
    table.update(marks, cp.asarray([step_factor(state)], dtype=cp.float32))
    expected = [0, 0, 1, 1] if where == "gradient" else [0, 0, 0, 1]
    np.testing.assert_array_equal(marks.get(), np.asarray(expected, dtype=np.float32))
    for name, arrays in before.items():
        for ours, was in zip((variables[name], state.m[name], state.v[name]), arrays, strict=True):
            np.testing.assert_array_equal(ours.get(), was)
