"""What runs on a Dask worker: the model, built once per worker, and shards of whole batches.

:class:`ModelPlugin` carries a :class:`~xmesh.reconstruct.ModelSpec` to every worker, those that
join later included. Its :class:`WorkerModel` builds the Reconstructor on first use and keeps it,
with its captured graphs, its loader pool and its mesh writers, until the plugin is removed.

:func:`run_shard` puts one shard through the worker's one batch loop (:mod:`.feed`, the
single-process pipeline's :func:`xmesh.pipeline.loop.run_batches`, fed shard after shard) and
returns its CSV lines once the shard's mesh files are on disk. An :class:`~xmesh.errors.XmeshError`
(a bad sample file, a non-finite prediction) comes back as a value beside the rows finished before
it, so the client commits those and raises it unchanged; other exceptions are left to Dask's retries.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from distributed import WorkerPlugin, get_worker

from ..errors import XmeshError
from ..pipeline.heap import keep_batch_memory
from ..pipeline.loading import default_workers, host_share, start_pool
from ..pipeline.loop import BatchResult, LoopBuffers
from ..pipeline.settings import RunSettings
from ..pipeline.writing import BatchFinisher, MeshWriter
from ..results.samples_csv import format_rows
from .feed import ShardFeed

PLUGIN_PREFIX = "xmesh-model-"


@dataclass
class ShardOutcome:
    """A finished shard: the CSV lines of its scored samples (empty without ground truth), the ids
    done, its stage timing (seconds), the worker's address, and the error that stopped it, if any."""

    index: int
    rows: str
    done: list[str]
    timing: dict
    worker: str
    error: XmeshError | None = None


class WorkerModel:
    """One worker's Reconstructor (built with its kernels in a thread from :meth:`start_build`, or
    on first use), the pools its shards share and its batch loop for each run's settings."""

    def __init__(self, spec):
        self.spec = spec
        self.model = None
        self.model_lock = threading.Lock()  # taken inside setup_lock, never around it
        self.setup_lock = threading.RLock()
        self.build_s = {"model_s": 0.0, "kernels_s": 0.0}
        self.loader_pools: dict[int, object] = {}
        self.writers: dict[tuple, MeshWriter] = {}
        self.running: ShardFeed | None = None  # the loop of the run under way
        self.loop_buffers = LoopBuffers()  # one loop runs at a time
        self.peers = 1  # workers on this host, this one included (told by the client in ``prepare``)
        self.closed = False  # torn down: a task still running (a late ``prepare``) starts nothing more

    def processes(self, settings: RunSettings) -> tuple[int, int]:
        """(loader, mesh writer) processes: the run's, or this worker's defaults for its share of the
        host's cores (:func:`~xmesh.pipeline.loading.host_share`; ``local-cuda`` also narrows a
        worker's CPU affinity to its GPU's CPUs)."""
        if settings.loaders is not None:
            return settings.loaders, settings.writers
        return default_workers(self.spec.gpu, settings.mesh_dir is not None, host_share(self.peers))

    def reconstructor(self):
        """The model with its kernels loaded (built here if no build ran or the one started failed)."""
        with self.model_lock:
            if self.model is None:
                start = time.perf_counter()
                model = self.spec.build()
                built = time.perf_counter()
                model.backend.load_kernels()
                self.build_s = {"model_s": round(built - start, 3), "kernels_s": round(time.perf_counter() - built, 3)}
                self.model = model
            return self.model

    def start_build(self) -> None:
        """Build the model in a thread now (a failure is raised again by the next :meth:`reconstructor`)."""

        def build():
            try:
                self.reconstructor()
            except BaseException:  # the task that needs the model builds it again and reports the error
                pass

        threading.Thread(target=build, name="xmesh-model-build", daemon=True).start()

    def loader_pool(self, workers: int):
        with self.setup_lock:
            self._check_open()
            if workers > 0 and workers not in self.loader_pools:
                self.loader_pools[workers] = start_pool(workers)
            return self.loader_pools.get(workers)

    def mesh_writer(self, settings: RunSettings) -> MeshWriter | None:
        if settings.mesh_dir is None:
            return None
        faces = self.reconstructor().faces
        writers = self.processes(settings)[1]
        key = (settings.mesh_dir, settings.formats, writers, settings.ground_root)
        with self.setup_lock:
            if key not in self.writers:
                self.writers[key] = MeshWriter(
                    Path(settings.mesh_dir), faces, writers, settings.formats, settings.ground_root
                )
            return self.writers[key]

    def feed(self, settings: RunSettings) -> ShardFeed:
        """The batch loop for ``settings``, started on first use (again after a failure stopped it)."""
        with self.setup_lock:
            self._check_open()
            feed = self.running
            if feed is None or feed.settings != settings or feed.broken is not None:
                if feed is not None:  # another run's loop, or a stopped one: done with
                    feed.close()
                loaders = self.processes(settings)[0]
                if feed is not None and feed.settings == settings and loaders in self.loader_pools:
                    self.loader_pools.pop(loaders).shutdown(wait=False, cancel_futures=True)  # it may have stopped it
                pool = self.loader_pool(loaders)  # its processes start while the model is built
                self.running = feed = ShardFeed(
                    self.reconstructor(), settings, loaders, pool, self.mesh_writer(settings), self.loop_buffers
                )
            return feed

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this worker's model plugin was removed (the run is over)")

    def close(self) -> None:
        with self.setup_lock:
            self.closed = True
            if self.running is not None:
                self.running.close()
                self.running = None
            for writer in self.writers.values():
                writer.close()
            for pool in self.loader_pools.values():
                pool.shutdown(wait=True, cancel_futures=True)
            self.writers.clear()
            self.loader_pools.clear()
            self.loop_buffers = LoopBuffers()
            self.model = None


