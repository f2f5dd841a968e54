"""A worker's one batch loop, fed by the shards it is given.

A shard task hands its batches to its worker's :class:`ShardFeed` and waits for them. One thread
runs :func:`xmesh.pipeline.loop.run_batches` over the batches of every shard in arrival order, so
the pipeline (batches decoded ahead, uploads beside the compute, results read one batch late) does
not drain and restart at each shard's edge: with two task threads per worker the next shard's
batches are queued while the current one's compute. Results go back to their shard by its first
sample id. A bad sample file or a non-finite prediction fails only its shard (the rows finished
before it are kept); anything else stops the loop and fails the shards waiting on it, which Dask
then retries, and the next shard starts a new loop.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from concurrent.futures import Executor
from dataclasses import replace

from ..errors import XmeshError
from ..pipeline.loading import PREFETCH_DEPTH, assemble, decoded, submit_batch
from ..pipeline.loop import BatchResult, LoopBuffers, Timing, check_finite, run_batches
from ..pipeline.writing import BatchFinisher, MeshWriter, prediction_stem


class Shard:
    """One shard in the loop: its batches, the finisher that commits its rows once their meshes are
    written, the XmeshError that stopped it (``error``) or the loop's failure (``failure``), its
    share of the loop's stage seconds (``timing``), and ``done``, set when all of it is through."""

    def __init__(self, batches: list, finisher: BatchFinisher):
        self.batches = batches
        self.left = len(batches)
        self.finisher = finisher
        self.error: XmeshError | None = None
        self.failure: BaseException | None = None
        self.timing: dict = {}
        self.done = threading.Event()
        if not batches:
            self.done.set()

    def fail(self, exc: XmeshError) -> None:
        if self.error is None:
            self.error = exc
        self.done.set()

    def batch_done(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.done.set()


class StreamLoader:
    """Decode the batches of the shards that arrive on ``inbox`` (``(shard, batch)`` items; None ends
    it) up to ``depth`` batches ahead, in ``pool`` (inline without one). It yields None when nothing
    is decoded or waiting, so that the loop finishes its batch in flight before the next shard comes.
    A batch with a bad file fails its shard; a failed shard's other batches are skipped."""

    def __init__(
        self,
        inbox: queue.Queue,
        pool: Executor | None,
        workers: int,
        views: tuple,
        with_gt: bool,
        depth: int = PREFETCH_DEPTH,
    ):
        self.inbox, self.pool, self.workers = inbox, pool, int(workers)
        self.views, self.with_gt, self.depth = tuple(views), bool(with_gt), int(depth)
        self.wait_s = 0.0
        self.owners: dict[str, Shard] = {}  # first sample id of each batch handed to the loop

    def __iter__(self):
        pending: deque = deque()
        ended = False

        def take(block: bool) -> bool:
            nonlocal ended
            while not ended:
                try:
                    item = self.inbox.get(block=block)
                except queue.Empty:
                    return False
                if item is None:
                    ended = True
                    return False
                shard, batch = item
                if shard.error is not None:
                    continue
                pending.append((shard, batch, submit_batch(self.pool, batch, self.views, self.with_gt)))
                return True
            return False

        try:
            while True:
                while len(pending) <= self.depth and take(block=False):
                    pass
                if not pending:
                    if ended:
                        return
                    yield None
                    take(block=True)
                    continue
                shard, batch, futures = pending.popleft()
                start = time.perf_counter()
                try:
                    loaded = decoded(batch, futures, self.views, self.with_gt)
                except XmeshError as exc:
                    shard.fail(exc)
                    continue
                finally:
                    self.wait_s += time.perf_counter() - start
                if shard.error is None:
                    self.owners[str(batch[0][0])] = shard
                    yield assemble(batch, loaded)
        finally:
            for _, _, futures in pending:
                for f in futures or ():
                    f.cancel()


class ShardFeed:
    """One worker's loop for one run's settings; :meth:`run` queues a shard and waits for it."""

    def __init__(
        self, model, settings, loaders: int, pool: Executor | None, writer: MeshWriter | None, buffers: LoopBuffers
    ):
        self.model, self.settings, self.loaders, self.writer, self.buffers = model, settings, loaders, writer, buffers
        self.inbox: queue.Queue = queue.Queue()
        self.loader = StreamLoader(self.inbox, pool, loaders, settings.views, settings.with_gt)
        self.timing = Timing()
        self.lock = threading.Lock()
        self.shards: set[Shard] = set()
        self.broken: BaseException | None = None
        self.last = self._totals()
        self.thread = threading.Thread(target=self._loop, name="xmesh-feed", daemon=True)
        self.thread.start()

    def _on_batch(self, result: BatchResult) -> None:
        shard = self.loader.owners.pop(str(result.samples[0]))
        if shard.error is not None:
            return
        try:
            check_finite(result)
            futures = (
                self.writer.submit([prediction_stem(s) for s in result.samples], result.vertices)
                if self.writer is not None
                else []
            )
            shard.finisher.put(result, futures)
        except XmeshError as exc:
            shard.fail(exc)
            return
        shard.batch_done()

    def _loop(self) -> None:
        try:
            run_batches(
                self.model,
                [],
                self._on_batch,
                replace(self.settings, loaders=self.loaders),
                loader=self.loader,
                buffers=self.buffers,
                timing=self.timing,
            )
        except BaseException as exc:  # handed to every shard waiting, and to the next one to come
            with self.lock:
                self.broken = exc
                for shard in self.shards:
                    shard.failure = exc
                    shard.done.set()

    def _totals(self) -> dict:
        totals = {k: getattr(self.timing, k) for k in Timing.STAGES}
        totals["input_wait"] = self.loader.wait_s
        totals["wall"] = time.perf_counter()
        return totals

    def run(self, batches: list, finisher: BatchFinisher) -> Shard:
        """Put ``batches`` through the loop; returns their Shard once every batch went through (its
        rows are committed by ``finisher``) or one failed with an XmeshError (``Shard.error``).
        Raises what stopped the loop. The shard's ``timing``: the loop's stage seconds since the
        shard before it finished."""
        shard = Shard(batches, finisher)
        with self.lock:
            if self.broken is not None:
                raise self.broken
            self.shards.add(shard)
        for batch in batches:
            self.inbox.put((shard, batch))
        shard.done.wait()
        with self.lock:
            self.shards.discard(shard)
            now = self._totals()
            shard.timing = {k: now[k] - self.last[k] for k in now}
            self.last = now
        if shard.failure is not None:
            raise shard.failure
        return shard

    def close(self) -> None:
        self.inbox.put(None)
        self.thread.join(timeout=60)
