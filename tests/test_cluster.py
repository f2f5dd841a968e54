"""Evaluation on a Dask cluster: the same rows and files as one process, a worker killed mid-shard,
a bad sample file, a client killed and restarted, and the errors of --cluster."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import eval_argv, requires_cuda
from pipeline_toy import ToyReconstructor, ToySpec
from xmesh import cli
from xmesh.cluster import ModelSpec, open_client, parse_cluster_spec
from xmesh.errors import BackendUnavailableError, InputError, MissingFileError, XmeshError
from xmesh.evaluate import evaluate_dataset, read_csv, reconstruct_dataset
from xmesh.synthetic.dataset import write_dataset

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """12 samples, 3 per category."""
    return write_dataset(tmp_path_factory.mktemp("ds"), n_per_category=3, seed=5)


@pytest.fixture(scope="module")
def client():
    """2 worker processes of one thread (and one BLAS thread) each, as ``--cluster local:2`` starts."""
    with open_client("local:2") as c:
        yield c


def _rows(out: Path) -> dict:
    """{id: (category, chamfer, F-scores)} of a samples.csv, which must hold each id once."""
    return {r["id"]: (r["category"], r["chamfer"], tuple(r["fscore"].values())) for r in read_csv(out / "samples.csv")}


def _files(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


# ------------------------------------------------------------------------------------ results


@pytest.mark.slow
def test_eval_on_two_workers_writes_the_rows_and_meshes_of_the_single_process_run(data, tmp_path, capsys):
    """`xmesh eval --cluster local:2` with the real network (NumPy, synthetic weights) on 2 samples, one
    per worker. BLAS is single-threaded on both sides (Dask sets it so in its workers), so every
    value is bit for bit the one of the single-process run."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        evaluate_dataset(
            ModelSpec.of("synthetic:1").build(),
            data["test_list"],
            data["root"],
            data["root"] / "gt",
            tmp_path / "alone",
            limit=2,
            workers=0,
            progress=False,
            save_meshes=True,
            save_ground=True,
        )
    spread = tmp_path / "spread"
    assert (
        cli.main(eval_argv(data, spread, "--cluster", "local:2", "--limit", "2", "--save-meshes", "--save-ground")) == 0
    )
    assert "cluster local:2: 2 worker(s)" in capsys.readouterr().err
    assert {p.name for p in spread.iterdir()} == {
        "samples.csv",
        "summary.json",
        "summary.txt",
        "f_score.log",
        "cd.log",
        "run.json",
        "predict",
    }
    run = json.loads((spread / "summary.json").read_text())["run"]
    assert run["cluster"]["workers_used"] == 2 and run["cluster"]["shards"] == 2 and run["evaluated"] == 2
    assert sorted(_rows(spread)) == sorted(data["ids"][:2])
    assert _rows(spread) == _rows(tmp_path / "alone")
    assert _files(spread / "predict") == _files(tmp_path / "alone" / "predict")
    assert len(_files(spread / "predict")) == 6  # 2 samples: prediction .xyz and .obj, ground truth .xyz


def test_toy_rows_meshes_and_reconstruct_list_equal_the_single_process_run(data, client, tmp_path):
    """12 samples in batches of 2, one batch per shard, through evaluate_dataset and reconstruct_dataset."""
    root, gt = data["root"], data["root"] / "gt"
    evaluate_dataset(
        ToyReconstructor(),
        data["test_list"],
        root,
        gt,
        tmp_path / "alone",
        batch_size=2,
        workers=0,
        progress=False,
        save_meshes=True,
    )
    summary = evaluate_dataset(
        ToySpec(),
        data["test_list"],
        root,
        gt,
        tmp_path / "spread",
        batch_size=2,
        workers=1,
        progress=False,
        save_meshes=True,
        client=client,
        shard_batches=1,
    )
    info = reconstruct_dataset(
        ToySpec(), data["test_list"], root, tmp_path / "listed", batch_size=3, workers=0, progress=False, client=client
    )
    assert summary["run"]["cluster"]["shards"] == 6 and summary["run"]["evaluated"] == 12
    assert sorted(_rows(tmp_path / "spread")) == sorted(data["ids"])
    assert _rows(tmp_path / "spread") == _rows(tmp_path / "alone")
    assert _files(tmp_path / "spread" / "predict") == _files(tmp_path / "alone" / "predict")
    meshes = {name: data for name, data in _files(tmp_path / "alone" / "predict").items() if "_predict." in name}
    assert info["evaluated"] == 12 and _files(tmp_path / "listed") == meshes  # no ground truth without --gt
    again = evaluate_dataset(
        ToySpec(), data["test_list"], root, gt, tmp_path / "spread", batch_size=2, progress=False, client=client
    )
    assert again["run"]["skipped"] == 12 and again["run"]["evaluated"] == 0


