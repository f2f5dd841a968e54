"""The dataset pipeline: batched metrics, stage timing, mesh files, the original's logs, kill and resume."""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import requires_cuda
from pipeline_toy import ToyReconstructor
from xmesh.dataset import SampleId, sample_paths
from xmesh.errors import InputError
from xmesh.evaluate import evaluate_dataset, read_csv, reconstruct_dataset
from xmesh.io.images import images_to_unit
from xmesh.mesh import Mesh
from xmesh.metrics import THRESHOLDS, evaluate
from xmesh.metrics.batch import evaluate_batch, pad_clouds
from xmesh.pipeline import loading
from xmesh.pipeline.writing import obj_text, xyz_text
from xmesh.results import p2m_logs
from xmesh.synthetic.dataset import write_dataset, write_ground_truth

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """12 samples, 3 per category."""
    return write_dataset(tmp_path_factory.mktemp("ds"), n_per_category=3, seed=5)


def _batch(rng, sizes, n=300):
    preds = (rng.normal(size=(len(sizes), n, 3)) * 0.05).astype(np.float32)
    gts = [(rng.normal(size=(m, 3)) * 0.05).astype(np.float32) for m in sizes]
    return preds, gts


def _assert_batch_equals_per_sample(result, preds, gts):
    for b, gt in enumerate(gts):
        single = evaluate(preds[b], gt, THRESHOLDS, backend="scipy")
        assert float(result["chamfer"][b]) == pytest.approx(single["chamfer"], rel=1e-6)
        np.testing.assert_allclose(
            np.asarray(result["fscore"][b]), [single["fscore"][t] for t in THRESHOLDS], rtol=1e-6, atol=1e-6
        )
        assert bool(result["finite"][b])


def test_batched_metrics_equal_the_per_sample_ones_over_padded_ground_truth():
    rng = np.random.default_rng(1)
    preds, gts = _batch(rng, (50, 700, 1, 333))
    padded, lengths = pad_clouds(gts, size=1024)
    padded[0, 50:] = 1e6  # padding is never read: far-away values there change nothing
    _assert_batch_equals_per_sample(evaluate_batch(preds, padded, lengths_gt=lengths), preds, gts)


def test_batched_metrics_flag_a_non_finite_prediction():
    rng = np.random.default_rng(2)
    preds, gts = _batch(rng, (40, 60))
    preds[1, 7, 2] = np.nan
    padded, lengths = pad_clouds(gts)
    result = evaluate_batch(preds, padded, lengths_gt=lengths)
    assert result["finite"].tolist() == [True, False]


@requires_cuda
def test_batched_metrics_on_the_gpu_equal_the_per_sample_ones():
    import cupy

    rng = np.random.default_rng(3)
    preds, gts = _batch(rng, (1000, 17, 4096, 2500), n=2466)
    padded, lengths = pad_clouds(gts, size=4096)
    result = evaluate_batch(cupy.asarray(preds), cupy.asarray(padded), lengths_gt=lengths)
    host = {k: cupy.asnumpy(v) for k, v in result.items()}
    _assert_batch_equals_per_sample(host, preds, gts)


_LATE_FILL = r"""
extern "C" __global__ void late_fill(unsigned char* x, long long n, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] = 7;
}
"""


@requires_cuda
def test_a_new_staging_buffer_is_not_uploaded_into_while_the_compute_stream_still_writes_its_memory():
    """A kernel still running on the compute stream writes an array that is then freed; the Stager's
    next buffer takes the same block from CuPy's pool. Its upload must land after that kernel, or
    the kernel's late writes replace the batch (the first batches of every run were computed from
    such overwritten memory before the side stream waited for the compute stream)."""
    import cupy

    from xmesh.pipeline.staging import Stager

    size = 8 << 20
    host = np.random.default_rng(6).integers(0, 7, size=size, dtype=np.uint8)  # never 7
    stager = Stager(cupy)
    busy = cupy.empty(size, dtype=np.uint8)
    block = busy.data.ptr
    cupy.RawKernel(_LATE_FILL, "late_fill")((64,), (256,), (busy, np.int64(size), np.int64(200_000_000)))
    del busy  # back to the pool while the kernel still spins
    _, device = stager.stage({"images": host})
    assert device["images"].data.ptr == block  # the premise: the pool handed the busy block out again
    cupy.cuda.Device().synchronize()
    assert np.array_equal(cupy.asnumpy(device["images"]), host)
    stager.close()