class ModelPlugin(WorkerPlugin):
    """Delivers a model spec to each worker once; ``name`` is the spec's token, and registering the
    same spec again (a resumed run) keeps the model a worker has already built."""

    idempotent = True

    def __init__(self, spec, token: str):
        self.spec = spec
        self.token = token
        self.name = PLUGIN_PREFIX + token
        self.state: WorkerModel | None = None

    def __getstate__(self) -> dict:
        return {"spec": self.spec, "token": self.token, "name": self.name, "state": None}

    def setup(self, worker) -> None:
        keep_batch_memory(one_arena=True)  # the nanny's MALLOC_TRIM_THRESHOLD_; the loop runs in a thread
        self.state = WorkerModel(self.spec)
        self.state.start_build()  # while the other workers join and the client lists the samples

    def teardown(self, worker) -> None:
        if self.state is not None:
            self.state.close()
            self.state = None


def model_plugin(spec) -> ModelPlugin:
    """The plugin of ``spec`` (a :class:`~xmesh.reconstruct.ModelSpec`), named by its token."""
    from dask.base import tokenize

    return ModelPlugin(spec, tokenize(spec))


def _state(plugin_name: str) -> WorkerModel:
    plugin = get_worker().plugins.get(plugin_name)
    if plugin is None or plugin.state is None:
        raise RuntimeError(
            f"worker {get_worker().address} has no model plugin {plugin_name!r} (registered after this task was sent?)"
        )
    return plugin.state


def prepare(plugin_name: str, settings: RunSettings, peers: int = 1) -> dict:
    """Start this worker's pools and batch loop before its first shard arrives, with its model built
    and its kernels loaded (the build started with the plugin, so mostly waited for here);
    ``peers``: the workers on this worker's host. Returns what it chose, the seconds of this task and
    those of the model's build and kernels."""
    start = time.perf_counter()
    state = _state(plugin_name)
    state.peers = max(1, int(peers))
    loaders, writers = state.processes(settings)
    state.loader_pool(loaders)  # its processes start while the model is built
    state.reconstructor()
    state.feed(settings)  # the mesh writers and the loop
    return {
        "worker": get_worker().address,
        "seconds": round(time.perf_counter() - start, 3),
        **state.build_s,
        "loaders": loaders,
        "writers": writers if settings.mesh_dir is not None else 0,
        "cores": host_share(state.peers),
        "peers": state.peers,
    }


def run_shard(
    plugin_name: str, index: int, batches: list, settings: RunSettings, peers: dict | None = None
) -> ShardOutcome:
    """Reconstruct (and score) ``batches``; the outcome's rows are complete and their mesh files whole
    and synced when it returns. ``peers``: each worker's number of workers on its host, as
    :func:`prepare` takes it (a shard may reach a worker whose ``prepare`` has not run yet)."""
    state = _state(plugin_name)
    if peers:
        state.peers = max(1, int(peers.get(get_worker().address, state.peers)))
    rows: list[str] = []
    done: list[str] = []

    def commit(result: BatchResult) -> None:
        if settings.with_gt:
            rows.append(format_rows(result))
        done.extend(str(s) for s in result.samples)

    finisher = BatchFinisher(commit)
    timing: dict = {}
    error = None
    try:
        shard = state.feed(settings).run(batches, finisher)
        error, timing = shard.error, shard.timing
    except XmeshError as exc:  # the loop stopped on it (e.g. a batch the GPU cannot hold)
        error = exc
    finally:
        try:
            finisher.close()
        except XmeshError as exc:
            error = error or exc
    if timing:
        timing["write"] = finisher.busy_s + finisher.mesh_s / max(1, state.processes(settings)[1])
    return ShardOutcome(index, "".join(rows), done, timing, get_worker().address, error)