# ------------------------------------------------------------------------------------ faults


@pytest.mark.slow
def test_a_worker_killed_mid_shard_has_its_shard_rerun_and_every_sample_once(data, tmp_path):
    root, gt = data["root"], data["root"] / "gt"
    evaluate_dataset(
        ToyReconstructor(),
        data["test_list"],
        root,
        gt,
        tmp_path / "alone",
        batch_size=1,
        workers=0,
        progress=False,
        save_meshes=True,
    )
    out = tmp_path / "spread"
    with open_client("local:2") as own:
        pids = own.run(os.getpid)
        outcome: dict = {}

        def run() -> None:
            try:
                outcome["summary"] = evaluate_dataset(
                    ToySpec(delay=0.4),
                    data["test_list"],
                    root,
                    gt,
                    out,
                    batch_size=1,
                    workers=1,
                    progress=False,
                    save_meshes=True,
                    client=own,
                    shard_batches=2,
                )
            except BaseException as exc:  # handed to the test's thread
                outcome["error"] = exc

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 60
        while not ((out / "samples.csv").exists() and len(read_csv(out / "samples.csv")) >= 2):
            assert time.monotonic() < deadline and thread.is_alive(), outcome
            time.sleep(0.02)
        busy = [address for address, keys in own.processing().items() if keys and address in pids]
        assert busy, "no shard was running"
        rows_before = len(read_csv(out / "samples.csv"))
        os.kill(pids[busy[0]], signal.SIGKILL)
        thread.join(timeout=120)
        assert not thread.is_alive()
        assert "error" not in outcome, outcome.get("error")
        assert pids[busy[0]] not in own.run(os.getpid).values()
    assert rows_before < 12
    assert sorted(_rows(out)) == sorted(data["ids"])  # read_csv refuses a repeated id
    assert _rows(out) == _rows(tmp_path / "alone")
    assert _files(out / "predict") == _files(tmp_path / "alone" / "predict")  # no temporary file left either


