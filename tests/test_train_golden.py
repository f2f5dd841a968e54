"""The training step against what the original's training graph computed (../shared/golden/train_seed1.npz).

The sample is the golden demo's (images, cameras, synthetic weights of seed 1, template.dat) with
ground truth ``labels`` and the original's random draws fed in. Tolerances (golden/README.md):
loss and terms within 5e-5 relative; per variable, the error of the gradient's norm and of its
seeded projection over max(its norm, 1e-4 x the whole gradient's norm) at most 1e-2 for every
variable and at most 1e-3 for at least 80% of them; a variable stored whole, above that floor,
with cosine similarity >= 0.9999.

Stage 1's projection casts pixel positions to integers. For 26 template vertices view 0's pixel
lies exactly on a cell edge, and the original's float32 noise decided the side (tests/test_golden.py
explains it): the sides are found as that test finds them, from the original's block-1 output, and
the near-edge samples of the later projections likewise from blocks 2 and 3.
"""

from __future__ import annotations

import itertools
import os
import zlib

import numpy as np
import pytest

from adam_golden import STAGE1_LOSS_AFTER2_RTOL, STAGE1_STEP_BOUNDS, check_adam_steps
from xmesh.backends import get_backend
from xmesh.io.template import load_template
from xmesh.io.weights import synthetic_weights
from xmesh.model import architecture as arch
from xmesh.model import projection
from xmesh.model.cnn import cnn_forward
from xmesh.train import mesh_losses as ml
from xmesh.train import stage1
from xmesh.train.adam import AdamState, adam_step

TERM_RTOL = 5e-5
GRAD_ALL = 1e-2
GRAD_MOST = 1e-3
GRAD_MOST_FRACTION = 0.8
COSINE = 0.9999
FLOOR = 1e-4
BLOCK_ATOL = 1e-5
NEAR_EDGE_PX = 5e-5  # as tests/test_golden.py: a pixel position this near a cell edge is float32 noise

# The same tests run on the GPU with XMESH_TEST_BACKEND=cupy (fp32), as tests/test_golden.py's.
BACKEND = os.environ.get("XMESH_TEST_BACKEND", "numpy")
xp = get_backend(BACKEND).xp
host = get_backend(BACKEND).to_numpy
# stage 1's step on the CPU, with the search for the original's edge sides: about 25 s on two cores
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def golden(golden_dir):
    return dict(np.load(golden_dir / "train_seed1.npz")), dict(np.load(golden_dir / "demo_seed1.npz"))


def near_edge(points, tf, strides=(4, 8, 16, 32)):
    """(vertex, view, axis, edge) of the pixel positions of ``points`` within NEAR_EDGE_PX of a cell edge."""
    found = {}
    for view in range(tf.num_views):
        for axis, values in enumerate(projection._view_pixels(np, points[None].astype(np.float32), tf, view)):
            for r in strides:
                q = values[0].astype(np.float64) / r
                for n in np.where(np.abs(q - np.round(q)) * r < NEAR_EDGE_PX)[0]:
                    found[(int(n), view, axis)] = float(np.round(q[n]) * r)
    return [(n, view, axis, edge) for (n, view, axis), edge in sorted(found.items())]


class EdgeSides:
    """A ``projection._view_pixels`` that puts chosen samples on either side of their cell edge."""

    def __init__(self, template_coord, h_edge, w_edge, extra):
        self.coord, self.h_edge, self.w_edge, self.extra = template_coord, h_edge, w_edge, extra
        self.choice = np.zeros(len(h_edge) + len(w_edge), bool)
        self.extra_choice = [False] * len(extra)
        self.original = projection._view_pixels

    def __call__(self, xp_, points, tf, view):
        h, w = self.original(xp_, points, tf, view)
        h, w = np.array(host(h), copy=True), np.array(host(w), copy=True)
        below = np.nextafter(np.float32(112), np.float32(0))
        n = points.shape[1]
        if n == len(self.coord) and np.array_equal(host(points[0]), self.coord):
            if view == 0:
                h[:, self.h_edge] = np.where(self.choice[: len(self.h_edge)], np.float32(112), below)
                w[:, self.w_edge] = np.where(self.choice[len(self.h_edge) :], np.float32(112), below)
            return xp_.asarray(h), xp_.asarray(w)
        hw = [h, w]
        for (n_points, (vertex, v, axis, edge)), on_edge in zip(self.extra, self.extra_choice):
            if n_points == n and v == view:
                hw[axis][:, vertex] = np.float32(edge) if on_edge else np.nextafter(np.float32(edge), np.float32(0))
        return xp_.asarray(hw[0]), xp_.asarray(hw[1])


