"""xmesh.metrics on the CPU: every backend against a brute-force float64 reference."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import xmesh.metrics as metrics
from xmesh.errors import BackendUnavailableError, InputError
from xmesh.metrics import nn_faiss, scores

CPU_BACKENDS = ["scipy", "faiss"]
SIZES = [(1, 1), (1, 50), (7, 3), (200, 531), (2466, 10000)]


def reference_sqdist(a, b):
    """min_j |a_i - b_j|^2 in float64 by brute force (block by block)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    out = np.empty(len(a))
    for start in range(0, len(a), 256):
        block = a[start : start + 256]
        out[start : start + 256] = ((block[:, None, :] - b[None, :, :]) ** 2).sum(axis=-1).min(axis=1)
    return out


def shape_like_pair(n, m, seed):
    """A ShapeNet-scale pair in float32: gt on a sphere of radius 0.4, pred near it (noise ~0.01),
    so the squared distances straddle the F-score thresholds."""
    rng = np.random.default_rng(seed)

    def sphere(k):
        v = rng.normal(size=(k, 3))
        return 0.4 * v / np.linalg.norm(v, axis=1, keepdims=True)

    gt = sphere(m)
    pred = sphere(n) + rng.normal(scale=0.008, size=(n, 3))
    return pred.astype(np.float32), gt.astype(np.float32)


def far_from_thresholds(d, taus=scores.THRESHOLDS, margin=1e-9):
    return all(np.abs(d - tau).min() > margin for tau in taus)


@pytest.fixture(scope="module", params=SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def pair(request):
    n, m = request.param
    pred, gt = shape_like_pair(n, m, seed=n * 7919 + m)
    return pred, gt, reference_sqdist(pred, gt), reference_sqdist(gt, pred)


# --- nearest neighbours and the metrics against the reference -------------------------------------


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_nn_distances_match_reference(pair, backend):
    pred, gt, d1_ref, _ = pair
    sqdist, index = metrics.nn_distances(pred, gt, backend=backend)
    assert sqdist.dtype == np.float64 and index.dtype == np.int64
    assert sqdist.shape == index.shape == (len(pred),)
    np.testing.assert_allclose(sqdist, d1_ref, rtol=1e-12, atol=0)
    # the index names a point at that distance
    recomputed = ((pred.astype(np.float64) - gt.astype(np.float64)[index]) ** 2).sum(axis=1)
    np.testing.assert_array_equal(recomputed, sqdist)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_chamfer_and_fscore_match_reference(pair, backend):
    pred, gt, d1_ref, d2_ref = pair
    expected_chamfer = d1_ref.mean() + d2_ref.mean()
    result = metrics.evaluate(pred, gt, backend=backend)
    assert abs(result["chamfer"] - expected_chamfer) <= 1e-6 * expected_chamfer
    assert abs(metrics.chamfer(pred, gt, backend=backend) - expected_chamfer) <= 1e-6 * expected_chamfer
    assert result["d1_mean"] == pytest.approx(d1_ref.mean(), rel=1e-6)
    assert result["d2_mean"] == pytest.approx(d2_ref.mean(), rel=1e-6)

    assert far_from_thresholds(d1_ref) and far_from_thresholds(d2_ref)  # so equality below is fair
    taus = np.array(scores.THRESHOLDS)
    precision = np.array([100.0 * np.sum(d1_ref <= t) / len(d1_ref) for t in taus])
    recall = np.array([100.0 * np.sum(d2_ref <= t) / len(d2_ref) for t in taus])
    expected_f = 2 * precision * recall / (precision + recall + 1e-6)
    np.testing.assert_array_equal(metrics.f_score(pred, gt, backend=backend), expected_f)
    if len(pred) >= 2466:  # the ShapeNet-sized case is informative: no F-score is near 0 or 100
        assert np.all((expected_f > 5) & (expected_f < 95)), expected_f
    assert list(result["fscore"]) == list(scores.THRESHOLDS)
    np.testing.assert_array_equal(list(result["fscore"].values()), expected_f)


def test_demo_prediction_against_sampled_ground_truth(demo_dir):
    """The official demo mesh against points scattered around it: all backends agree with the reference."""
    rows = [line.split()[1:4] for line in (demo_dir / "predict.obj").read_text().splitlines() if line.startswith("v ")]
    pred = np.array(rows, dtype=np.float32)
    rng = np.random.default_rng(3)
    gt = (pred[rng.integers(0, len(pred), 6000)] + rng.normal(scale=0.01, size=(6000, 3))).astype(np.float32)
    d1, d2 = reference_sqdist(pred, gt), reference_sqdist(gt, pred)
    for backend in CPU_BACKENDS:
        assert metrics.chamfer(pred, gt, backend=backend) == pytest.approx(d1.mean() + d2.mean(), rel=1e-6)


# --- FAISS exactness: candidate re-ranking and its fallback ----------------------------------------


def test_faiss_fallback_scan_is_exact_with_one_candidate():
    pred, gt = shape_like_pair(300, 2000, seed=11)
    index = nn_faiss.nearest_index(pred.astype(np.float64), gt.astype(np.float64), candidates=1)
    got = ((pred.astype(np.float64) - gt.astype(np.float64)[index]) ** 2).sum(axis=1)
    np.testing.assert_array_equal(got, reference_sqdist(pred, gt))


def test_faiss_exact_on_near_ties_far_from_origin():
    """Two clusters 200 apart: float32 expansion errors (~1e-3 here) dwarf the gaps between
    neighbours (~1e-6), so FAISS's own ranking is unreliable; the result must still be exact."""
    rng = np.random.default_rng(5)
    centre = np.array([100.0, -100.0, 50.0])
    directions = rng.normal(size=(64, 3))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    shell = centre + directions * (1.0 + 1e-6 * rng.random((64, 1)))
    gt = np.concatenate([shell, -shell]).astype(np.float32)
    pred = (centre + 1e-4 * rng.normal(size=(40, 3))).astype(np.float32)
    d1, _ = metrics.nn_distances(pred, gt, backend="faiss")
    np.testing.assert_array_equal(d1, reference_sqdist(pred, gt))


def test_faiss_missing_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)  # makes `import faiss` raise ImportError
    with pytest.raises(BackendUnavailableError, match="pip install faiss-cpu"):
        metrics.chamfer(np.zeros((2, 3)), np.ones((3, 3)), backend="faiss")


