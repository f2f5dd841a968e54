"""The client's side of a run on a Dask cluster: shards out, rows in, one writer.

:class:`DaskExecutor` (the cluster's :class:`~xmesh.pipeline.executor.Executor`) registers the
model's plugin (whose set-up starts each worker's model build, where the cluster did not already
start it) and asks every worker to have its model, kernels and pools ready. As soon as the first
one is (the clock's first batch, as the single-process run starts it once its model is built), it
sends shards to the workers ready so far, one per thread, and once all are ready keeps a window of
two per thread in flight. Each shard is a few whole batches, and as shards finish (in any order)
their rows go to ``commit`` on the client, the one writer of samples.csv.
A worker that dies mid-shard leaves its shard to the scheduler, which runs it again on another
worker; its rows come back once, with that shard's result. A shard that kills
``distributed.scheduler.allowed-failures`` workers in a row is reported with its samples.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from pathlib import Path

from distributed import KilledWorker, as_completed, wait

from ..errors import XmeshError
from ..pipeline.loop import Timing
from ..pipeline.settings import RunSettings
from ..pipeline.startup import StartupClock
from ..pipeline.writing import remove_stray_temporaries
from .worker import model_plugin, prepare, run_shard

# batches per shard at most (GPU, CPU): small enough to spread and to rerun, long enough that the
# network's pause between two shards (the last batch's results, the next one's upload) stays ~1%
SHARD_BATCHES = {True: 8, False: 4}
PREPARE_TIMEOUT_S = 900  # building a model compiles its kernels on a fresh GPU machine: about a minute
RETRIES = 2  # reruns of a shard that raised something other than an XmeshError (e.g. a full disk)


def shard_size(batches: int, threads: int, most: int) -> int:
    """Batches per shard: ``most``, or fewer so that every worker thread gets a shard."""
    return max(1, min(int(most), math.ceil(batches / max(1, threads))))


def shard_plan(batches: int, workers: int, most: int) -> list[int]:
    """The batches of each shard, in order: ``most`` while there is plenty left, then smaller ones as
    the list runs out (the remainder over twice the workers), so that the workers finish within about
    a batch of each other instead of one shard."""
    sizes, left = [], int(batches)
    while left > 0:
        size = max(1, min(int(most), math.ceil(left / (2 * max(1, workers))), left))
        sizes.append(size)
        left -= size
    return sizes


def _peers(client) -> dict:
    """Each worker's address -> the number of workers on its host (itself included)."""
    from distributed.comm import get_address_host

    hosts = {address: get_address_host(address) for address in client.nthreads()}
    return {address: sum(h == host for h in hosts.values()) for address, host in hosts.items()}


def _threads(client) -> int:
    return sum(client.nthreads().values())


def _killed_worker_error(exc: Exception, shard: list) -> XmeshError:
    first, last = shard[0][0][0], shard[-1][-1][0]
    return XmeshError(
        f"samples {first} to {last}: the workers running them died repeatedly ({exc}); look for "
        "out-of-memory kills or crashes in the workers' logs, or lower --batch-size"
    )


