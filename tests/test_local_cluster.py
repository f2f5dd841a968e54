"""The clusters started here (``local:N``, ``local-cuda``): the GPUs found without CUDA, each worker's
spec, the model built as a worker joins, a run that does not wait for a worker still building, and
a close that leaves no process and prints nothing, and pool processes that end once their owner
is killed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pipeline_toy import GatedSpec, ToyReconstructor, ToySpec
from xmesh.cluster import open_client
from xmesh.cluster.gpus import gpu_cpus, parse_cpu_list, visible_gpus
from xmesh.errors import BackendUnavailableError
from xmesh.evaluate import evaluate_dataset, read_csv
from xmesh.synthetic.dataset import write_dataset

distributed = pytest.importorskip("distributed")
psutil = pytest.importorskip("psutil")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """8 samples, 2 per category."""
    return write_dataset(tmp_path_factory.mktemp("ds"), n_per_category=2, seed=3)


def _rows(out: Path) -> dict:
    return {r["id"]: (r["chamfer"], tuple(r["fscore"].values())) for r in read_csv(out / "samples.csv")}


def _fake_driver(root: Path, buses: list[str], cpulists: dict) -> tuple[Path, Path]:
    """A /proc/driver/nvidia/gpus with a folder per bus id, and a /sys/bus/pci/devices with local_cpulist."""
    driver, pci = root / "gpus", root / "pci"
    for bus in buses:
        (driver / bus).mkdir(parents=True)
    for bus, text in cpulists.items():
        (pci / bus.lower()).mkdir(parents=True)
        (pci / bus.lower() / "local_cpulist").write_text(text + "\n")
    return driver, pci


# ------------------------------------------------------------------------------------ the GPUs


def test_visible_gpus_follow_cuda_visible_devices_as_cuda_reads_it(tmp_path):
    driver, _ = _fake_driver(tmp_path, ["0000:1b:00.0", "0000:3d:00.0"], {})
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,0,3"}, driver) == ["2", "0", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1, GPU-8e1f"}, driver) == ["1", "GPU-8e1f"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1,,2"}, driver) == ["1"]  # CUDA stops at an empty entry
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, driver) == []


def test_without_cuda_visible_devices_the_driver_lists_the_gpus(tmp_path):
    driver, _ = _fake_driver(tmp_path, ["0000:3d:00.0", "0000:1b:00.0", "0000:b1:00.0"], {})
    assert visible_gpus({}, driver, use_nvml=False) == ["0", "1", "2"]
    assert visible_gpus({}, tmp_path / "absent", use_nvml=False) == []


def test_a_gpus_cpus_come_from_its_pci_device_in_bus_order(tmp_path):
    own = sorted(os.sched_getaffinity(0))
    buses = ["0000:B1:00.0", "0000:1b:00.0"]  # bus order: 1b first
    driver, pci = _fake_driver(tmp_path, buses, {"0000:1b:00.0": f"{own[0]}", "0000:B1:00.0": f"0-{own[-1]},9999"})
    assert gpu_cpus("0", driver, pci) == {own[0]}
    assert gpu_cpus("1", driver, pci) == set(own)  # CPUs this process may not use are left out
    assert gpu_cpus("2", driver, pci) is None and gpu_cpus("GPU-8e1f", driver, pci) is None
    assert gpu_cpus("0", tmp_path / "absent", pci) is None
    assert parse_cpu_list("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11}


def test_local_cuda_gives_one_two_thread_worker_per_gpu_with_its_devices(monkeypatch):
    from distributed import Nanny

    from xmesh.cluster.local import CudaWarmup, ExitAtClose, QuietHeartbeatAtClose, worker_specs

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,GPU-8e1f")
    specs = worker_specs("local-cuda")
    assert sorted(specs) == [0, 1]
    # each worker sees its own GPU alone
    assert [s["options"]["env"] for s in specs.values()] == [
        {"CUDA_VISIBLE_DEVICES": "3"},
        {"CUDA_VISIBLE_DEVICES": "GPU-8e1f"},
    ]
    for spec in specs.values():
        assert spec["cls"] is Nanny and spec["options"]["nthreads"] == 2
        kinds = {type(p) for p in spec["options"]["plugins"]}
        assert {ExitAtClose, QuietHeartbeatAtClose, CudaWarmup} <= kinds
    cpu = worker_specs("local", 3)
    assert len(cpu) == 3 and all(s["options"]["nthreads"] == 1 and "env" not in s["options"] for s in cpu.values())
    assert not any(isinstance(p, CudaWarmup) for s in cpu.values() for p in s["options"]["plugins"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(BackendUnavailableError, match="no GPU visible"):
        worker_specs("local-cuda")


# ------------------------------------------------------------------------------------ start and close


def _model_built(plugin_name: str, dask_worker=None) -> bool:
    plugin = dask_worker.plugins.get(plugin_name)
    return plugin is not None and plugin.state is not None and plugin.state.model is not None


def test_a_worker_builds_its_model_as_it_joins_before_any_task(tmp_path):
    from xmesh.cluster.worker import model_plugin

    spec = ToySpec()
    with open_client("local:1", model=spec) as client:
        name = model_plugin(spec).name
        deadline = time.monotonic() + 60
        while not all(client.run(_model_built, name).values()):
            assert time.monotonic() < deadline, "the model was not built without a task asking for it"
            time.sleep(0.05)


def test_the_run_starts_on_the_first_worker_ready_without_waiting_for_the_others(data, tmp_path):
    """Two workers; the second one's build waits for a file that appears only after the run: the run
    ends with every row, all from the first worker."""
    root, gt = data["root"], data["root"] / "gt"
    evaluate_dataset(
        ToyReconstructor(), data["test_list"], root, gt, tmp_path / "alone", batch_size=2, workers=0, progress=False
    )
    (tmp_path / "gates").mkdir()
    spec = GatedSpec(str(tmp_path / "gates"))
    try:
        with open_client("local:2", model=spec) as client:
            summary = evaluate_dataset(
                spec,
                data["test_list"],
                root,
                gt,
                tmp_path / "spread",
                batch_size=2,
                workers=0,
                progress=False,
                client=client,
                shard_batches=1,
            )
            (tmp_path / "gates" / "gate").touch()
    finally:
        (tmp_path / "gates" / "gate").touch()
    cluster = summary["run"]["cluster"]
    assert cluster["workers"] == 2 and cluster["workers_used"] == 1 and len(cluster["prepared"]) == 1
    assert _rows(tmp_path / "spread") == _rows(tmp_path / "alone")


def test_closing_a_local_cluster_leaves_no_process_and_prints_nothing(data, tmp_path, capfd):
    """The workers (each with its loader processes) are gone when the client's context ends, and
    neither they nor the close print a warning or a traceback."""
    import dask

    root = data["root"]
    # not daemons, as local-cuda's workers: each starts its loaders as processes
    with dask.config.set({"distributed.worker.daemon": False}), open_client("local:2", model=ToySpec()) as client:
        evaluate_dataset(
            ToySpec(),
            data["test_list"],
            root,
            root / "gt",
            tmp_path / "out",
            batch_size=2,
            workers=1,
            progress=False,
            save_meshes=True,
            client=client,
        )
        workers = [psutil.Process(pid) for pid in client.run(os.getpid).values()]
        family = workers + [child for w in workers for child in w.children(recursive=True)]
        assert len(family) > len(workers)  # the loaders' forkserver, at least
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
    _, alive = psutil.wait_procs(family, timeout=10)  # a forkserver ends once its worker has gone
    assert alive == []
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Warning" not in err and "ERROR" not in err, err
    assert len(read_csv(tmp_path / "out" / "samples.csv")) == len(data["ids"])


def test_a_close_while_heartbeats_wait_for_their_answer_prints_nothing(monkeypatch, capfd):
    """The scheduler (in this process) holds back its answers to heartbeats as the cluster closes,
    so each worker shuts its connections with a heartbeat still waiting: without
    QuietHeartbeatAtClose every worker prints Dask's heartbeat error and its traceback."""
    import asyncio

    from distributed import Scheduler

    held, answer = [], Scheduler.heartbeat_worker

    def late_answer(self, *args, **kwargs):
        if not held:  # as Dask calls it, also directly as a worker joins
            return answer(self, *args, **kwargs)

        async def later():  # the scheduler's comm handler awaits a coroutine
            await asyncio.sleep(3.0)
            return answer(self, *args, **kwargs)

        return later()

    monkeypatch.setattr(Scheduler, "heartbeat_worker", late_answer)  # bound as the scheduler starts
    with open_client("local:2") as client:
        assert len(client.run(os.getpid)) == 2
        held.append(True)
        time.sleep(1.0)  # every worker has sent a heartbeat since, and waits for its answer
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ERROR" not in err, err


