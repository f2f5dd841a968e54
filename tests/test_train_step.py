"""The public training step (xmesh.train.loss_and_gradients, batch_loss_and_gradients): what it returns,
and a batch's loss and gradients as the mean of its samples' (stage 1 on the CPU, about 25 s)."""

from __future__ import annotations

import numpy as np
import pytest

from xmesh.errors import InputError
from xmesh.io.template import load_template
from xmesh.io.weights import expected_variables, synthetic_weights
from xmesh.train import batch_loss_and_gradients, loss_and_gradients

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def samples(golden_dir):
    """The golden sample with its fed draws, and a second one: the views in another order, half the
    ground truth moved, and draws of its own."""
    z = dict(np.load(golden_dir / "train_seed1.npz"))
    first = (
        z["images"],
        z["cameras"],
        z["labels"],
        [(z[f"s1_choice_{k}"], z[f"s1_r1_{k}"], z[f"s1_r2_{k}"]) for k in range(3)],
    )
    rng = np.random.default_rng(4)
    labels = z["labels"][::2].copy()
    labels[:, :3] += np.array([0.01, -0.02, 0.0], dtype=np.float32)
    faces = (308, 1232, 4928)
    uniform = (4000, 1)
    draws = [
        (rng.integers(0, f, 4000), rng.random(uniform, dtype=np.float32), rng.random(uniform, dtype=np.float32))
        for f in faces
    ]
    second = (z["images"][[1, 2, 0]], z["cameras"][[1, 2, 0]], labels, draws)
    return load_template(golden_dir / "template.dat"), synthetic_weights(1), first, second


@pytest.fixture(scope="module")
def singles(samples):
    template, weights, *pairs = samples
    return [loss_and_gradients(1, weights, template, i, c, lab, draws=d) for i, c, lab, d in pairs]


def test_the_step_returns_every_variable_by_official_name(singles):
    result = singles[0]
    variables = expected_variables(1)
    assert set(result.gradients) == set(variables)
    for name, shape in variables.items():
        g = result.gradients[name]
        assert isinstance(g, np.ndarray) and g.dtype == np.float32 and g.shape == shape, name
        assert np.all(np.isfinite(g)), name
    assert sorted(result.terms) == sorted(
        [f"mesh_loss_block{b}_{b - 1}" for b in (1, 2, 3)] + [f"laplace_loss_block{b}_{b + 2}" for b in (1, 2, 3)]
    )
    # the rest of the loss is the regularisers, small and positive
    assert 0 < result.loss - sum(result.terms.values()) < 1e-2 * result.loss


def test_a_batch_is_the_mean_of_its_samples(samples, singles):
    template, weights, first, second = samples
    batch = batch_loss_and_gradients(
        1,
        weights,
        template,
        np.stack([first[0], second[0]]),
        np.stack([first[1], second[1]]),
        [first[2], second[2]],
        draws=[first[3], second[3]],
    )
    assert singles[0].loss != pytest.approx(singles[1].loss, rel=1e-3)  # two different samples
    assert batch.loss == pytest.approx((singles[0].loss + singles[1].loss) / 2, rel=1e-5)
    for name, value in batch.terms.items():
        assert value == pytest.approx((singles[0].terms[name] + singles[1].terms[name]) / 2, rel=1e-5), name
    # float32 in another order (a batch's products) moves the gradients as a last-bit change of the
    # weights moves the original's (golden/README.md): its tolerances apply
    whole = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in batch.gradients.values()))
    errors = []
    for name, g in batch.gradients.items():
        mean = (singles[0].gradients[name].astype(np.float64) + singles[1].gradients[name]) / 2
        errors.append(np.linalg.norm(g - mean) / max(np.linalg.norm(mean), 1e-4 * whole))
    errors = np.array(errors)
    print(
        f"batch of 2 against its samples' mean: largest error {errors.max():.2e}, "
        f"{np.mean(errors <= 1e-3):.1%} within 1e-3"
    )
    assert errors.max() <= 1e-2
    assert np.mean(errors <= 1e-3) >= 0.8


def test_bad_stage_and_draws_are_refused(samples):
    template, weights, first, _ = samples
    with pytest.raises(InputError, match="stage=3"):
        loss_and_gradients(3, weights, template, *first[:3])
    with pytest.raises(InputError, match="3 mesh_loss calls"):
        loss_and_gradients(1, weights, template, *first[:3], draws=first[3][:2])


def test_own_draws_sample_the_same_surfaces(samples, singles):
    """Without fed draws the step draws its own from ``rng``: the same forward (equal Laplacian terms) and
    Chamfer terms within 0.1% of the fed draws' (4000 other points on the same faces)."""
    template, weights, first, _ = samples
    own = batch_loss_and_gradients(
        1, weights, template, first[0][None], first[1][None], [first[2]], rng=np.random.default_rng(5)
    )
    for name, value in own.terms.items():
        fed = singles[0].terms[name]
        assert value == pytest.approx(fed, rel=1e-3 if name.startswith("mesh") else 1e-6), name
    assert own.terms["mesh_loss_block3_2"] != singles[0].terms["mesh_loss_block3_2"]
