"""The client's side of a run on a Dask cluster: shards out, rows in, one writer.

:func:`run_on_cluster` registers the model's plugin, has every worker build its model and start
its pools (outside the timed part, as the single-process run builds its model before it starts the
clock), then keeps a window of shards in flight: each shard is a few whole batches, and as shards
finish (in any order) their rows go to ``commit`` on the client, the one writer of samples.csv.
A worker that dies mid-shard leaves its shard to the scheduler, which runs it again on another
worker; its rows come back once, with that shard's result. A shard that kills
``distributed.scheduler.allowed-failures`` workers in a row is reported with its samples.
"""
from __future__ import annotations

import asyncio
import math
import time
from typing import Callable

from dask.base import tokenize
from distributed import KilledWorker, as_completed, wait

from ..errors import XmeshError
from ..pipeline.loop import Timing
from .worker import ModelPlugin, ShardOptions, prepare, run_shard

# batches per shard at most (GPU, CPU): small enough to spread and to rerun, long enough that the
# network's pause between two shards (the last batch's results, the next one's upload) stays ~1%
SHARD_BATCHES = {True: 8, False: 4}
PREPARE_TIMEOUT_S = 900   # building a model compiles its kernels on a fresh GPU machine: about a minute
RETRIES = 2         # reruns of a shard that raised something other than an XmeshError (e.g. a full disk)


def shard_size(batches: int, threads: int, most: int) -> int:
    """Batches per shard: ``most``, or fewer so that every worker thread gets a shard."""
    return max(1, min(int(most), math.ceil(batches / max(1, threads))))


def _threads(client) -> int:
    return sum(client.nthreads().values())


def _killed_worker_error(exc: Exception, shard: list) -> XmeshError:
    first, last = shard[0][0][0], shard[-1][-1][0]
    return XmeshError(f"samples {first} to {last}: the workers running them died repeatedly ({exc}); look for "
                      "out-of-memory kills or crashes in the workers' logs, or lower --batch-size")


def run_on_cluster(client, spec, todo: list, settings: dict, predict_dir, commit: Callable[[str], None],
                   progress_bar, views, with_gt: bool, metric_backend: str, formats=("xyz", "obj"),
                   shard_batches: int | None = None, ground_root=None) -> dict:
    """Run ``todo`` (a list of (sample, paths)) on ``client``'s workers; ``commit(text)`` gets the CSV
    lines of each finished shard; ``ground_root``: the ground truth whose ``{id}_ground.xyz`` the
    workers write beside the meshes. Returns this run's figures with its timing and the cluster's."""
    from ..evaluate import _batches

    options = ShardOptions(workers=settings["workers"], writers=settings["writers"], views=tuple(views),
                           with_gt=with_gt, metric_backend=metric_backend,
                           predict_dir=str(predict_dir) if predict_dir is not None else None, formats=tuple(formats),
                           ground_root=str(ground_root) if ground_root is not None else None)
    plugin = ModelPlugin(spec, tokenize(spec))
    client.register_plugin(plugin)
    pending: set = set()
    try:
        setup_start = time.perf_counter()
        ready = [client.submit(prepare, plugin.name, options, workers=[address], allow_other_workers=True, pure=False)
                 for address in client.nthreads()]
        try:
            wait(ready, timeout=PREPARE_TIMEOUT_S)
        except (TimeoutError, asyncio.TimeoutError):   # the same class from Python 3.11 on
            raise XmeshError(f"the workers did not build their model within {PREPARE_TIMEOUT_S} s; see the workers' "
                             "logs (the dashboard's, or `dask worker`'s output)") from None
        ready = client.gather(ready)   # a model that cannot be built fails here, once
        setup_s = time.perf_counter() - setup_start

        batches = _batches(todo, settings["batch_size"])
        per = shard_size(len(batches), _threads(client), shard_batches or SHARD_BATCHES[spec.backend == "cupy"])
        shards = [batches[i:i + per] for i in range(0, len(batches), per)]
        waiting = iter(enumerate(shards))
        running = as_completed()
        shard_of: dict = {}

        def top_up() -> None:
            window = max(4, 2 * _threads(client))
            while len(pending) < window:
                nxt = next(waiting, None)
                if nxt is None:
                    return
                index, shard = nxt
                future = client.submit(run_shard, plugin.name, index, shard, options, pure=False, retries=RETRIES)
                shard_of[future.key] = shard
                pending.add(future)
                running.add(future)

        stages = {k: 0.0 for k in Timing.STAGES}
        workers_seen: set = set()
        start = time.perf_counter()
        top_up()
        for future in running:
            pending.discard(future)
            try:
                outcome = future.result()
            except KilledWorker as exc:
                raise _killed_worker_error(exc, shard_of[future.key]) from None
            if outcome.rows:
                commit(outcome.rows)
            progress_bar.update(len(outcome.done))
            if outcome.error is not None:
                raise outcome.error
            workers_seen.add(outcome.worker)
            for k in stages:
                stages[k] += outcome.timing.get(k, 0.0)
            top_up()
        wall = time.perf_counter() - start
    finally:
        for future in pending:
            future.cancel()
        try:
            client.unregister_worker_plugin(plugin.name)
        except Exception:   # the cluster may be gone already; its workers then hold nothing of ours
            pass
    share = max(1, len(workers_seen))
    timing = {"wall": wall, **{k: v / share for k, v in stages.items()}}
    return {"evaluated": len(todo), "seconds": wall, "samples_per_s": len(todo) / wall if wall > 0 else 0.0,
            "timing": timing,
            "cluster": {"scheduler": client.scheduler.address, "workers": len(ready), "workers_used": len(workers_seen),
                        "shards": len(shards), "batches_per_shard": per, "setup_s": setup_s, "prepared": ready}}
