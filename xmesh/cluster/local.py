"""The clusters started on this machine: ``local:N`` and ``local-cuda``, on Dask's own ``SpecCluster``.

Each worker is a ``distributed.Nanny`` (which restarts a worker process that dies): ``local:N`` gives
N workers of one thread; ``local-cuda`` one worker per visible GPU (:mod:`.gpus`), two threads each
so that a worker decodes its next shard while the current one computes, its
``CUDA_VISIBLE_DEVICES`` naming its GPU alone (it uses no other, and on some machines CUDA's start
takes longer for each GPU a process sees) and its threads kept to that GPU's CPUs where the
machine says which they are (:class:`CpuAffinity`). Every worker gets an equal share of the
machine's memory as its limit. The client's process never touches CUDA; a ``local-cuda`` worker
starts CUDA's driver in a thread before it joins (:class:`CudaWarmup`), so that its model's build,
which starts once it has joined, finds it started. A worker's close prints nothing: its process
ends once it has closed (:class:`ExitAtClose`), and a heartbeat cut short by the close is not
reported as an error (:class:`QuietHeartbeatAtClose`).

:func:`start_local` starts the scheduler, registers the given worker plugins (e.g. the model's,
whose set-up starts the model build) and only then the workers, so that each worker starts
building as soon as it has joined, while the others start.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys

from distributed import Client, Nanny, Scheduler, SpecCluster, Status, WorkerPlugin
from distributed.system import MEMORY_LIMIT

from ..backends.cuda_driver import start_driver
from ..errors import BackendUnavailableError
from .gpus import gpu_cpus, visible_gpus

HOST = "127.0.0.1"
START_TIMEOUT_S = 120  # every worker process started and joined (they import Python packages)
LOG_LEVEL = logging.ERROR


class CpuAffinity(WorkerPlugin):
    """Keeps every thread of the worker process (those started later inherit it) on ``cpus``."""

    name = "xmesh-cpu-affinity"

    def __init__(self, cpus):
        self.cpus = sorted(cpus)

    def setup(self, worker) -> None:
        for task in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(task), self.cpus)
            except OSError:  # a thread that ended meanwhile, or CPUs taken away since the spec was made
                pass


class CudaWarmup(WorkerPlugin):
    """Starts CUDA's driver in a thread as the worker starts, before it registers with the scheduler
    (:func:`~xmesh.backends.cuda_driver.start_driver`), so that its model's build, which starts once
    it has joined, finds it started or under way."""

    name = "xmesh-cuda-warmup"

    def setup(self, worker) -> None:
        start_driver()


class ExitAtClose(WorkerPlugin):
    """Once the worker has closed (its plugins torn down: the model's pools and writers are shut and
    every result was sent), its process ends without the interpreter's clean-up, which takes a
    few tenths of a second with the model's libraries loaded and frees nothing the operating
    system would not. Removed from a running worker (no close under way), it does nothing."""

    name = "xmesh-exit-at-close"

    def teardown(self, worker) -> None:
        if worker.status in (Status.closing, Status.closing_gracefully):
            atexit.register(_exit_now)  # run first: atexit runs the last one registered first


HEARTBEAT_FAILED = "Failed to communicate with scheduler during heartbeat"
_CLOSING = (Status.closing, Status.closing_gracefully, Status.closed)


class QuietHeartbeatAtClose(WorkerPlugin):
    """Drops the worker's "failed to communicate with scheduler during heartbeat" error once the
    worker is closing: ``Worker.close`` shuts its connections while a heartbeat may still be
    waiting for its answer, and Dask logs that as an error with a traceback although nothing was
    lost. While the worker runs, the error means what it says and is kept."""

    name = "xmesh-quiet-heartbeat-at-close"

    def setup(self, worker) -> None:
        self.filter = _HeartbeatFailedWhileClosing(worker)
        logging.getLogger("distributed.worker").addFilter(self.filter)

    def teardown(self, worker) -> None:
        if worker.status not in _CLOSING:  # removed from a running worker; a closing one still needs it
            logging.getLogger("distributed.worker").removeFilter(self.filter)


class _HeartbeatFailedWhileClosing(logging.Filter):
    def __init__(self, worker):
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.worker.status in _CLOSING and record.getMessage().startswith(HEARTBEAT_FAILED))


def _exit_now() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _nanny(
    threads: int, memory_limit: int, env: dict | None = None, cpus: set | None = None, cuda: bool = False
) -> dict:
    plugins = {ExitAtClose(), QuietHeartbeatAtClose()}
    if cpus:
        plugins.add(CpuAffinity(cpus))
    if cuda:
        plugins.add(CudaWarmup())
    options = {
        "nthreads": threads,
        "memory_limit": memory_limit,
        "host": HOST,
        "silence_logs": LOG_LEVEL,
        "dashboard": False,
        "plugins": plugins,
    }
    if env:
        options["env"] = env
    return {"cls": Nanny, "options": options}


def worker_specs(kind: str, count: int | None = None, environ=None) -> dict:
    """SpecCluster's worker specs: ``kind`` 'local' (``count`` workers of one thread) or 'local-cuda'
    (one worker per GPU of :func:`~.gpus.visible_gpus`); BackendUnavailableError without a GPU."""
    if kind == "local":
        return {i: _nanny(1, MEMORY_LIMIT // count) for i in range(count)}
    devices = visible_gpus(environ)
    if not devices:
        raise BackendUnavailableError(
            "--cluster local-cuda: no GPU visible (CUDA_VISIBLE_DEVICES is empty, or the "
            "NVIDIA driver lists none); run on a machine with an NVIDIA GPU, or use "
            "local:N with --backend numpy"
        )
    specs = {}
    for i, device in enumerate(devices):
        cpus = gpu_cpus(device)
        specs[i] = _nanny(2, MEMORY_LIMIT // len(devices), env={"CUDA_VISIBLE_DEVICES": device}, cpus=cpus, cuda=True)
    return specs


def _scheduler() -> dict:
    import importlib.util

    dashboard = importlib.util.find_spec("bokeh") is not None  # the dashboard's pages need bokeh
    # the HTTP server (health, metrics, and the dashboard's pages with bokeh) on a free port
    return {"cls": Scheduler, "options": {"host": HOST, "port": 0, "dashboard": dashboard, "dashboard_address": ":0"}}


def start_local(specs: dict, plugins=()) -> tuple[SpecCluster, Client]:
    """Start a cluster of ``specs`` (:func:`worker_specs`) with ``plugins`` registered before any worker
    joins; returns it with its client once every worker has joined. Worker processes are not
    daemons (they may start loader and mesh-writer processes) while ``distributed.worker.daemon``
    is False, which the caller sets."""
    cluster = SpecCluster(workers={}, scheduler=_scheduler(), silence_logs=LOG_LEVEL, name="xmesh")
    client = None
    try:
        client = Client(cluster)
        for plugin in plugins:
            client.register_plugin(plugin)
        cluster.worker_spec.update(specs)
        cluster.scale(len(specs))
        client.wait_for_workers(len(specs), timeout=START_TIMEOUT_S)
    except BaseException:
        close_local(cluster, client)
        raise
    return cluster, client


def close_local(cluster: SpecCluster, client: Client | None) -> None:
    """Close ``client`` and ``cluster``: the workers stop, then their processes are gone."""
    if client is not None:
        client.close()
    cluster.close()
