"""``xmesh train`` around the step: data order, checkpoints, a resume after a real kill, outputs, bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from xmesh.cli import main
from xmesh.io.checkpoint import read_checkpoint
from xmesh.io.weights import expected_variables, load_weights, synthetic_weights
from xmesh.train import checkpoints
from xmesh.train.logs import read_rows

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = "synthetic:1"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Four synthetic samples in the official layout."""
    from xmesh.synthetic.dataset import write_dataset

    root = tmp_path_factory.mktemp("train_data")
    info = write_dataset(
        root, n_per_category=1, categories=("02691156", "03001627", "04379243", "02958343"), seed=3, n_points=1500
    )
    return {"root": root, "list": info["test_list"], "gt": root / "gt", "ids": info["ids"]}


def _args(dataset, out, *extra, stage: int = 1) -> list[str]:
    """``xmesh train`` of stage 1 (stage 2 with ``--starts`` in ``extra``) for one epoch over the dataset."""
    return [
        "train",
        "--stage",
        str(stage),
        "--images",
        str(dataset["root"]),
        "--gt",
        str(dataset["gt"]),
        "--list",
        str(dataset["list"]),
        "--weights",
        WEIGHTS,
        "--out",
        str(out),
        "--epochs",
        "1",
        "--no-progress",
        *extra,
    ]


@pytest.fixture(scope="module")
def trained(dataset, tmp_path_factory):
    """Two epochs of stage 1 with a checkpoint at every step, validated on the same list after each."""
    out = tmp_path_factory.mktemp("trained") / "run"
    extra = ("--checkpoint-every", "1", "--epochs", "2", "--val-list", str(dataset["list"]))
    assert main(_args(dataset, out, *extra)) == 0
    return out


@pytest.mark.slow
def test_order_is_the_originals_shuffle(dataset, trained):
    """Each epoch reads the list in the order of the original's DataFetcher: shuffled in place by
    RandomState(123) before the first epoch and again after each."""
    rows = read_rows(trained / "train_log.csv")
    expected = list(dataset["ids"])
    state = np.random.RandomState(123)
    state.shuffle(expected)
    assert [r["samples"] for r in rows if r["epoch"] == "1"] == expected
    state.shuffle(expected)
    assert [r["samples"] for r in rows if r["epoch"] == "2"] == expected
    assert [int(r["step"]) for r in rows] == list(range(1, 9))
    assert all(np.isfinite(float(r["loss"])) for r in rows)
    # epoch-end checkpoints stay, the others go once a newer one is written
    assert [step for _, step in checkpoints.listed(trained)] == [4, 8]


def test_outputs_are_read_by_every_weights_reader(trained):
    weights = np.load(trained / "weights.npz")
    names = set(expected_variables(1))
    # the same arrays as the TF checkpoint, which the original's Saver restores by these names
    tf = read_checkpoint(trained / "meshnetmvp2m.ckpt-2")
    assert set(tf) == names
    assert all(tf[n].tobytes() == weights[n].tobytes() for n in names)
    loaded = load_weights(trained / "weights.npz")
    assert len(loaded) == 237  # with stage 2's variables as given: a whole model for every command
    start = synthetic_weights(1)
    assert all(np.array_equal(loaded[n], start[n]) for n in expected_variables(2))
    assert all(not np.array_equal(loaded[n], start[n]) for n in names)  # every stage-1 variable trains
    assert (trained / "loss.png").stat().st_size > 10_000


def test_validation_each_epoch_through_the_evaluation_pipeline(trained):
    """Stage 1's coarse meshes scored after each epoch: val_log.csv's row is the epoch's summary.json."""
    import json

    rows = read_rows(trained / "val_log.csv")
    assert [(r["epoch"], r["step"], r["samples"]) for r in rows] == [("1", "4", "4"), ("2", "8", "4")]
    for row in rows:
        summary = json.loads((trained / "val" / f"epoch-00{row['epoch']}" / "summary.json").read_text())
        assert float(row["chamfer"]) == summary["mean_over_samples"]["chamfer"] > 0


