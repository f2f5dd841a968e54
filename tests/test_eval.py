"""xmesh eval: the dataset reader, the progress bar, the evaluation loop (CSV, resume, summary), the CLI."""

from __future__ import annotations

import json
import math
import pickle
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import eval_argv, requires_cuda
from xmesh import cli
from xmesh.dataset import SampleId, check_sample, load_ground_truth, read_list, sample_paths
from xmesh.errors import FileFormatError, MissingFileError, UnsafePickleError
from xmesh.evaluate import CSV_COLUMNS, evaluate_dataset, format_table, read_csv, repair_csv, summary_from_rows
from xmesh.io.images import images_to_unit
from xmesh.io.weights import synthetic_weights
from xmesh.metrics import THRESHOLDS, evaluate
from xmesh.pipeline.loading import BatchLoader, load_sample
from xmesh.reconstruct import Reconstructor
from xmesh.synthetic.dataset import write_dataset, write_ground_truth

CATS = ("02691156", "03001627", "04379243")
ID = "02691156_d004d0e86ea3d77a65a6ed5c458f6a32_00.dat"


# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """3 samples, one per category, in the official layout."""
    return write_dataset(tmp_path_factory.mktemp("ds"), n_per_category=1, categories=CATS, seed=3)


@pytest.fixture(scope="module")
def model():
    return Reconstructor(synthetic_weights(1))


@pytest.fixture(scope="module")
def evaluated(data, tmp_path_factory):
    """Run 1: --limit 2 in one batch of 2; then a half-written row is appended (an interrupted
    write); run 2 (no limit, batch 1) resumes. 3 samples reconstructed in all."""
    out = tmp_path_factory.mktemp("eval") / "out"
    assert cli.main(eval_argv(data, out, "--limit", "2", "--batch-size", "2", "--workers", "2")) == 0
    first = (out / "samples.csv").read_text()
    first_summary = json.loads((out / "summary.json").read_text())
    with open(out / "samples.csv", "a") as handle:
        handle.write(data["ids"][2] + ",04379243,12.5,0.01")  # no newline: cut mid-row
    assert cli.main(eval_argv(data, out, "--workers", "1")) == 0
    return {
        "out": out,
        "first": first,
        "first_summary": first_summary,
        "rows": read_csv(out / "samples.csv"),
        "summary": json.loads((out / "summary.json").read_text()),
    }


# ------------------------------------------------------------------------------------ dataset.py


def test_read_list_skips_blanks_and_comments_and_folders(tmp_path):
    path = tmp_path / "list.txt"
    path.write_text(f"# test split\n\n{ID}\n  data/p2m/03001627_ab-c_d.e_01.dat   # a comment\n\n")
    samples = read_list(path)
    assert samples == [
        SampleId("02691156", "d004d0e86ea3d77a65a6ed5c458f6a32", "00"),
        SampleId("03001627", "ab-c_d.e", "01"),
    ]
    assert [str(s) for s in samples] == [ID, "03001627_ab-c_d.e_01.dat"]


@pytest.mark.parametrize(
    "line, why",
    [
        ("02691156_abc_00.png", "'.dat'"),
        ("02691156_00.dat", "three parts"),
        ("plane_abc_00.dat", "synset 'plane'"),
        ("02691156_abc_x0.dat", "view 'x0'"),
        ("02691156_a$c_00.dat", "item 'a$c'"),
        (f"{ID} {ID}", "more than one field"),
    ],
)
def test_read_list_names_the_malformed_line(tmp_path, line, why):
    path = tmp_path / "list.txt"
    path.write_text(f"{ID}\n\n{line}\n")
    with pytest.raises(FileFormatError) as info:
        read_list(path)
    assert f"{path}" in str(info.value) and "line 3" in str(info.value) and why in str(info.value)


def test_read_list_refuses_repeats_empty_lists_and_missing_files(tmp_path):
    path = tmp_path / "list.txt"
    path.write_text(f"{ID}\n{ID}\n")
    with pytest.raises(FileFormatError, match="line 2: .* repeats line 1"):
        read_list(path)
    path.write_text("# nothing\n\n")
    with pytest.raises(FileFormatError, match="holds no sample ids"):
        read_list(path)
    with pytest.raises(MissingFileError, match="nope.txt"):
        read_list(tmp_path / "nope.txt")