# --- the formulas ----------------------------------------------------------------------------------


def test_fscore_and_chamfer_on_a_hand_checked_case():
    gt = np.array([[0, 0, 0], [1, 0, 0]], dtype=np.float64)
    pred = np.array([[0, 0, 0.005], [1, 0, 0.011], [0.5, 0, 0], [0, 0, 0.013]], dtype=np.float64)
    # d1 = 2.5e-5, 1.21e-4, 0.25, 1.69e-4 ; d2 = 2.5e-5, 1.21e-4
    # tau 5e-5 and 1e-4: P = 1/4, R = 1/2 ; tau 1.5e-4: P = 2/4, R = 2/2 ; tau 2e-4: P = 3/4, R = 1
    expected_f = [
        2 * 25 * 50 / (25 + 50 + 1e-6),
        2 * 25 * 50 / (25 + 50 + 1e-6),
        2 * 50 * 100 / (50 + 100 + 1e-6),
        2 * 75 * 100 / (75 + 100 + 1e-6),
    ]
    expected_chamfer = (2.5e-5 + 1.21e-4 + 0.25 + 1.69e-4) / 4 + (2.5e-5 + 1.21e-4) / 2
    for backend in CPU_BACKENDS:
        np.testing.assert_allclose(metrics.f_score(pred, gt, backend=backend), expected_f, rtol=1e-14)
        assert metrics.chamfer(pred, gt, backend=backend) == pytest.approx(expected_chamfer, rel=1e-12)
    result = metrics.evaluate(pred, gt, thresholds=(1.5e-4,))
    assert result["fscore"] == {1.5e-4: pytest.approx(expected_f[2], rel=1e-14)}
    assert result["d1_mean"] == pytest.approx((2.5e-5 + 1.21e-4 + 0.25 + 1.69e-4) / 4, rel=1e-12)
    assert result["d2_mean"] == pytest.approx((2.5e-5 + 1.21e-4) / 2, rel=1e-12)


