"""The pipeline on a Dask cluster (xmesh.distributed): the same rows as one process, a worker killed
mid-run, and the clear error without Dask."""
from __future__ import annotations

import builtins
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from xmesh import cli
from xmesh.distributed import ModelSpec, client_for
from xmesh.errors import BackendUnavailableError, InputError
from xmesh.evaluate import evaluate_dataset, read_csv
from xmesh.synthetic.dataset import write_dataset

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("ds"), n_per_category=3, seed=8)


@pytest.fixture(scope="module")
def client():
    pytest.importorskip("distributed")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])  # pipeline_toy
    c = client_for("local:2")
    yield c
    c.close()
    c.cluster.close()


def _rows(out: Path) -> dict:
    return {r["id"]: (r["chamfer"], tuple(r["fscore"].values())) for r in read_csv(out / "samples.csv")}


@pytest.mark.slow
def test_a_cluster_of_two_workers_gives_the_rows_of_one_process(data, client, tmp_path):
    spec = ModelSpec(weights=("synthetic:1",))
    args = (data["test_list"], data["root"], data["root"] / "gt")
    alone = evaluate_dataset(spec.build(), *args, tmp_path / "alone", batch_size=1, limit=3, progress=False)
    spread = evaluate_dataset(spec, *args, tmp_path / "spread", batch_size=1, limit=3, progress=False, client=client)
    assert spread["run"]["shards"] >= 2 and spread["samples"] == alone["samples"] == 3
    ours, theirs = _rows(tmp_path / "alone"), _rows(tmp_path / "spread")
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert theirs[key][0] == pytest.approx(ours[key][0], rel=1e-6)
        assert theirs[key][1] == pytest.approx(ours[key][1], abs=1e-6)


@pytest.mark.slow
def test_a_worker_killed_mid_run_leaves_every_row_once(data, client, tmp_path):
    spec = ModelSpec(factory="pipeline_toy:SlowToy")
    reference = evaluate_dataset(ModelSpec(factory="pipeline_toy:ToyReconstructor").build(), data["test_list"],
                                 data["root"], data["root"] / "gt", tmp_path / "reference", batch_size=1,
                                 progress=False, save_meshes=True)
    out = tmp_path / "killed"
    pids = list(client.run(os.getpid).values())
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(evaluate_dataset(
        spec, data["test_list"], data["root"], data["root"] / "gt", out, batch_size=1, progress=False,
        save_meshes=True, client=client)))
    worker.start()
    deadline = time.time() + 120
    while not (out / "samples.csv").exists() or len(read_csv(out / "samples.csv")) < 2:
        assert time.time() < deadline and worker.is_alive()
        time.sleep(0.05)
    os.kill(pids[0], signal.SIGKILL)   # mid-run: later shards of that worker run again elsewhere
    worker.join(timeout=300)
    assert result["samples"] == 12
    ids = [line.split(",")[0] for line in (out / "samples.csv").read_text().splitlines()[1:]]
    assert sorted(ids) == sorted(data["ids"])  # every sample once
    assert _rows(out) == _rows(tmp_path / "reference")
    files = {p.name: p.read_bytes() for p in (out / "predict").iterdir()}
    assert files == {p.name: p.read_bytes() for p in (tmp_path / "reference" / "predict").iterdir()}
    assert reference["samples"] == 12


def test_without_dask_the_cluster_option_names_the_extra(data, tmp_path, monkeypatch, capsys):
    real_import = builtins.__import__

    def no_dask(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name.split(".")[0] in ("distributed", "dask", "dask_cuda"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", no_dask)
    with pytest.raises(BackendUnavailableError, match=r'pip install "xmesh\[dask\]"'):
        client_for("local:2")
    root = data["root"]
    code = cli.main(["eval", "--images", str(root), "--gt", str(root / "gt"), "--list", str(data["test_list"]),
                     "--weights", "synthetic:1", "--out", str(tmp_path / "out"), "--cluster", "local:2"])
    assert code == 2 and 'pip install "xmesh[dask]"' in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_malformed_cluster_spec_is_a_clear_error():
    with pytest.raises(InputError, match="local:N"):
        client_for("bogus")
    with pytest.raises(InputError, match="whole number"):
        client_for("local:zero")