def test_sample_paths_follow_the_official_layout(tmp_path):
    (tmp_path / "ShapeNetRendering").mkdir()
    sample = SampleId.parse(ID)
    folder = tmp_path / "ShapeNetRendering" / "02691156" / "d004d0e86ea3d77a65a6ed5c458f6a32" / "rendering"
    for root in (tmp_path, tmp_path / "ShapeNetRendering"):  # the dataset root or ShapeNetRendering itself
        paths = sample_paths(sample, root, tmp_path / "gt")
        assert paths.images == (str(folder / "00.png"), str(folder / "06.png"), str(folder / "07.png"))
        assert paths.cameras == str(folder / "rendering_metadata.txt")
        assert paths.gt == str(tmp_path / "gt" / ID)
    assert Path(sample_paths(ID, tmp_path, tmp_path, views=(1, 2, 13)).images[2]).name == "13.png"
    with pytest.raises(MissingFileError) as info:
        check_sample(sample, paths)
    assert ID in str(info.value) and "00.png" in str(info.value)


def test_load_ground_truth_returns_xyz_and_validates(tmp_path):
    rng = np.random.default_rng(0)
    points = rng.normal(size=(50, 6)).astype(np.float32)
    path = write_ground_truth(tmp_path / "a.dat", np.zeros((4, 4, 4), np.uint8), points)
    xyz = load_ground_truth(path)
    assert xyz.shape == (50, 3) and xyz.dtype == np.float32
    np.testing.assert_array_equal(xyz, points[:, :3])

    bad = points.copy()
    bad[7, 1] = np.nan
    for name, payload, message in [
        ("nan.dat", (np.zeros(1), bad), "1 ground-truth point.* row 7"),
        ("shape.dat", (np.zeros(1), points[:, :2]), r"shape \(50, 2\)"),
        ("three.dat", (1, 2, 3), "3 items"),
        ("flat.dat", (np.zeros(1), points[0]), r"shape \(6,\)"),
    ]:
        write_ground_truth(tmp_path / name, *payload) if len(payload) == 2 else (tmp_path / name).write_bytes(
            pickle.dumps(payload, protocol=2)
        )
        with pytest.raises(FileFormatError, match=message) as info:
            load_ground_truth(tmp_path / name)
        assert name in str(info.value)
    (tmp_path / "evil.dat").write_bytes(pickle.dumps((np.zeros(1), shutil.rmtree), protocol=2))
    with pytest.raises(UnsafePickleError, match="evil.dat"):
        load_ground_truth(tmp_path / "evil.dat")
    with pytest.raises(MissingFileError, match="none.dat"):
        load_ground_truth(tmp_path / "none.dat")


def test_load_sample_errors_name_the_sample(data, tmp_path):
    sample = SampleId.parse(data["ids"][0])
    paths = sample_paths(sample, data["root"], data["root"] / "gt")
    images, cameras, gt, decode_s, gt_s = load_sample(sample, paths)
    assert images.shape == (3, 224, 224, 3) and images.dtype == np.uint8
    assert cameras.shape == (3, 5) and gt.shape == (4000, 3) and decode_s > 0 and gt_s > 0
    broken = tmp_path / "broken.dat"
    broken.write_bytes(b"not a pickle")
    with pytest.raises(FileFormatError) as info:
        load_sample(sample, paths.__class__(paths.images, paths.cameras, broken))
    assert str(info.value).startswith(f"sample {sample}: ") and "broken.dat" in str(info.value)


def test_prefetching_loader_yields_the_inline_batches_in_order(data):
    items = [(SampleId.parse(i), sample_paths(i, data["root"], data["root"] / "gt")) for i in data["ids"]]
    batches = [items[:2], items[2:]]
    inline = list(BatchLoader(batches, workers=0))
    threaded = list(BatchLoader(batches, workers=2, depth=2))  # two worker processes
    assert [len(b) for b in threaded] == [2, 1]
    for a, b in zip(inline, threaded):
        assert [str(s) for s in a.samples] == [str(s) for s in b.samples]
        np.testing.assert_array_equal(a.images, b.images)
        np.testing.assert_array_equal(a.cameras, b.cameras)
        for x, y in zip(a.gts, b.gts):
            np.testing.assert_array_equal(x, y)


# ------------------------------------------------------------------------------------ CSV + summary