def test_precision_counts_prediction_points_and_recall_ground_truth_points():
    d1 = np.array([1e-5, 1.0, 1.0, 1.0])  # 1 of 4 predicted points close: P = 25
    d2 = np.array([1e-5, 1e-5, 1e-5, 1.0, 1.0])  # 3 of 5 ground-truth points close: R = 60
    assert scores.fscore_from_distances(d1, d2, (1e-4,))[0] == 2 * 25 * 60 / (25 + 60 + 1e-6)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_identity_and_symmetry(backend):
    pred, gt = shape_like_pair(500, 800, seed=2)
    assert metrics.chamfer(pred, pred, backend=backend) == 0.0
    f = metrics.f_score(pred, pred, backend=backend)
    np.testing.assert_array_equal(f, 2 * 100 * 100 / (200 + 1e-6))  # 100 up to the original's 1e-6
    assert f == pytest.approx(100, abs=1e-5)
    assert metrics.chamfer(pred, gt, backend=backend) == metrics.chamfer(gt, pred, backend=backend)
    np.testing.assert_array_equal(
        metrics.f_score(pred, gt, backend=backend), metrics.f_score(gt, pred, backend=backend)
    )


def test_float32_and_float64_inputs_give_the_same_result():
    pred, gt = shape_like_pair(400, 900, seed=4)
    assert metrics.chamfer(pred, gt) == metrics.chamfer(pred.astype(np.float64), gt.astype(np.float64))
    assert metrics.chamfer(pred.tolist(), gt.tolist()) == metrics.chamfer(pred, gt)


@settings(max_examples=40, deadline=None)
@given(
    pred=hnp.arrays(np.float32, st.tuples(st.integers(1, 40), st.just(3)), elements=st.floats(-1, 1, width=32)),
    gt=hnp.arrays(np.float32, st.tuples(st.integers(1, 40), st.just(3)), elements=st.floats(-1, 1, width=32)),
)
def test_property_backends_agree_with_reference(pred, gt):
    d1, d2 = reference_sqdist(pred, gt), reference_sqdist(gt, pred)
    expected = d1.mean() + d2.mean()
    for backend in CPU_BACKENDS:
        sqdist, _ = metrics.nn_distances(pred, gt, backend=backend)
        np.testing.assert_array_equal(sqdist, d1)
        got = metrics.chamfer(pred, gt, backend=backend)
        assert abs(got - expected) <= 1e-6 * expected
        assert got == metrics.chamfer(gt, pred, backend=backend)


# --- batches ---------------------------------------------------------------------------------------


def test_chamfer_batch_padded_with_lengths_equals_one_by_one():
    pairs = [shape_like_pair(n, m, seed=n + m) for n, m in [(120, 300), (57, 410), (200, 12)]]
    n_max = max(len(p) for p, _ in pairs)
    m_max = max(len(g) for _, g in pairs)
    preds = np.full((3, n_max, 3), np.nan, dtype=np.float32)  # padding is never read
    gts = np.full((3, m_max, 3), np.nan, dtype=np.float32)
    for i, (p, g) in enumerate(pairs):
        preds[i, : len(p)] = p
        gts[i, : len(g)] = g
    lengths_pred = np.array([len(p) for p, _ in pairs])
    lengths_gt = np.array([len(g) for _, g in pairs])
    one_by_one = np.array([metrics.chamfer(p, g) for p, g in pairs])
    for backend in CPU_BACKENDS:
        padded = metrics.chamfer_batch(preds, gts, lengths_pred, lengths_gt, backend=backend)
        listed = metrics.chamfer_batch([p for p, _ in pairs], [g for _, g in pairs], backend=backend)
        np.testing.assert_array_equal(padded, one_by_one)
        np.testing.assert_array_equal(listed, one_by_one)