class DaskExecutor:
    """Runs a dataset on ``client``'s workers, each building its model from ``spec`` (a
    :class:`~xmesh.reconstruct.ModelSpec`); ``shard_batches`` caps the batches sent to a worker at
    once (None: :data:`SHARD_BATCHES`). Its figures add ``cluster`` (the scheduler, the workers, the
    shards and each worker's set-up), and their stage seconds are per worker."""

    def __init__(self, client, spec, shard_batches: int | None = None):
        self.client = client
        self.spec = spec
        self.shard_batches = shard_batches

    def run(
        self,
        todo: list,
        settings: RunSettings,
        commit: Callable[[str], None],
        progress,
        clock: StartupClock | None = None,
    ) -> dict:
        """Run ``todo`` (a list of (sample, paths)); ``commit(text)`` gets the CSV lines of each
        finished shard; the workers' set-up is ``clock``'s ``workers`` phase. Mesh files a killed
        worker left half-written are removed afterwards."""
        info = self._run(todo, settings, commit, progress, clock or StartupClock())
        if settings.mesh_dir is not None:
            remove_stray_temporaries(Path(settings.mesh_dir))
        return info

    def _run(
        self, todo: list, settings: RunSettings, commit: Callable[[str], None], progress, clock: StartupClock
    ) -> dict:
        client, spec = self.client, self.spec
        plugin = model_plugin(spec)
        client.register_plugin(plugin)  # nothing new where the cluster was started with it
        pending: set = set()
        preparing: set = set()
        try:
            setup_start = time.perf_counter()
            peers = _peers(client)
            for address, count in peers.items():
                preparing.add(
                    client.submit(
                        prepare,
                        plugin.name,
                        settings,
                        count,
                        workers=[address],
                        allow_other_workers=True,
                        pure=False,
                        priority=1,
                    )
                )
            try:
                done, _ = wait(list(preparing), timeout=PREPARE_TIMEOUT_S, return_when="FIRST_COMPLETED")
            except (TimeoutError, asyncio.TimeoutError):  # the same class from Python 3.11 on
                raise XmeshError(
                    f"no worker built its model within {PREPARE_TIMEOUT_S} s; see the workers' "
                    "logs (the dashboard's, or `dask worker`'s output)"
                ) from None
            prepared: list[dict] = []

            def take_prepared(future) -> None:
                preparing.discard(future)
                prepared.append(future.result())  # a model that cannot be built fails here

            for future in done:
                take_prepared(future)
            setup_s = time.perf_counter() - setup_start
            clock.mark("workers")

            batches = settings.batches(todo)
            most = self.shard_batches or SHARD_BATCHES[spec.backend == "cupy"]
            per = shard_size(len(batches), _threads(client), most)
            shards, first = [], 0
            for size in shard_plan(len(batches), len(peers), per):
                shards.append(batches[first : first + size])
                first += size
            waiting = iter(enumerate(shards))
            running = as_completed(list(preparing))  # the workers still building, then the shards
            shard_of: dict = {}

            def top_up() -> None:
                """Two shards per worker thread in flight (at least 4) once every worker is ready;
                before, one per thread of the workers ready, on those workers."""
                everyone = not preparing
                threads = client.nthreads()
                ready = None if everyone else [w["worker"] for w in prepared]
                window = max(4, 2 * sum(threads.values())) if everyone else sum(threads.get(w, 1) for w in ready)
                while len(pending) < window:
                    nxt = next(waiting, None)
                    if nxt is None:
                        return
                    index, shard = nxt
                    future = client.submit(
                        run_shard,
                        plugin.name,
                        index,
                        shard,
                        settings,
                        peers,
                        pure=False,
                        retries=RETRIES,
                        workers=ready,
                        allow_other_workers=ready is not None,
                    )
                    shard_of[future.key] = shard
                    pending.add(future)
                    running.add(future)

            stages = {k: 0.0 for k in Timing.STAGES}
            workers_seen: set = set()
            started = clock.first_batch()
            start = time.perf_counter()
            top_up()
            for future in running:
                if future in preparing:
                    take_prepared(future)
                    top_up()
                    continue
                if future not in pending:
                    continue
                pending.discard(future)
                try:
                    outcome = future.result()
                except KilledWorker as exc:
                    raise _killed_worker_error(exc, shard_of[future.key]) from None
                if outcome.rows:
                    commit(outcome.rows)
                progress.update(len(outcome.done))
                if outcome.error is not None:
                    raise outcome.error
                workers_seen.add(outcome.worker)
                for k in stages:
                    stages[k] += outcome.timing.get(k, 0.0)
                top_up()
                if not pending:
                    break  # every shard is in; a worker still building has nothing left to do
            wall = time.perf_counter() - start
        finally:
            for future in (*pending, *preparing):
                future.cancel()
            try:
                client.unregister_worker_plugin(plugin.name)
            except Exception:  # the cluster may be gone already; its workers then hold nothing of ours
                pass
        share = max(1, len(workers_seen))
        timing = {"wall": wall, **{k: v / share for k, v in stages.items()}, **started}
        return {
            "evaluated": len(todo),
            "seconds": wall,
            "samples_per_s": len(todo) / wall if wall > 0 else 0.0,
            "timing": timing,
            "cluster": {
                "scheduler": client.scheduler.address,
                "workers": len(peers),
                "workers_used": len(workers_seen),
                "shards": len(shards),
                "batches_per_shard": per,
                "setup_s": setup_s,
                "prepared": prepared,
            },
        }