@pytest.fixture(scope="module")
def stage1_step(golden, golden_dir):
    """Stage 1's step on the golden sample, with the edge sides that reproduce the original's blocks."""
    train, demo = golden
    template = load_template(golden_dir / "template.dat")
    weights = {k: xp.asarray(v) for k, v in synthetic_weights(1).items() if k.startswith("meshnetmvp2m/")}
    tmpl = stage1.Stage1Template.build(xp, template, np.float32)
    images = xp.asarray(train["images"][None].astype(np.float32))
    tf = stage1.transforms(xp, train["cameras"][None])
    cnn = cnn_forward(xp, stage1.cnn_layers(weights), stage1.cnn_images(xp, images, True), arch.STAGE1_TAPS)
    coord = np.asarray(template.coord, np.float64)
    # the later projections' inputs are blocks 1 and 2 (156 and 618 vertices)
    host_tf = stage1.transforms(np, train["cameras"][None])
    later = [(156, s) for s in near_edge(demo["stage1_block1"], host_tf)]
    later += [(618, s) for s in near_edge(demo["stage1_block2"], host_tf)]
    on_h_edge, on_w_edge = np.where(np.abs(coord[:, 1]) < 1e-12)[0], np.where(np.abs(coord[:, 0]) < 1e-12)[0]
    sides = EdgeSides(template.coord, on_h_edge, on_w_edge, later)

    def score(blocks, i):
        err = np.abs(host(blocks[i][0]) - demo[f"stage1_block{i + 1}"]).max(axis=1)
        return (err <= BLOCK_ATOL).mean(), -float(np.median(err))

    projection._view_pixels = sides
    try:

        def block1():
            return stage1.forward(xp, weights, tmpl, images, tf, stop=15, maps_and_caches=cnn).blocks

        best = score(block1(), 0)
        for _ in range(3):
            improved = False
            for i in range(len(sides.choice)):
                sides.choice[i] = ~sides.choice[i]
                s = score(block1(), 0)
                if s > best:
                    best, improved = s, True
                else:
                    sides.choice[i] = ~sides.choice[i]
            if not improved:
                break
        assert len(later) <= 3, f"{len(later)} near-edge samples in the later projections: too many to search"
        options = []
        for bits in itertools.product([False, True], repeat=len(later)):
            sides.extra_choice = list(bits)
            blocks = stage1.forward(xp, weights, tmpl, images, tf, maps_and_caches=cnn).blocks
            options.append((score(blocks, 2) + score(blocks, 1), bits))
        sides.extra_choice = list(max(options)[1])
        blocks = stage1.forward(xp, weights, tmpl, images, tf, maps_and_caches=cnn).blocks
        gt = ml.GroundTruth.from_labels(xp, [train["labels"]], np.float32)
        draws = [
            ml.Draws.stack(xp, [(train[f"s1_choice_{k}"], train[f"s1_r1_{k}"], train[f"s1_r2_{k}"])], np.float32)
            for k in range(3)
        ]
        loss, terms, grads = stage1.loss_and_gradients(xp, weights, tmpl, images, tf, gt, draws)
    finally:
        projection._view_pixels = sides.original
    return (
        [host(b) for b in blocks],
        float(loss),
        {k: float(v) for k, v in terms.items()},
        {k: host(g) for k, g in grads.items()},
        [host(m) for m in cnn[0]],
        sides,
    )


@pytest.mark.parametrize("index,key", list(enumerate([f"stage1_feat{s}" for s in (56, 28, 14, 7)])))
def test_stage1_training_cnn_maps_are_the_originals(golden, stage1_step, index, key):
    ours, ref = stage1_step[4][index][0], golden[1][key][0]  # view 0, the one the projections read
    assert np.linalg.norm(ours.astype(np.float64) - ref) <= 1e-5 * np.linalg.norm(ref)


@pytest.mark.parametrize("block", [1, 2, 3])
def test_stage1_training_forward_is_the_originals(golden, stage1_step, block):
    close = np.abs(stage1_step[0][block - 1][0] - golden[1][f"stage1_block{block}"]).max(axis=1) <= BLOCK_ATOL
    assert close.mean() >= 0.999, f"{close.mean():.4%} of block {block}'s vertices within {BLOCK_ATOL}"


def test_stage1_loss_and_terms(golden, stage1_step):
    train = golden[0]
    _, loss, terms, *_ = stage1_step
    assert set(terms) == {k[len("s1_term_") :] for k in train if k.startswith("s1_term_")}
    for name, value in terms.items():
        ref = float(train[f"s1_term_{name}"])
        assert abs(float(value) - ref) <= TERM_RTOL * abs(ref), (name, float(value), ref)
    assert abs(loss - float(train["s1_loss"])) <= TERM_RTOL * abs(float(train["s1_loss"]))