def test_chamfer_batch_without_lengths_uses_every_point():
    preds = np.stack([shape_like_pair(80, 90, seed=s)[0] for s in range(2)])
    gts = np.stack([shape_like_pair(80, 90, seed=s)[1] for s in range(2)])
    np.testing.assert_array_equal(
        metrics.chamfer_batch(preds, gts), [metrics.chamfer(preds[i], gts[i]) for i in range(2)]
    )


# --- rejected inputs -------------------------------------------------------------------------------

GOOD = np.zeros((4, 3), dtype=np.float32)


@pytest.mark.parametrize(
    "bad, pattern",
    [
        (np.zeros((0, 3)), r"pred is empty"),
        (np.zeros((4, 2)), r"pred must be an \(N, 3\) array.*\(4, 2\)"),
        (np.zeros(3), r"pred must be an \(N, 3\) array.*\(3,\)"),
        (np.zeros((2, 4, 3)), r"pred must be an \(N, 3\) array"),
        (np.array([[0, 0, np.nan], [0, 0, 0]]), r"pred has 1 point\(s\) with NaN or infinite.*row 0"),
        (np.array([[0, 0, 0], [np.inf, 0, 0]]), r"pred has 1 point\(s\).*row 1"),
        (np.zeros((4, 3), dtype=bool), r"pred must hold real numbers"),
        (np.zeros((4, 3), dtype=complex), r"pred must hold real numbers"),
        ([[0, 0, 0], [1, 2]], r"pred must be an \(N, 3\) array"),
    ],
)
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_bad_points_are_rejected(bad, pattern, backend):
    with pytest.raises(InputError, match=pattern):
        metrics.evaluate(bad, GOOD, backend=backend)
    with pytest.raises(InputError, match=pattern.replace("pred", "gt")):
        metrics.chamfer(GOOD, bad, backend=backend)
    with pytest.raises(InputError, match=pattern.replace("pred", "a")):
        metrics.nn_distances(bad, GOOD, backend=backend)


def test_bad_options_are_rejected():
    with pytest.raises(InputError, match=r"backend must be one of .*'torch'"):
        metrics.chamfer(GOOD, GOOD, backend="torch")
    for thresholds in [(), (1e-4, -1.0), (np.nan,), ("x",)]:
        with pytest.raises(InputError, match="thresholds"):
            metrics.f_score(GOOD, GOOD, thresholds=thresholds)


def test_bad_batches_are_rejected():
    padded = np.zeros((2, 5, 3))
    with pytest.raises(InputError, match=r"lengths for preds must lie in \[1, 5\]"):
        metrics.chamfer_batch(padded, padded, lengths_pred=[0, 5])
    with pytest.raises(InputError, match=r"lengths for gts must lie in \[1, 5\]"):
        metrics.chamfer_batch(padded, padded, lengths_gt=[6, 5])
    with pytest.raises(InputError, match=r"lengths for preds must be a \(2,\) array of integers"):
        metrics.chamfer_batch(padded, padded, lengths_pred=[2.5, 5])
    with pytest.raises(InputError, match="apply only to a padded"):
        metrics.chamfer_batch([GOOD], [GOOD], lengths_pred=[4])
    with pytest.raises(InputError, match="same number of samples"):
        metrics.chamfer_batch([GOOD, GOOD], [GOOD])
    with pytest.raises(InputError, match="same number of samples"):
        metrics.chamfer_batch([], [])
    with pytest.raises(InputError, match=r"preds must be a padded \(B, N, 3\) array or a list"):
        metrics.chamfer_batch(GOOD, GOOD)
    with pytest.raises(InputError, match=r"preds\[1\] has 2 point\(s\) with NaN"):
        metrics.chamfer_batch([GOOD, np.full((2, 3), np.nan)], [GOOD, GOOD])


# --- summaries -------------------------------------------------------------------------------------