@pytest.mark.slow
def test_resume_after_a_kill_equals_an_uninterrupted_run(dataset, tmp_path):
    """SIGKILL once the second checkpoint is on disk (the third step then computing); the same command
    again resumes from it, and its weights after the epoch equal the uninterrupted run's bit for bit.

    The uninterrupted run is the same command in a process of its own too: the test process's BLAS and
    numba thread settings, which other tests may change, would round otherwise."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    whole = tmp_path / "whole"
    uninterrupted = subprocess.run(
        [sys.executable, "-m", "xmesh", *_args(dataset, whole, "--checkpoint-every", "1")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert uninterrupted.returncode == 0, uninterrupted.stderr
    killed = tmp_path / "killed"
    args = ["-m", "xmesh", *_args(dataset, killed, "--checkpoint-every", "1")]
    victim = subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 300
    while not checkpoints.path_for(killed, 2).exists():
        assert victim.poll() is None and time.monotonic() < deadline, victim.communicate()
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    assert not (killed / "weights.npz").exists()
    resumed = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed at step 2" in resumed.stdout or "resumed at step 3" in resumed.stdout
    after_epoch = np.load(whole / "weights.npz")
    got = np.load(killed / "weights.npz")
    assert sorted(got.files) == sorted(after_epoch.files)
    for name in expected_variables(1):
        assert got[name].tobytes() == after_epoch[name].tobytes(), name
    # the log is the uninterrupted run's: the rows after the checkpoint were dropped and computed again
    rows_a, rows_b = read_rows(whole / "train_log.csv"), read_rows(killed / "train_log.csv")
    assert [(r["step"], r["samples"], r["loss"]) for r in rows_a] == [
        (r["step"], r["samples"], r["loss"]) for r in rows_b
    ]


def test_resume_with_other_settings_is_refused(dataset, trained, tmp_path, capsys):
    before = sorted(p.name for p in trained.rglob("*"))
    assert main(_args(dataset, trained, "--lr", "2e-5")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lr 1e-05 there, 2e-05 now" in err[0] and "--overwrite" in err[0], err
    # the run folder of a stage-1 run, resumed as stage 2
    assert main(_args(dataset, trained, "--starts", str(tmp_path), stage=2)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stage 1 there, 2 now" in err[0], err
    assert sorted(p.name for p in trained.rglob("*")) == before


def test_bad_input_one_line_exit_2_before_compute(dataset, tmp_path, capsys):
    listing = tmp_path / "list.txt"
    ids = list(dataset["ids"])

    def refused(args, *words):
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        for word in words:
            assert word in err[0], err[0]
        return err[0]

    out = tmp_path / "run"
    # a list entry without ground truth, and one without renderings
    listing.write_text("\n".join(ids + ["02691156_nothere_00.dat"]) + "\n")
    args = _args(dataset, out)
    args[args.index("--list") + 1] = str(listing)
    refused(args, "02691156_nothere_00.dat", "does not exist")
    # stage 2's starting meshes missing for a sample
    empty = tmp_path / "no_starts"
    empty.mkdir()
    refused(_args(dataset, out, "--starts", str(empty), stage=2), "--starts", "has no starting mesh")
    # weights missing a variable; the checkpoint of the other stage
    partial = dict(synthetic_weights(1, stages=1))
    del partial["meshnetmvp2m/cnn/conv2d_3/W:0"]
    np.savez(tmp_path / "partial.npz", **partial)
    args = _args(dataset, out)
    args[args.index("--weights") + 1] = str(tmp_path / "partial.npz")
    refused(args, "--weights", "conv2d_3/W:0")
    np.savez(tmp_path / "stage2.npz", **synthetic_weights(1, stages=2))
    args[args.index("--weights") + 1] = str(tmp_path / "stage2.npz")
    refused(args, "--weights", "stage-1")
    # an unwritable --out
    refused(_args(dataset, "/proc/xmesh-train"), "--out", "nothing was computed")
    assert not out.exists()


def _run_with_one_ground_truth_changed(dataset, tmp_path, step: int, change) -> tuple[str, Path, int]:
    """``xmesh train`` (a checkpoint every step) over a copy of the ground truth whose file for the
    sample of the order's ``step`` holds ``change(points)``: (that sample, the run's folder, exit code)."""
    import pickle
    import shutil

    gt = tmp_path / "gt"
    shutil.copytree(dataset["gt"], gt)
    order = list(dataset["ids"])
    np.random.RandomState(123).shuffle(order)
    bad = order[step - 1]
    with open(gt / bad, "rb") as handle:
        image, points = pickle.load(handle)
    with open(gt / bad, "wb") as handle:
        pickle.dump((image, change(points.copy())), handle, protocol=2)
    out = tmp_path / "run"
    args = _args(dataset, out, "--checkpoint-every", "1")
    args[args.index("--gt") + 1] = str(gt)
    return bad, out, main(args)


def test_a_ground_truth_found_bad_while_loading_stops_the_run_naming_it(dataset, tmp_path, capsys):
    """A ground truth that is there but holds no normals is found when a loading process reads it: the
    run stops with one line naming the sample and the file, exit 2, and keeps the checkpoints before."""
    bad, out, status = _run_with_one_ground_truth_changed(dataset, tmp_path, 2, lambda points: points[:, :3])
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"sample {bad}" in err[0] and "3 columns" in err[0], err
    assert [step for _, step in checkpoints.listed(out)] == [1]


@pytest.mark.slow
def test_non_finite_loss_stops_naming_sample_and_step(dataset, tmp_path, capsys):
    """A ground truth 1e20 away overflows the Chamfer term to infinity: the run stops at that sample's step
    with one line, before updating the weights, keeping its checkpoints (of every step before)."""

    def far(points):
        points[:, :3] *= np.float32(1e20)
        return points

    bad, out, status = _run_with_one_ground_truth_changed(dataset, tmp_path, 3, far)
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"step 3, sample(s) {bad}" in err[0] and "last good checkpoint" in err[0], err
    assert [step for _, step in checkpoints.listed(out)] == [2]
    assert not (out / "weights.npz").exists()
    assert len(read_rows(out / "train_log.csv")) == 2


@pytest.mark.slow
def test_batch_size_two_takes_one_adam_step_per_pair(dataset, tmp_path):
    """--batch-size 2 (a deviation): one Adam step per two samples of the order, the loss their mean."""
    out = tmp_path / "run"
    assert main(_args(dataset, out, "--batch-size", "2")) == 0
    rows = read_rows(out / "train_log.csv")
    order = list(dataset["ids"])
    np.random.RandomState(123).shuffle(order)
    assert [r["samples"] for r in rows] == [f"{order[0]};{order[1]}", f"{order[2]};{order[3]}"]
    state = checkpoints.latest(out)
    assert state.step == 2 and int(state.adam["step"]) == 2 and state.epoch == 1


@pytest.mark.slow
def test_overwrite_starts_afresh(dataset, trained, tmp_path):
    """--overwrite with other settings: the old run's checkpoints, logs and validation go, the new run's
    identity is recorded."""
    import json
    import shutil

    out = tmp_path / "run"
    shutil.copytree(trained, out)
    assert main(_args(dataset, out, "--lr", "2e-5", "--overwrite")) == 0
    assert json.loads((out / "run.json").read_text())["identity"]["lr"] == 2e-5
    assert [step for _, step in checkpoints.listed(out)] == [4]
    assert not (out / "val").exists() and not (out / "val_log.csv").exists()
    assert not (out / "meshnetmvp2m.ckpt-2.index").exists() and (out / "meshnetmvp2m.ckpt-1.index").exists()
    assert len(read_rows(out / "train_log.csv")) == 4


def test_validation_runs_after_the_steps_graphs_are_released(dataset, tmp_path, monkeypatch):
    """Each epoch's validation gets the device's memory: the trainer's step graphs (about 70 GiB at
    batch 32) are released before it scores (CPU: the release and the scoring recorded in order)."""
    from xmesh.train import run
    from xmesh.train.data import TrainingSet
    from xmesh.train.trainer import Trainer

    events = []

    class Scored(run.Validation):
        def score(self, stage, weights, template, backend, out_dir):
            events.append("score")
            return {"samples": 4, "mean_over_samples": {"chamfer": 1e-3, "chamfer_x1000": 1.0, "fscore": {1e-4: 0.5}}}

    trainer = Trainer(1, synthetic_weights(1), None, "numpy")
    monkeypatch.setattr(trainer, "drop_graphs", lambda: events.append("release"))
    data = TrainingSet(dataset["list"], dataset["root"], dataset["gt"])
    validation = Scored(str(dataset["list"]), str(dataset["root"]), str(dataset["gt"]))
    run.train(trainer, data, tmp_path / "run", epochs=1, validation=validation, progress=False)
    assert events == ["release", "score"]
