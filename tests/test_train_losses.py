"""The loss family (xmesh/train/mesh_losses.py): the terms the original computed from its own meshes
(../shared/golden/train_seed1.npz with demo_seed1.npz's stage-1 blocks), and each backward against
float64 central differences (tests/gradcheck.py)."""

from __future__ import annotations

import numpy as np
import pytest

from gradcheck import check_gradients, namespace, namespaces
from xmesh.backends import get_backend
from xmesh.io.template import load_template
from xmesh.train import mesh_losses as ml

xp = get_backend("numpy").xp
TERM_RTOL = 5e-5  # golden/README.md: loss and terms within 5e-5 relative


@pytest.fixture(params=namespaces())
def xpd(request):
    """The array library a pair's float64 check runs on: NumPy, and CuPy where CUDA is present."""
    return namespace(request.param)


@pytest.fixture(scope="module")
def golden(golden_dir):
    return dict(np.load(golden_dir / "demo_seed1.npz")), dict(np.load(golden_dir / "train_seed1.npz"))


@pytest.fixture(scope="module")
def template(golden_dir):
    return load_template(golden_dir / "template.dat")


def support_edges(template, block):
    coo = template.supports[block - 1][1].tocoo()
    return np.stack([coo.row, coo.col], axis=1).astype(np.int64)


@pytest.mark.parametrize("block", [1, 2, 3])
def test_mesh_loss_of_the_originals_meshes(golden, template, block):
    forward, train = golden
    gt = ml.GroundTruth.from_labels(xp, [train["labels"]], np.float32)
    k = block - 1
    draws = ml.Draws.stack(xp, [(train[f"s1_choice_{k}"], train[f"s1_r1_{k}"], train[f"s1_r2_{k}"])], np.float32)
    loss, _ = ml.mesh_loss_forward(
        xp,
        forward[f"stage1_block{block}"][None],
        gt,
        support_edges(template, block),
        template.faces_triangle[k],
        draws,
        ml.STAGE1_MESH,
    )
    ref = float(train[f"s1_term_mesh_loss_block{block}_{k}"])
    assert abs(float(loss[0]) - ref) <= TERM_RTOL * abs(ref)


@pytest.mark.parametrize("block", [1, 2, 3])
def test_laplace_loss_of_the_originals_meshes(golden, template, block):
    forward, train = golden
    after = forward[f"stage1_block{block}"][None]
    if block == 1:
        before = template.coord[None]
    else:
        previous, pairs = forward[f"stage1_block{block - 1}"][None], template.pool_idx[block - 2]
        before = np.concatenate([previous, (previous[:, pairs[:, 0]] + previous[:, pairs[:, 1]]) * 0.5], axis=1)
    loss, _ = ml.laplace_loss_forward(
        xp, before.astype(np.float32), after, template.lape_idx[block - 1], ml.STAGE1_LAPLACE
    )
    ref = float(train[f"s1_term_laplace_loss_block{block}_{block + 2}"])
    assert abs(float(loss[0]) - ref) <= TERM_RTOL * abs(ref)


def small_mesh(rng, batch=2, n=14, faces=20, edges=30, samples=25):
    """A random batch of small meshes, two ground truths of different sizes (one padded), draws."""
    tri = np.stack([rng.choice(n, 3, replace=False) for _ in range(faces)])
    pairs = np.stack([rng.choice(n, 2, replace=False) for _ in range(edges)])
    pairs[0] = [3, 3]  # a zero-length edge, as the supports' diagonal gives
    labels = []
    for count in (17, 11)[:batch]:
        normals = rng.standard_normal((count, 3))
        labels.append(
            np.concatenate(
                [rng.standard_normal((count, 3)), normals / np.linalg.norm(normals, axis=1, keepdims=True)], 1
            )
        )
    draws = [
        (rng.integers(0, faces, samples), rng.random((samples, 1)), rng.random((samples, 1))) for _ in range(batch)
    ]
    return tri, pairs, labels, draws


def test_mesh_loss_pair(xpd):
    rng = np.random.default_rng(0)
    tri, pairs, labels, draws = small_mesh(rng)
    tri, pairs = xpd.asarray(tri), xpd.asarray(pairs)
    gt = ml.GroundTruth.from_labels(xpd, labels, np.float64)
    # the fed draws are float32 like the original's; float64 here for the check
    fed = ml.Draws(
        xpd.asarray(np.stack([d[0] for d in draws])),
        xpd.asarray(np.stack([d[1] for d in draws])),
        xpd.asarray(np.stack([d[2] for d in draws])),
    )
    inputs = {"pred": xpd.asarray(rng.standard_normal((2, 14, 3)))}
    weights = ml.MeshLossWeights(chamfer=3.0, chamfer_pred=0.55, edge=2.0, normal=5.0)

    def forward(pred):
        return ml.mesh_loss_forward(xpd, pred, gt, pairs, tri, fed, weights)[0]

    def backward(dloss):
        _, cache = ml.mesh_loss_forward(xpd, inputs["pred"], gt, pairs, tri, fed, weights)
        return {"pred": ml.mesh_loss_backward(xpd, dloss, cache)}

    check_gradients(forward, backward, inputs, xpd, elements=40)