def test_summarize_means_per_category_and_overall():
    taus = (1e-4, 2e-4)
    rows = [
        {"category": "02691156", "chamfer": 1e-3, "fscore": {1e-4: 60.0, 2e-4: 80.0}},
        {"category": "02691156", "chamfer": 3e-3, "fscore": {1e-4: 40.0, 2e-4: 70.0}},
        {"category": "04530566", "chamfer": 5e-3, "fscore": {1e-4: 10.0, 2e-4: 20.0}},
    ]
    summary = metrics.summarize(rows)
    assert list(summary["categories"]) == ["02691156", "04530566"]
    plane = summary["categories"]["02691156"]
    assert plane["name"] == "airplane" and plane["count"] == 2
    assert plane["chamfer"] == pytest.approx(2e-3) and plane["chamfer_x1000"] == pytest.approx(2.0)
    assert plane["fscore"] == {1e-4: pytest.approx(50.0), 2e-4: pytest.approx(75.0)}
    assert summary["categories"]["04530566"]["name"] == "watercraft"
    over_cat = summary["mean_over_categories"]
    assert over_cat["count"] == 3 and over_cat["categories"] == 2  # count: samples, in every mean
    assert over_cat["chamfer"] == pytest.approx(3.5e-3) and over_cat["chamfer_x1000"] == pytest.approx(3.5)
    assert over_cat["fscore"] == {1e-4: pytest.approx(30.0), 2e-4: pytest.approx(47.5)}
    over_samples = summary["mean_over_samples"]
    assert over_samples["count"] == 3 and over_samples["categories"] == 2
    assert over_samples["chamfer"] == pytest.approx(3e-3)
    over_13 = summary["mean_over_13_categories"]
    assert over_13["count"] == 3 and over_13["categories"] == 13
    assert over_13["chamfer"] == pytest.approx((2e-3 + 5e-3) / 13)  # the absent 11 as 0: below every category
    assert over_samples["fscore"] == {tau: pytest.approx(np.mean([r["fscore"][tau] for r in rows])) for tau in taus}


def test_summarize_accepts_evaluate_rows_and_rejects_bad_ones():
    pred, gt = shape_like_pair(50, 60, seed=9)
    row = {"category": "03001627", **metrics.evaluate(pred, gt)}
    summary = metrics.summarize([row])
    assert summary["categories"]["03001627"]["chamfer"] == row["chamfer"]
    assert summary["categories"]["03001627"]["name"] == "chair"
    with pytest.raises(InputError, match="rows is empty"):
        metrics.summarize([])
    with pytest.raises(InputError, match=r"rows\[0\] lacks \['fscore'\]"):
        metrics.summarize([{"category": "x", "chamfer": 1.0}])
    other = {"category": "03001627", **metrics.evaluate(pred, gt, thresholds=(1e-4,))}
    with pytest.raises(InputError, match=r"rows\[1\] has F-scores at thresholds"):
        metrics.summarize([row, other])


def test_categories_are_the_thirteen_shapenet_classes():
    assert len(metrics.CATEGORIES) == 13
    assert metrics.CATEGORIES["02691156"] == "airplane" and metrics.CATEGORIES["04401088"] == "telephone"
    assert metrics.THRESHOLDS == (5e-5, 1e-4, 1.5e-4, 2e-4)


# --- the CUDA backend's parts that exist without a GPU ---------------------------------------------


def test_kernel_source_ships_with_the_package(tmp_path):
    """The installed package carries the CUDA sources (run outside the checkout, so the source tree
    cannot stand in for the installed package), and the loader finds them from a checkout too."""
    import subprocess

    probe = "import importlib.resources as r; print(r.files('xmesh.kernels').joinpath('nn_bruteforce.cu').read_text())"
    installed = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout
    assert "XM_KERNEL(nn_bruteforce) void nn_bruteforce(" in installed
    from xmesh.backends.cuda_kernels import kernel_source

    assert "XM_KERNEL(nn_bruteforce) void nn_bruteforce(" in kernel_source("nn_bruteforce.cu")
    assert "XM_KERNEL(local_projection) void local_projection(" in kernel_source("projection.cu")
    assert "#define XM_KERNEL(NAME)" in kernel_source("projection.cu")  # kernels/kernel_select.cuh, put in place


def test_cupy_backend_without_cupy_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(BackendUnavailableError, match="pip install cupy-cuda12x"):
        metrics.chamfer(GOOD, GOOD, backend="cupy")