def gradient_errors(train, grads, prefix="s1"):
    """Per variable, the norm's and the projection's error over the floored norm, and the floor."""
    names = [str(n) for n in train[f"{prefix}_names"]]
    norms, projections = train[f"{prefix}_grad_norm"], train[f"{prefix}_grad_proj"]
    whole = float(np.sqrt(np.sum(norms**2)))
    errors = {}
    for i, name in enumerate(names):
        g = np.asarray(grads[name], np.float64)
        r = np.random.default_rng([12345, zlib.crc32(name.encode())]).standard_normal(g.shape)
        floor = max(float(norms[i]), FLOOR * whole)
        errors[name] = max(abs(np.linalg.norm(g) - norms[i]), abs(float(np.sum(g * r)) - projections[i])) / floor
    return errors, FLOOR * whole


def assert_gradients_match(train, grads, prefix):
    """The README's gradient tolerances for one stage: every variable's norm and projection within
    GRAD_ALL, GRAD_MOST_FRACTION of them within GRAD_MOST, and each gradient stored whole above the floor
    at cosine >= COSINE; prints which fraction meets each."""
    errors, floor = gradient_errors(train, grads, prefix)
    values = np.array(list(errors.values()))
    within_all, within_most = float(np.mean(values <= GRAD_ALL)), float(np.mean(values <= GRAD_MOST))
    worst = max(errors, key=errors.get)
    print(
        f"{prefix}: {len(values)} variables; error <= {GRAD_ALL}: {within_all:.1%}, <= {GRAD_MOST}: "
        f"{within_most:.1%}; largest {errors[worst]:.2e} ({worst})"
    )
    cosines = {}
    for key in train:
        if key.startswith(f"{prefix}_grad|"):
            name = key[len(f"{prefix}_grad|") :]
            ref, ours = train[key].astype(np.float64), np.asarray(grads[name], np.float64)
            if np.linalg.norm(ref) > floor:
                cosines[name] = float(np.sum(ref * ours) / (np.linalg.norm(ref) * np.linalg.norm(ours)))
    lowest = min(cosines, key=cosines.get)
    print(
        f"{prefix}: {len(cosines)} whole gradients above the floor; cosine >= {COSINE}: "
        f"{np.mean(np.array(list(cosines.values())) >= COSINE):.1%}; lowest {cosines[lowest]:.8f} ({lowest})"
    )
    assert within_all == 1.0
    assert within_most >= GRAD_MOST_FRACTION
    assert min(cosines.values()) >= COSINE


def test_stage1_gradients(golden, stage1_step):
    train = golden[0]
    grads = stage1_step[3]
    assert set(grads) == {str(n) for n in train["s1_names"]}
    assert_gradients_match(train, grads, "s1")


def test_stage1_two_adam_steps(golden, golden_dir, stage1_step):
    """Two TF1 Adam steps from the step's gradients, against the original's changes and loss after them.

    The view-0 edge sides hold at every weight (the template does not move); the later projections'
    near-edge samples move with the weights, so after a step they are left to our own arithmetic."""
    train = golden[0]
    template = load_template(golden_dir / "template.dat")
    weights = {k: xp.asarray(v) for k, v in synthetic_weights(1).items() if k.startswith("meshnetmvp2m/")}
    tmpl = stage1.Stage1Template.build(xp, template, np.float32)
    images = xp.asarray(train["images"][None].astype(np.float32))
    tf = stage1.transforms(xp, train["cameras"][None])
    gt = ml.GroundTruth.from_labels(xp, [train["labels"]], np.float32)
    draws = [
        ml.Draws.stack(xp, [(train[f"s1_choice_{k}"], train[f"s1_r1_{k}"], train[f"s1_r2_{k}"])], np.float32)
        for k in range(3)
    ]
    found = stage1_step[5]
    sides = EdgeSides(template.coord, found.h_edge, found.w_edge, [])
    sides.choice = found.choice.copy()
    variables = {name: xp.asarray(value, copy=True) for name, value in weights.items()}
    state = AdamState()
    adam_step(xp, variables, stage1_step[3], state)
    changes = [{name: host(variables[name] - weights[name]) for name in variables}]
    after1 = {name: xp.asarray(value, copy=True) for name, value in variables.items()}
    projection._view_pixels = sides
    try:
        grads = stage1.loss_and_gradients(xp, variables, tmpl, images, tf, gt, draws)[2]
        adam_step(xp, variables, grads, state)
        changes.append({name: host(variables[name] - after1[name]) for name in variables})
        loss_after2 = float(stage1.loss_and_gradients(xp, variables, tmpl, images, tf, gt, draws)[0])
    finally:
        projection._view_pixels = sides.original
    check_adam_steps(train, "s1", changes, loss_after2, bounds=STAGE1_STEP_BOUNDS, loss_rtol=STAGE1_LOSS_AFTER2_RTOL)