def test_run_settings_defaults_and_overrides(monkeypatch):
    """One frozen value per run: the CPU's and the GPU's defaults, ``workers`` setting the loaders
    (and, with meshes, as many writers), the cluster's per-worker choice, and batches cut by size."""
    from xmesh.pipeline import settings as settings_module
    from xmesh.pipeline.settings import GPU_BATCH, RunSettings

    monkeypatch.setattr(settings_module, "default_workers", lambda gpu, writers: (7, 2) if gpu and writers else (5, 0))
    cpu = RunSettings.choose(False)
    assert (cpu.batch_size, cpu.loaders, cpu.writers, cpu.views, cpu.with_gt) == (1, 5, 0, (0, 6, 7), True)
    gpu = RunSettings.choose(True, save_meshes=True, views=[1, 2, 3], mesh_dir="out")
    assert (gpu.batch_size, gpu.loaders, gpu.writers, gpu.views) == (GPU_BATCH, 7, 2, (1, 2, 3))
    assert RunSettings.choose(True, 8, 0, save_meshes=True).as_summary() == {
        "batch_size": 8,
        "workers": 0,
        "writers": 1,
    }
    assert RunSettings.choose(True, 8, 3).as_summary() == {"batch_size": 8, "workers": 3, "writers": 0}
    per_worker = gpu.chosen_by_workers()
    assert (per_worker.loaders, per_worker.writers, per_worker.mesh_dir) == (None, None, "out")
    assert gpu == RunSettings.choose(True, save_meshes=True, views=(1, 2, 3), mesh_dir="out")  # lists kept as tuples
    with pytest.raises(AttributeError):
        gpu.batch_size = 2
    assert RunSettings.choose(False, 4).batches(list(range(10))) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_summary_of_known_rows_and_csv_repair(tmp_path):
    path = tmp_path / "samples.csv"
    rows = [
        ("a_1_00.dat", "02691156", 10.0, 0.002, (10, 20, 30, 40)),
        ("a_2_00.dat", "02691156", 20.0, 0.004, (30, 40, 50, 60)),
        ("b_1_00.dat", "03001627", 30.0, 0.009, (0, 10, 20, 30)),
    ]
    text = (
        ",".join(CSV_COLUMNS)
        + "\n"
        + "".join(f"{i},{c},{ms},{cd},{','.join(map(str, f))}\n" for i, c, ms, cd, f in rows)
    )
    path.write_text(text + "b_2_00.dat,0300")  # an interrupted last write
    assert repair_csv(path) is True and path.read_text() == text and repair_csv(path) is False
    summary = summary_from_rows(read_csv(path))
    airplane = summary["categories"]["02691156"]
    assert airplane["name"] == "airplane" and airplane["count"] == 2
    assert airplane["chamfer"] == pytest.approx(0.003) and airplane["chamfer_x1000"] == pytest.approx(3.0)
    assert airplane["fscore"] == {"5e-05": 20.0, "0.0001": 30.0, "0.00015": 40.0, "0.0002": 50.0}
    assert summary["mean_over_categories"]["chamfer"] == pytest.approx(0.006)
    assert summary["mean_over_samples"]["chamfer"] == pytest.approx(0.005)
    assert summary["mean_over_categories"]["fscore"]["0.0001"] == pytest.approx(20.0)
    assert summary["mean_ms_per_sample"] == pytest.approx(20.0)
    # the original's f_score.py averages all 13 categories, an absent one as 0: (3 + 9) / 13 x1000, (30 + 10) / 13
    over_13 = summary["mean_over_13_categories"]
    assert over_13["count"] == 3 and over_13["chamfer_x1000"] == pytest.approx(12.0 / 13)
    assert over_13["fscore"]["0.0001"] == pytest.approx(40.0 / 13)
    table = format_table(summary)
    assert "airplane" in table and "3.0000" in table and "30.00" in table
    # the table's mean lines: label, then count, CD, CD x1000, F(tau), F(2tau)
    lines = {
        line[:23].split(None, 1)[1].strip(): [float(v) for v in line[23:].split()]
        for line in table.splitlines()
        if line.startswith("mean ")
    }
    assert lines["(present)"][2] == pytest.approx(6.0) and lines["(present)"][3] == 20.0
    # the samples column counts samples in every row: 3 in the two categories, 3 in all
    assert {label: values[0] for label, values in lines.items()} == {"(present)": 3, "(samples)": 3}
    assert table.splitlines()[0].split()[2] == "samples"
    # the original's 13-category mean (absent as 0) is no row of the table, but its own labelled line
    original = next(line for line in table.splitlines() if line.startswith("the original scripts' mean"))
    assert "absent ones as 0" in original and "not a quality figure" in original
    figures = dict(re.findall(r"(CD x1000|F\(tau\)) ([0-9.]+)", original))
    assert float(figures["CD x1000"]) == pytest.approx(12.0 / 13, abs=1e-4)
    assert float(figures["F(tau)"]) == pytest.approx(40.0 / 13, abs=0.005)

    path.write_text(text + "c_1_00.dat,02691156,1,2\n")
    with pytest.raises(FileFormatError, match="line 5: 4 fields"):
        read_csv(path)
    path.write_text("id,category,chamfer\n")
    with pytest.raises(FileFormatError, match="header"):
        read_csv(path)


# ------------------------------------------------------------------------------------ end to end