def test_a_bad_sample_file_fails_as_in_one_process_and_leaves_only_whole_rows(data, client, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(data["root"], root, symlinks=True)
    bad = data["ids"][7]
    synset, item, _ = bad[: -len(".dat")].split("_")
    (root / "ShapeNetRendering" / synset / item / "rendering" / "06.png").write_bytes(b"not a png")
    with pytest.raises(XmeshError) as alone:
        evaluate_dataset(
            ToyReconstructor(),
            root / "test_list.txt",
            root,
            root / "gt",
            tmp_path / "alone",
            batch_size=2,
            workers=0,
            progress=False,
        )
    with pytest.raises(XmeshError) as spread:
        evaluate_dataset(
            ToySpec(),
            root / "test_list.txt",
            root,
            root / "gt",
            tmp_path / "spread",
            batch_size=2,
            workers=1,
            progress=False,
            save_meshes=True,
            client=client,
            shard_batches=1,
        )
    assert type(spread.value) is type(alone.value)
    assert str(spread.value) == str(alone.value) and str(spread.value).startswith(f"sample {bad}:")
    rows = _rows(tmp_path / "spread")  # every line whole
    assert bad not in rows and data["ids"][6] not in rows  # nothing of the failed batch
    evaluate_dataset(
        ToyReconstructor(),
        data["test_list"],
        data["root"],
        data["root"] / "gt",
        tmp_path / "good",
        batch_size=2,
        workers=0,
        progress=False,
    )
    expected = _rows(tmp_path / "good")
    assert all(expected[k] == v for k, v in rows.items())


def test_weights_the_workers_cannot_read_fail_once_before_any_row(data, client, tmp_path):
    with pytest.raises(MissingFileError, match="nowhere.npz: weights file not found"):
        evaluate_dataset(
            ModelSpec.of(tmp_path / "nowhere.npz"),
            data["test_list"],
            data["root"],
            data["root"] / "gt",
            tmp_path / "out",
            progress=False,
            client=client,
        )
    assert read_csv(tmp_path / "out" / "samples.csv") == []
    left = client.run(lambda dask_worker: [name for name in dask_worker.plugins if name.startswith("xmesh-model-")])
    assert len(left) == 2 and all(names == [] for names in left.values())  # the model plugin was removed


def _toy_client_run(data, out: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen(
        [
            sys.executable,
            str(TESTS / "pipeline_toy.py"),
            str(data["test_list"]),
            str(data["root"]),
            str(out),
            "local:2",
        ],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


@pytest.mark.slow
def test_a_client_killed_with_its_cluster_resumes_to_the_uninterrupted_result(data, tmp_path):
    evaluate_dataset(
        ToyReconstructor(),
        data["test_list"],
        data["root"],
        data["root"] / "gt",
        tmp_path / "alone",
        batch_size=2,
        workers=0,
        progress=False,
        save_meshes=True,
        save_ground=True,
    )
    out = tmp_path / "spread"
    csv_path = out / "samples.csv"
    proc = _toy_client_run(data, out)
    deadline = time.monotonic() + 120
    while not (csv_path.exists() and len(read_csv(csv_path)) >= 4):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode() if proc.poll() else ""
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the client, its scheduler and its workers
    proc.wait(timeout=60)
    assert len(read_csv(csv_path)) < 12
    proc = _toy_client_run(data, out)
    assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()
    assert _rows(out) == _rows(tmp_path / "alone")
    assert _files(out / "predict") == _files(tmp_path / "alone" / "predict")


# ------------------------------------------------------------------------------------ --cluster


@pytest.mark.parametrize(
    "spec, why",
    [
        ("local:0", "at least 1 worker"),
        ("local:x", "not a cluster"),
        ("local", "not a cluster"),
        ("gpu", "not a cluster"),
        ("http://host:8786", "not a cluster"),
        ("tcp://host", "not a cluster"),
    ],
)
def test_a_malformed_cluster_spec_is_refused_naming_the_forms(spec, why):
    with pytest.raises(InputError, match=why) as info:
        parse_cluster_spec(spec)
    assert spec in str(info.value)
    if why == "not a cluster":
        assert "local:N" in str(info.value) and "tcp://HOST:PORT" in str(info.value)


def test_cluster_specs_parse():
    assert parse_cluster_spec("local:3") == ("local", 3)
    assert parse_cluster_spec("local-cuda") == ("local-cuda", None)
    assert parse_cluster_spec("tcp://10.0.0.5:8786") == ("address", "tcp://10.0.0.5:8786")
    assert parse_cluster_spec("sched.json") == ("file", "sched.json")


@pytest.mark.parametrize(
    "cluster, backend, missing, extra",
    [
        ("local:2", "numpy", "distributed", "dask"),
        ("local-cuda", "cupy", "distributed", "dask"),
    ],
)
def test_cluster_without_dask_fails_at_once_naming_the_extra(
    data, tmp_path, monkeypatch, capsys, cluster, backend, missing, extra
):
    monkeypatch.setitem(sys.modules, missing, None)  # `import` of it then fails, as when it is not installed
    with pytest.raises(BackendUnavailableError, match=f'pip install "xmesh-p2mpp\\[{extra}\\]"'):
        with open_client(cluster):
            pass
    start = time.monotonic()
    assert cli.main(eval_argv(data, tmp_path / "out", "--cluster", cluster, "--backend", backend)) == 2
    assert time.monotonic() - start < 10
    err = capsys.readouterr().err
    assert f'pip install "xmesh-p2mpp[{extra}]"' in err and f"--cluster {cluster}" in err
    assert not (tmp_path / "out").exists()  # nothing started, nothing written
    listed = [
        "reconstruct",
        "--list",
        str(data["test_list"]),
        "--images",
        str(data["root"]),
        "--weights",
        "synthetic:1",
        "--out",
        str(tmp_path / "rec"),
        "--cluster",
        cluster,
        "--backend",
        backend,
    ]
    assert cli.main(listed) == 2
    assert f'pip install "xmesh-p2mpp[{extra}]"' in capsys.readouterr().err


def test_local_cuda_with_the_numpy_backend_is_refused(data, tmp_path, capsys):
    assert cli.main(eval_argv(data, tmp_path / "out", "--cluster", "local-cuda")) == 2
    assert "--backend cupy" in capsys.readouterr().err


@requires_cuda
def test_local_cuda_rows_equal_the_single_process_run(data, tmp_path):
    listed = tmp_path / "four.txt"
    listed.write_text("".join(f"{i}\n" for i in data["ids"][:4]))
    spec = ModelSpec.of("synthetic:1", backend="cupy")
    evaluate_dataset(
        spec.build(),
        listed,
        data["root"],
        data["root"] / "gt",
        tmp_path / "alone",
        batch_size=2,
        progress=False,
        save_meshes=True,
    )
    with open_client("local-cuda") as gpu_client:
        evaluate_dataset(
            spec,
            listed,
            data["root"],
            data["root"] / "gt",
            tmp_path / "spread",
            batch_size=2,
            progress=False,
            save_meshes=True,
            client=gpu_client,
            shard_batches=1,
        )
    assert _rows(tmp_path / "spread") == _rows(tmp_path / "alone")
    assert _files(tmp_path / "spread" / "predict") == _files(tmp_path / "alone" / "predict")


# ------------------------------------------------------------------------- a worker's loop


def _feed_items(root: Path, list_file: Path) -> list:
    from xmesh.dataset import read_list, sample_paths

    return [(s, sample_paths(s, root, root / "gt", (0, 6, 7))) for s in read_list(list_file)]


def _feed(delay: float = 0.0):
    from xmesh.cluster.feed import ShardFeed
    from xmesh.pipeline.loop import LoopBuffers
    from xmesh.pipeline.settings import RunSettings

    settings = RunSettings(batch_size=2, loaders=0, writers=0, views=(0, 6, 7), with_gt=True, metric_backend="auto")
    return ShardFeed(ToyReconstructor(delay), settings, 0, None, None, LoopBuffers())


def _through_feed(feed, shards: list) -> tuple[list, dict]:
    """Each shard from its own thread at once, as a worker's task threads hand them in."""
    from concurrent.futures import ThreadPoolExecutor

    from xmesh.pipeline.writing import BatchFinisher

    def one(batches):
        rows = {}
        finisher = BatchFinisher(lambda r: rows.update(zip(map(str, r.samples), r.scores["chamfer"].tolist())))
        shard = feed.run(batches, finisher)
        finisher.close()
        return shard, rows

    with ThreadPoolExecutor(len(shards)) as pool:
        done = list(pool.map(one, shards))
    return [s for s, _ in done], {k: v for _, rows in done for k, v in rows.items()}


def test_one_loop_fed_shard_after_shard_gives_the_rows_of_one_run(data):
    """Three shards handed to one worker's loop at once: every sample comes back once, to its own
    shard, with the chamfer of a single run over the whole list, and the shards' timings add up to
    the loop's."""
    from xmesh.pipeline.loop import run_batches
    from xmesh.pipeline.settings import RunSettings

    items = _feed_items(data["root"], data["test_list"])
    batches = [items[i : i + 2] for i in range(0, len(items), 2)]
    expected = {}
    run_batches(
        ToyReconstructor(),
        batches,
        lambda r: expected.update(zip(map(str, r.samples), r.scores["chamfer"].tolist())),
        RunSettings(batch_size=2, loaders=0, writers=0),
    )
    feed = _feed(delay=0.02)
    try:
        shards, rows = _through_feed(feed, [batches[0:2], batches[2:4], batches[4:6]])
    finally:
        feed.close()
    assert rows == expected and len(rows) == len(items)
    assert all(s.error is None and s.left == 0 for s in shards)
    assert sum(s.timing["network"] for s in shards) == pytest.approx(feed.timing.network)
    assert not feed.thread.is_alive()


def test_a_bad_file_fails_only_its_shard_in_the_loop(data, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(data["root"], root, symlinks=True)
    bad = data["ids"][5]  # shard 2 (batches 2 and 3), batch 2's second sample
    synset, item, _ = bad[: -len(".dat")].split("_")
    (root / "ShapeNetRendering" / synset / item / "rendering" / "06.png").write_bytes(b"not a png")
    items = _feed_items(root, root / "test_list.txt")
    batches = [items[i : i + 2] for i in range(0, len(items), 2)]
    feed = _feed()
    try:
        shards, rows = _through_feed(feed, [batches[0:2], batches[2:4], batches[4:6]])
    finally:
        feed.close()
    assert shards[0].error is None and shards[2].error is None
    assert isinstance(shards[1].error, XmeshError) and str(shards[1].error).startswith(f"sample {bad}:")
    assert set(rows) == {str(s) for s, _ in items[:4] + items[8:]}  # nothing of the failed shard


class _FailsOnce(ToyReconstructor):
    failed = False

    def run(self, images, cameras):
        if not _FailsOnce.failed:
            _FailsOnce.failed = True
            raise RuntimeError("a device error")
        return super().run(images, cameras)


def test_a_loop_stopped_by_another_error_fails_its_shard_and_the_next_shard_runs_on_a_new_loop(data):
    """Not an XmeshError (e.g. a device fault): the shard raises it, so Dask retries it, and the
    worker starts a new loop for the retry."""
    from xmesh.cluster.worker import WorkerModel
    from xmesh.pipeline.settings import RunSettings
    from xmesh.pipeline.writing import BatchFinisher

    items = _feed_items(data["root"], data["test_list"])
    batches = [items[i : i + 2] for i in range(0, 4, 2)]
    settings = RunSettings(batch_size=2, loaders=0, writers=0, views=(0, 6, 7), with_gt=True, metric_backend="auto")
    state = WorkerModel(ToySpec())
    state.model = _FailsOnce()
    try:
        first = state.feed(settings)
        with pytest.raises(RuntimeError, match="a device error"):
            first.run(batches, BatchFinisher(lambda r: None))
        rows = []
        finisher = BatchFinisher(lambda r: rows.extend(map(str, r.samples)))
        assert state.feed(settings) is not first
        assert state.feed(settings).run(batches, finisher).error is None
        finisher.close()
        assert rows == [str(s) for s, _ in items[:4]]
    finally:
        state.close()