def test_mesh_texts_are_what_savetxt_and_mesh_to_obj_write(tmp_path):
    rng = np.random.default_rng(4)
    vertices = rng.normal(size=(50, 3)).astype(np.float32)
    faces = rng.integers(0, 50, size=(80, 3))
    expected = io.StringIO()
    np.savetxt(expected, vertices)  # the original test script's call
    assert xyz_text(vertices) == expected.getvalue()
    Mesh(vertices, faces).to_obj(tmp_path / "m.obj")
    assert obj_text(vertices, faces) == (tmp_path / "m.obj").read_text()


def _original_f_score_log(rows) -> str:
    """The lines the original's f_score.py prints to its log, with its own statements."""
    length = {c: 0 for c in p2m_logs.ORIGINAL_NAMES}
    sum_pred = {c: np.zeros(4) for c in p2m_logs.ORIGINAL_NAMES}
    for row in rows:
        length[row["category"]] += 1.0
        sum_pred[row["category"]] += np.array([row["fscore"][t] for t in THRESHOLDS])
    out = io.StringIO()
    for item in length:
        number = length[item] + 1e-6
        score = sum_pred[item] / number
        print(item, p2m_logs.ORIGINAL_NAMES[item], length[item], " ".join(map(str, score)), file=out)
    return out.getvalue()


def _original_cd_log(rows) -> str:
    length = {c: 0 for c in p2m_logs.ORIGINAL_NAMES}
    sum_pred = {c: 0 for c in p2m_logs.ORIGINAL_NAMES}
    for row in rows:
        length[row["category"]] += 1.0
        sum_pred[row["category"]] += np.float64(row["chamfer"])
    out = io.StringIO()
    for item in length:
        number = length[item] + 1e-6
        score = (sum_pred[item] / number) * 10000
        print(item, p2m_logs.ORIGINAL_NAMES[item], int(length[item]), score, file=out)
    return out.getvalue()


def test_log_files_hold_the_lines_of_the_original_scripts():
    rng = np.random.default_rng(5)
    rows = [
        {
            "category": c,
            "chamfer": float(rng.uniform(1e-4, 1e-2)),
            "fscore": {t: float(rng.uniform(0, 100)) for t in THRESHOLDS},
        }
        for c in ("02691156", "02691156", "03001627", "04379243", "02691156")
    ]
    assert p2m_logs.f_score_lines(rows) == _original_f_score_log(rows)
    assert p2m_logs.cd_lines(rows) == _original_cd_log(rows)
    assert p2m_logs.f_score_lines(rows).splitlines()[7].startswith("02691156 plane 3.0 ")


def test_timing_has_every_stage_within_the_wall_time_and_names_a_slow_loader(data, tmp_path, monkeypatch):
    slow_decode = loading.load_images_u8

    def slowed(paths):
        time.sleep(0.1)
        return slow_decode(paths)

    monkeypatch.setattr(loading, "load_images_u8", slowed)
    summary = evaluate_dataset(
        ToyReconstructor(),
        data["test_list"],
        data["root"],
        data["root"] / "gt",
        tmp_path,
        batch_size=4,
        workers=0,
        progress=False,
    )
    timing = summary["run"]["timing"]
    stages = ("decode", "ground_truth", "upload", "network", "metrics", "write", "input_wait", "gpu_idle")
    assert set(stages) <= set(timing)
    for stage in stages:
        assert 0.0 <= timing[stage] <= timing["wall"], stage
    assert max(stages, key=timing.get) in ("decode", "input_wait")  # inline decoding: the loop waits for it
    assert timing["decode"] >= 0.1 * 12
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["run"]["timing"] == timing