def test_laplace_loss_pair(xpd):
    rng = np.random.default_rng(1)
    n = 12
    lape = np.full((n, 10), -1, dtype=np.int64)
    for i in range(n):
        count = rng.integers(2, 9)
        lape[i, :count] = rng.choice([j for j in range(n) if j != i], count, replace=False)
        lape[i, 8], lape[i, 9] = i, count
    inputs = {name: xpd.asarray(rng.standard_normal((2, n, 3))) for name in ("pred1", "pred2")}
    weights = ml.LaplaceWeights(laplace=3.0, move=2.0)
    reciprocal = ml.laplace_reciprocal(xpd, lape, np.float64)
    lape = xpd.asarray(lape)

    def forward(pred1, pred2):
        return ml.laplace_loss_forward(xpd, pred1, pred2, lape, weights, reciprocal)[0]

    def backward(dloss):
        _, cache = ml.laplace_loss_forward(xpd, inputs["pred1"], inputs["pred2"], lape, weights, reciprocal)
        d1, d2 = ml.laplace_loss_backward(xpd, dloss, cache)
        return {"pred1": d1, "pred2": d2}

    check_gradients(forward, backward, inputs, xpd)


def test_own_draws_follow_the_face_areas():
    """The trainer's draws choose faces in proportion to their areas (a chi-square bound that a
    uniform choice fails), and the same generator state gives the same draws."""
    rng = np.random.default_rng(2)
    pred = rng.standard_normal((2, 30, 3))
    tri = np.stack([rng.choice(30, 3, replace=False) for _ in range(12)])
    draws = ml.draw_samples(xp, np.random.default_rng(7), pred, tri, count=40000)
    again = ml.draw_samples(xp, np.random.default_rng(7), pred, tri, count=40000)
    np.testing.assert_array_equal(draws.choice, again.choice)
    areas = ml.face_areas(xp, pred, tri)
    for b in range(2):
        expected = areas[b] / areas[b].sum() * 40000
        observed = np.bincount(draws.choice[b], minlength=12)
        chi2 = float(((observed - expected) ** 2 / expected).sum())
        assert chi2 < 40.0, chi2  # 11 degrees of freedom: p < 1e-4 above 40
    assert draws.r1.shape == (2, 40000, 1) and 0 <= float(draws.r1.min()) and float(draws.r2.max()) < 1


def test_the_pinned_inputs_take_the_same_ground_truth_and_draws():
    """A replayed step's inputs written in place (``out=``) are the arrays the eager step makes: the
    ground truth padded with 1e4 and rounded once to float32 (float32 and float64 labels alike), and
    the uniforms of the same generator stream, which then resumes where the eager draws leave it."""
    rng = np.random.default_rng(4)
    labels = [rng.standard_normal((300, 6)).astype(np.float32), rng.standard_normal((250, 6))]
    made = ml.GroundTruth.host_arrays(labels, np.float32, 512)
    out = {
        name: np.full(made[name].shape, np.nan, np.float32) for name in ("points", "normals", "valid", "count_values")
    }
    written = ml.GroundTruth.host_arrays(labels, np.float32, 512, out=out)
    assert written is out and made["points"].dtype == np.float32
    for name in ("points", "normals", "valid", "count_values"):
        np.testing.assert_array_equal(written[name], made[name])
    exact = np.full((2, 512, 6), 1e4)
    for b, lab in enumerate(labels):
        exact[b, : len(lab)] = np.asarray(lab, np.float64)
    np.testing.assert_array_equal(made["points"], exact[..., :3].astype(np.float32))
    np.testing.assert_array_equal(made["normals"], exact[..., 3:].astype(np.float32))
    assert made["valid"].sum() == 550 and made["counts"].tolist() == [300, 250]

    eager, pinned = np.random.default_rng(9), np.random.default_rng(9)
    drawn = ml.Uniforms.host(eager, 2, 2, np.float32, 4000)
    triples = [
        (np.empty((2, 4000)), np.empty((2, 4000, 1), np.float32), np.empty((2, 4000, 1), np.float32)) for _ in range(2)
    ]
    into = ml.Uniforms.host(pinned, 2, 2, np.float32, 4000, out=triples)
    for a, b in zip(drawn, into, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
    assert eager.random() == pinned.random()