def test_a_heartbeat_that_fails_while_the_worker_closes_is_not_logged():
    """Worker.close shuts the worker's connections while a heartbeat may wait for its answer; that
    failure is dropped once the worker is closing, kept while it runs, and the filter leaves with a
    plugin removed from a running worker."""
    import logging
    from types import SimpleNamespace

    from distributed import Status

    from xmesh.cluster.local import HEARTBEAT_FAILED, QuietHeartbeatAtClose

    logger, seen = logging.getLogger("distributed.worker"), []
    handler = logging.Handler()
    handler.emit = seen.append
    logger.addHandler(handler)
    worker, plugin = SimpleNamespace(status=Status.running), QuietHeartbeatAtClose()
    try:
        plugin.setup(worker)
        logger.error(HEARTBEAT_FAILED + ".")
        worker.status = Status.closing
        logger.error(HEARTBEAT_FAILED + ".")
        logger.error("Some other failure while closing")
        worker.status = Status.closed
        logger.error(HEARTBEAT_FAILED + ".")
        worker.status = Status.running
        plugin.teardown(worker)
        worker.status = Status.closing
        logger.error(HEARTBEAT_FAILED + ".")
    finally:
        logger.removeHandler(handler)
        logger.removeFilter(plugin.filter)
    assert [(r.getMessage(), r.levelno) for r in seen] == [
        (HEARTBEAT_FAILED + ".", logging.ERROR),
        ("Some other failure while closing", logging.ERROR),
        (HEARTBEAT_FAILED + ".", logging.ERROR),
    ]


def test_pool_processes_end_once_their_owner_is_killed(tmp_path):
    """A process that starts a loader pool and is killed outright (as a cluster's worker may be)
    never shuts its pool down: its loaders, and the forkserver they came from, end on their own."""
    import signal
    import subprocess
    import sys

    script = (
        "from xmesh.pipeline.loading import start_pool\n"
        "import os, sys, time\n"
        "if __name__ == '__main__':\n"
        "    pool = start_pool(2)\n"
        "    pids = {pool.submit(os.getpid).result() for _ in range(20)}\n"
        "    print(' '.join(map(str, pids)), flush=True)\n"
        "    time.sleep(120)\n"
    )
    (tmp_path / "owner.py").write_text(script)
    owner = subprocess.Popen([sys.executable, str(tmp_path / "owner.py")], stdout=subprocess.PIPE, text=True)
    try:
        loaders = [psutil.Process(int(pid)) for pid in owner.stdout.readline().split()]
        family = loaders + [psutil.Process(loaders[0].ppid())]  # the forkserver
        assert loaders and all(p.is_running() for p in family)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    _, alive = psutil.wait_procs(family, timeout=15)
    assert alive == []