def test_save_meshes_writes_the_originals_names_and_the_network_output(data, tmp_path):
    toy = ToyReconstructor()
    evaluate_dataset(
        toy,
        data["test_list"],
        data["root"],
        data["root"] / "gt",
        tmp_path / "eval",
        batch_size=5,
        workers=2,
        progress=False,
        save_meshes=True,
        save_ground=True,
    )
    evaluate_dataset(
        toy,
        data["test_list"],
        data["root"],
        data["root"] / "gt",
        tmp_path / "meshes",
        batch_size=5,
        workers=2,
        progress=False,
        save_meshes=True,
    )
    assert sorted(p.name for p in (tmp_path / "meshes" / "predict").iterdir()) == sorted(
        [f"{i[: -len('.dat')]}_predict.{ext}" for i in data["ids"] for ext in ("xyz", "obj")]
    )  # no ground text unasked
    with pytest.raises(InputError, match="save_ground=True .* needs save_meshes=True"):
        evaluate_dataset(toy, data["test_list"], data["root"], data["root"] / "gt", tmp_path / "x", save_ground=True)
    reconstruct_dataset(toy, data["test_list"], data["root"], tmp_path / "rec", batch_size=3, workers=1, progress=False)
    predict = tmp_path / "eval" / "predict"
    stems = [i[: -len(".dat")] for i in data["ids"]]
    assert sorted(p.name for p in predict.iterdir()) == sorted(
        [f"{s}_predict.xyz" for s in stems] + [f"{s}_predict.obj" for s in stems] + [f"{s}_ground.xyz" for s in stems]
    )
    assert sorted(p.name for p in (tmp_path / "rec").iterdir()) == sorted(
        p.name for p in predict.iterdir() if "_predict." in p.name
    )  # no ground truth without it
    sample = SampleId.parse(data["ids"][4])
    images, cameras, gt, _, _ = loading.load_sample(sample, sample_paths(sample, data["root"], data["root"] / "gt"))
    _, expected = toy.run(images_to_unit(np, images)[None], cameras[None])
    xyz = np.loadtxt(predict / f"{stems[4]}_predict.xyz")
    assert xyz.shape == (len(toy.base), 3)
    np.testing.assert_array_equal(xyz.astype(np.float32), expected[0])  # '%.18e' round-trips float32
    assert (predict / f"{stems[4]}_predict.obj").read_text() == obj_text(expected[0], toy.faces)
    assert (tmp_path / "rec" / f"{stems[4]}_predict.obj").read_bytes() == (
        predict / f"{stems[4]}_predict.obj"
    ).read_bytes()
    row = {r["id"]: r for r in read_csv(tmp_path / "eval" / "samples.csv")}[data["ids"][4]]
    assert row["chamfer"] == pytest.approx(evaluate(expected[0], gt)["chamfer"], rel=1e-9)