def test_eval_csv_holds_every_sample_once_with_finite_metrics(evaluated, data):
    first_ids = [line.split(",")[0] for line in evaluated["first"].splitlines()[1:]]
    assert first_ids == data["ids"][:2]  # --limit 2
    assert evaluated["first_summary"]["samples"] == 2
    lines = (evaluated["out"] / "samples.csv").read_text().splitlines()
    assert lines[0] == ",".join(CSV_COLUMNS)
    assert lines[0] == "id,category,ms,chamfer,f_5e-05,f_0.0001,f_0.00015,f_0.0002"
    ids = [r["id"] for r in evaluated["rows"]]
    assert ids == data["ids"]  # the cut row dropped, resumed ones not repeated, no duplicates
    for row in evaluated["rows"]:
        assert row["category"] == row["id"][:8]
        assert math.isfinite(row["chamfer"]) and row["chamfer"] > 0 and row["ms"] > 0
        assert all(math.isfinite(f) and 0 <= f <= 100 for f in row["fscore"].values())
    # run 1 did both samples in one batch: they share the batch time
    assert evaluated["rows"][0]["ms"] == evaluated["rows"][1]["ms"]


def test_eval_metrics_equal_a_recomputation(evaluated, data, model):
    row = evaluated["rows"][2]  # evaluated alone (batch 1) by the resumed run
    sample = SampleId.parse(row["id"])
    images, cameras, gt, _, _ = load_sample(sample, sample_paths(sample, data["root"], data["root"] / "gt"))
    mesh = model.reconstruct_batch([images_to_unit(np, images)], [cameras])[0]
    expected = evaluate(mesh.vertices, gt, THRESHOLDS)
    assert row["chamfer"] == pytest.approx(expected["chamfer"], rel=1e-6)
    for tau in THRESHOLDS:
        assert row["fscore"][tau] == pytest.approx(expected["fscore"][tau], abs=1e-9)


def test_eval_summary_covers_all_rows_of_both_runs(evaluated, data):
    summary = evaluated["summary"]
    assert summary["samples"] == 3
    assert {c: v["count"] for c, v in summary["categories"].items()} == {c: 1 for c in CATS}
    assert [v["name"] for v in summary["categories"].values()] == ["airplane", "chair", "table"]
    chamfers = [r["chamfer"] for r in evaluated["rows"]]
    assert summary["mean_over_samples"]["chamfer"] == pytest.approx(np.mean(chamfers), rel=1e-12)
    assert summary["categories"]["04379243"]["chamfer"] == evaluated["rows"][2]["chamfer"]
    assert summary["run"]["evaluated"] == 1 and summary["run"]["skipped"] == 2
    assert summary["run"]["repaired_last_line"] is True
    assert "synthetic weights" in summary["meta"]["weights"]
    text = (evaluated["out"] / "summary.txt").read_text()
    assert "table" in text and f"{summary['mean_over_samples']['chamfer_x1000']:.4f}" in text


def test_eval_again_evaluates_nothing_and_prints_the_table(evaluated, data, capsys):
    before = (evaluated["out"] / "samples.csv").read_text()
    assert cli.main(eval_argv(data, evaluated["out"])) == 0
    captured = capsys.readouterr()
    assert (evaluated["out"] / "samples.csv").read_text() == before
    assert "airplane" in captured.out and "weights: synthetic weights (recipe seed 1" in captured.out
    assert "3 sample(s) already in" in captured.err


def test_eval_malformed_list_line_is_a_clear_error(data, tmp_path, capsys):
    bad = tmp_path / "list.txt"
    bad.write_text(f"{data['ids'][0]}\n02691156-broken\n")
    args = eval_argv(data, tmp_path / "out")
    args[args.index("--list") + 1] = str(bad)
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "xmesh eval: error:" in err and "line 2" in err and "02691156-broken" in err
    assert not (tmp_path / "out" / "samples.csv").exists()


def test_eval_missing_ground_truth_names_the_sample_before_computing(data, tmp_path, capsys, model):
    (tmp_path / "gt").mkdir()
    args = eval_argv(data, tmp_path / "out")
    args[args.index("--gt") + 1] = str(tmp_path / "gt")
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert f"sample {data['ids'][0]}: ground-truth file" in err and str(tmp_path / "gt" / data["ids"][0]) in err
    with pytest.raises(MissingFileError, match="does not exist"):
        evaluate_dataset(model, data["test_list"], data["root"], tmp_path / "gt", tmp_path / "out2", progress=False)
    rows = tmp_path / "out2" / "samples.csv"
    assert not rows.exists() or rows.read_text().count("\n") <= 1


@requires_cuda
def test_eval_on_cupy_matches_numpy(evaluated, data, tmp_path):
    gpu = Reconstructor(synthetic_weights(1), backend="cupy")
    summary = evaluate_dataset(
        gpu,
        data["test_list"],
        data["root"],
        data["root"] / "gt",
        tmp_path / "gpu",
        batch_size=2,
        workers=2,
        progress=False,
    )
    assert summary["samples"] == 3
    cpu = {r["id"]: r for r in evaluated["rows"]}
    for row in read_csv(tmp_path / "gpu" / "samples.csv"):
        assert row["chamfer"] == pytest.approx(cpu[row["id"]]["chamfer"], rel=1e-3)
