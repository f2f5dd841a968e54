"""A batch's way through a worker's model in two halves, so that the host's work on one batch
overlaps the device's work on another: ``launch`` stacks the batch's views, starts their upload and
queues the network, returning before the network has run; ``collect`` waits for that batch's results
and returns them on the host (:class:`Computed`). A worker launches batch k+1 before it collects
batch k; batches run in the order they were launched.

On the GPU (:class:`GpuBatches`) both halves must be called from one thread (a worker's main thread):
CuPy's current stream is per thread, and every stream and event here is ordered by that thread's
calls. The views are stacked into the pinned buffers of a :class:`~xmesh.pipeline.staging.Stager`
and uploaded on its side stream; the thread's current stream waits for that upload (an event), runs
the network and copies the results into pinned host memory; ``collect`` waits for an event recorded
after that copy. On the CPU (:class:`HostBatches`) the network runs in a thread of its own, one batch
after another, while the caller's thread stacks the next batch and answers the last.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from xmesh.io.images import images_to_unit
from xmesh.pipeline.staging import Stager, copy_to_host, pinned_buffer


@dataclass
class Computed:
    """A batch's results on the host: ``coarse`` and ``refined`` vertices (B, N, 3); ``start``, ``end``:
    ``time.monotonic()`` when the device began the batch (its views uploaded, the batch before it
    done) and when its results were on the host."""

    coarse: np.ndarray
    refined: np.ndarray
    start: float
    end: float


class HostBatches:
    """The NumPy backend's two halves: ``launch`` stacks the views and hands the batch to the network's
    thread; ``collect`` waits for it there."""

    def __init__(self, model):
        self.model = model
        self.network = ThreadPoolExecutor(max_workers=1, thread_name_prefix="xmesh-network")

    def launch(self, views: list[np.ndarray], cameras: np.ndarray) -> Future:
        return self.network.submit(self._run, np.stack(views), cameras)

    def _run(self, images: np.ndarray, cameras: np.ndarray) -> Computed:
        start = time.monotonic()
        coarse, refined = self.model.run(images_to_unit(np, images), cameras)
        to_numpy = self.model.backend.to_numpy
        return Computed(to_numpy(coarse), to_numpy(refined), start, time.monotonic())

    def collect(self, job: Future) -> Computed:
        return job.result()


@dataclass
class _GpuJob:
    started: Any  # event: the device begins the batch
    done: Any  # event: the results are in ``host``
    host: tuple  # pinned (coarse, refined), views of ``buffers``
    buffers: dict  # the pinned buffer set the results were copied into


class GpuBatches:
    """The CuPy backend's two halves (see the module docstring): the views go up through a Stager's
    pinned slots on its side stream; the network and the copy back run on the calling thread's current
    stream. Each batch in flight copies its results into a pinned buffer set of its own, taken at its
    launch and given back at its collect (so there are as many sets as batches were ever in flight)."""

    def __init__(self, model):
        self.model = model
        self.cupy = model.backend.cupy
        self.stager = Stager(self.cupy)
        self.free_buffers: list[dict] = []

    def launch(self, views: list[np.ndarray], cameras: np.ndarray) -> _GpuJob:
        cupy, backend = self.cupy, self.model.backend
        stream = cupy.cuda.get_current_stream()
        name = f"images_{views[0].dtype}"  # a buffer a dtype: 8-bit and float32 batches in turn keep theirs
        slot, device = self.stager.stage({name: views})
        self.stager.wait(slot)
        started = stream.record()
        try:
            coarse, refined = self.model.run(images_to_unit(backend.xp, device[name]), cameras)
        finally:
            # float32 views are read by the network itself: the slot is free once the network has run
            self.stager.release(slot)
        buffers = self.free_buffers.pop() if self.free_buffers else {}
        host = []
        for key, result in (("coarse", coarse), ("refined", refined)):
            result = cupy.ascontiguousarray(result)
            host.append(pinned_buffer(buffers, key, result.shape, result.dtype))
            copy_to_host(cupy, result, host[-1])
        return _GpuJob(started, stream.record(), tuple(host), buffers)

    def collect(self, job: _GpuJob) -> Computed:
        job.done.synchronize()
        end = time.monotonic()
        seconds = self.cupy.cuda.get_elapsed_time(job.started, job.done) / 1000.0
        # copies: the answers outlive the buffers' next use (the answer queues pickle them later)
        computed = Computed(np.array(job.host[0]), np.array(job.host[1]), end - seconds, end)
        self.free_buffers.append(job.buffers)
        return computed


def batches_for(model) -> HostBatches | GpuBatches:
    """The two halves for ``model``'s backend."""
    return GpuBatches(model) if model.backend.name == "cupy" else HostBatches(model)