def _savetxt_bytes(points: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savetxt(buffer, points)
    return buffer.getvalue()


def test_ground_xyz_is_what_the_originals_test_script_saves(data, tmp_path):
    """{id}_ground.xyz: np.savetxt of the .dat's points array as the original's loader reads it
    (pickle.load with encoding 'latin1'/'bytes', then [1]), byte for byte, for float32 and float64
    ground truth; the original's scripts pair it with {id}_predict.xyz by name."""
    gt = tmp_path / "gt"
    gt.mkdir()
    for k, name in enumerate(data["ids"]):  # every other sample's points stored as float64
        source = data["root"] / "gt" / name
        if k % 2:
            image, points = pickle.load(open(source, "rb"), encoding="latin1")
            write_ground_truth(gt / name, image, points.astype(np.float64) * 1.1)
        else:
            (gt / name).write_bytes(source.read_bytes())
    evaluate_dataset(
        ToyReconstructor(),
        data["test_list"],
        data["root"],
        gt,
        tmp_path / "eval",
        batch_size=5,
        workers=2,
        progress=False,
        save_meshes=True,
        save_ground=True,
    )
    predict = tmp_path / "eval" / "predict"
    for k, name in enumerate(data["ids"]):
        points = pickle.load(open(gt / name, "rb"), encoding="latin1")[1]
        assert points.dtype == (np.float64 if k % 2 else np.float32) and points.shape[1] == 6
        ground = predict / name.replace(".dat", "_ground.xyz")
        assert ground.read_bytes() == _savetxt_bytes(points)
        assert (predict / name.replace(".dat", "_predict.xyz")).is_file()  # the name f_score.py replaces


def _outputs(out: Path) -> tuple[list, dict]:
    rows = [(r["id"], r["chamfer"], tuple(r["fscore"].values())) for r in read_csv(out / "samples.csv")]
    files = {p.name: p.read_bytes() for p in (out / "predict").iterdir()}
    return rows, files


def _toy_run(data, out: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen(
        [sys.executable, str(TESTS / "pipeline_toy.py"), str(data["test_list"]), str(data["root"]), str(out)],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


@pytest.mark.slow
def test_runs_killed_at_random_points_resume_to_the_uninterrupted_result(data, tmp_path):
    reference = tmp_path / "reference"
    assert _toy_run(data, reference).wait(timeout=300) == 0
    expected = _outputs(reference)
    assert len(expected[0]) == 12 and len(expected[1]) == 36

    rng = random.Random(11)
    out = tmp_path / "killed"
    csv_path = out / "samples.csv"

    def done() -> int:
        return len(read_csv(csv_path)) if csv_path.exists() else 0

    for _ in range(3):  # each run is killed once its CSV passes a random row count, a random moment later
        target = done() + rng.randint(1, max(1, (12 - done()) // 2))
        proc = _toy_run(data, out)
        while done() < target and proc.poll() is None:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))
        assert proc.poll() is None, "the run ended before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert done() < 12
    proc = _toy_run(data, out)
    assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()
    assert _outputs(out) == expected
    assert not list((out / "predict").glob(".*"))  # no temporary file left behind


def test_resume_rewrites_missing_or_empty_mesh_files_without_repeating_rows(data, tmp_path):
    out = tmp_path / "out"
    toy = ToyReconstructor()
    evaluate_dataset(
        toy,
        data["test_list"],
        data["root"],
        data["root"] / "gt",
        out,
        batch_size=4,
        workers=1,
        progress=False,
        save_meshes=True,
        save_ground=True,
    )
    rows, files = _outputs(out)
    stems = [i[: -len(".dat")] for i in data["ids"]]
    (out / "predict" / f"{stems[1]}_predict.obj").unlink()
    (out / "predict" / f"{stems[7]}_predict.xyz").write_text("")  # renamed into place, data lost
    (out / "predict" / f"{stems[9]}_ground.xyz").unlink()
    (out / "predict" / f".{stems[2]}_predict.xyz.123.tmp").write_text("half")  # a killed writer's temporary
    summary = evaluate_dataset(
        toy,
        data["test_list"],
        data["root"],
        data["root"] / "gt",
        out,
        batch_size=4,
        workers=1,
        progress=False,
        save_meshes=True,
        save_ground=True,
    )
    assert summary["run"]["evaluated"] == 3 and summary["run"]["skipped"] == 9
    assert _outputs(out) == (rows, files)


def test_compiled_mesh_text_is_pythons_exact_format_for_any_float32():
    from xmesh.io.exact_text import obj_vertex_text, savetxt_text

    rng = np.random.default_rng(6)
    words = rng.integers(0, 2**32, size=300_000, dtype=np.uint64).astype(np.uint32)
    values = words.view(np.float32).reshape(-1, 3)
    values = values[np.isfinite(values).all(axis=1)]  # every magnitude, subnormals included
    scaled = [(rng.normal(size=(3000, 3)) * s).astype(np.float32) for s in (1e-9, 1e-4, 0.3, 50.0, 1e7)]
    edges = np.array(
        [
            [0.0, -0.0, 1.0],
            [0.1, 0.5, 0.25],
            [9.999999e-5, 1e-4, 1e-5],
            [2.0**-20, 2.0**-126, 3.0],
            [1e-12, 1e-13, 8388607.0],
            [123456789.0, 0.000123456, 1e8],
            [np.nan, np.inf, -np.inf],
        ],
        dtype=np.float32,
    )
    for block in (values, *scaled, edges):
        numbers = tuple(block.astype(np.float64).ravel().tolist())
        assert savetxt_text(block) == ("%.18e %.18e %.18e\n" * len(block)) % numbers
        assert obj_vertex_text(block) == ("v %.9g %.9g %.9g\n" * len(block)) % numbers
    six = values[: len(values) // 2 * 2].reshape(-1, 6)  # points with normals
    assert savetxt_text(six) == ("%.18e %.18e %.18e %.18e %.18e %.18e\n" * len(six)) % tuple(
        six.astype(np.float64).ravel().tolist()
    )
