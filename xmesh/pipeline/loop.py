"""The batch loop shared by ``xmesh eval`` and ``xmesh reconstruct --list`` (see the package docstring).

:func:`run_batches` reconstructs (and, with ground truth, scores) every batch and calls
``on_batch(BatchResult)`` in order, from the loop's thread, as each batch's results reach the host.
On the GPU batch k is queued before the loop waits for batch k-1, so the GPU is never left without
work while the host handles results; :class:`Timing` says where the time went.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..dataset import SampleId, SamplePaths
from ..errors import XmeshError
from ..io.images import images_to_unit
from ..metrics import THRESHOLDS, evaluate
from ..metrics.batch import evaluate_batch, pad_clouds
from .loading import BatchLoader, HostBatch
from .settings import RunSettings
from .staging import Stager, copy_to_host, pinned_buffer

GT_ROWS_STEP = 1024  # padded ground truth grows in steps of this many points, so buffers are reused


@dataclass
class Timing:
    """Seconds per stage of one run. ``decode`` and ``ground_truth`` are the loader's busy seconds
    divided by its workers (the wall time they take when spread evenly); ``upload``, ``network`` and
    ``metrics`` are GPU time on the GPU (host time on the CPU); ``write``: the writer processes'
    seconds divided by their number plus the CSV commits; ``input_wait``: the loop blocked on the
    loader; ``gpu_idle``: the GPU had nothing to do between batches (0 on the CPU)."""

    wall: float = 0.0
    decode: float = 0.0
    ground_truth: float = 0.0
    upload: float = 0.0
    network: float = 0.0
    metrics: float = 0.0
    write: float = 0.0
    input_wait: float = 0.0
    gpu_idle: float = 0.0

    STAGES = ("decode", "ground_truth", "upload", "network", "metrics", "write", "input_wait", "gpu_idle")

    def as_dict(self) -> dict:
        return {"wall": self.wall, **{k: getattr(self, k) for k in self.STAGES}}

    def largest(self) -> str:
        return max(self.STAGES, key=lambda k: getattr(self, k))


def format_timing(timing: dict) -> str:
    """One line: the wall time and each stage's seconds, largest first."""
    stages = sorted(((k, v) for k, v in timing.items() if k in Timing.STAGES), key=lambda kv: -kv[1])
    return f"time {timing['wall']:.2f} s: " + ", ".join(f"{k} {v:.2f}" for k, v in stages)


@dataclass
class BatchResult:
    """One batch on the host: the samples, predicted vertices (B, N, 3) float32 (None unless asked
    for), the scores (``chamfer`` (B,), ``fscore`` (B, T), ``finite`` (B,); None without ground
    truth) and the network's milliseconds per sample."""

    samples: list[SampleId]
    vertices: np.ndarray | None
    scores: dict | None
    ms: float
    extra: dict = field(default_factory=dict)


def check_finite(result: BatchResult) -> None:
    """Refuse a scored batch whose prediction holds NaN or infinite coordinates, naming the sample."""
    if result.scores is not None:
        bad = np.flatnonzero(~result.scores["finite"])
        if bad.size:
            raise XmeshError(
                f"sample {result.samples[bad[0]]}: the network's prediction holds NaN or infinite "
                "coordinates; check the weights (and --precision) used"
            )


def _gt_arrays(host: HostBatch) -> tuple[np.ndarray, np.ndarray]:
    longest = max(len(g) for g in host.gts)
    size = -(-longest // GT_ROWS_STEP) * GT_ROWS_STEP
    return pad_clouds(host.gts, size=size)


def _host_scores(vertices: np.ndarray, gts: list[np.ndarray], metric_backend: str) -> dict:
    """Per-sample metrics on the host through :func:`xmesh.metrics.evaluate` ('scipy' or 'faiss')."""
    rows = [evaluate(v, g, THRESHOLDS, backend=metric_backend) for v, g in zip(vertices, gts)]
    return {
        "chamfer": np.array([r["chamfer"] for r in rows]),
        "fscore": np.array([[r["fscore"][t] for t in THRESHOLDS] for r in rows]),
        "finite": np.ones(len(rows), dtype=bool),
    }


class LoopBuffers:
    """What the GPU loop keeps from one :func:`run_batches` call to the next over the same model (a
    cluster worker's shards): the staging slots, the metrics' stream and the pinned result buffers.
    Fresh ones would be allocated and grown again at every call, and each growth waits for the GPU."""

    def __init__(self) -> None:
        self.stager: Stager | None = None
        self.metric_stream = None
        self.results: list[dict] = [{}, {}]


def run_batches(
    reconstructor,
    batches: list[list[tuple[SampleId, SamplePaths]]],
    on_batch: Callable[[BatchResult], None],
    settings: RunSettings,
    loader_pool=None,
    loader: BatchLoader | None = None,
    buffers: LoopBuffers | None = None,
    timing: Timing | None = None,
) -> Timing:
    """Run every batch; see the module docstring. ``settings`` (:class:`~xmesh.pipeline.settings.RunSettings`):
    the loader processes, views, scoring (``metric_backend`` 'auto' scores where the network ran, in
    one batched pass; 'scipy'/'faiss' per sample on the host; 'cupy' on the GPU), and with a
    ``mesh_dir`` the predicted vertices are kept for the writers. ``loader``: the caller's source of
    decoded batches instead of a BatchLoader over ``batches`` (e.g. a cluster worker's, fed shard
    after shard).
    ``buffers``: GPU buffers kept across calls (one call at a time may use them). ``timing``: the
    Timing to add to, which another thread may read while the loop runs. A ``loader`` may yield
    None when it has nothing ready: the loop then finishes the batch in flight before waiting."""
    with_gt, metric_backend, keep_vertices = settings.with_gt, settings.metric_backend, settings.mesh_dir is not None
    backend = reconstructor.backend
    if loader is None:
        loader = BatchLoader(batches, workers=settings.loaders, views=settings.views, with_gt=with_gt, pool=loader_pool)
    device = getattr(backend, "device", None)
    timing = timing if timing is not None else Timing()
    start = time.perf_counter()
    with device if device is not None else contextlib.nullcontext():
        if backend.name == "cupy":
            _gpu_loop(
                reconstructor,
                loader,
                on_batch,
                timing,
                with_gt,
                keep_vertices,
                metric_backend,
                buffers or LoopBuffers(),
            )
        else:
            _cpu_loop(reconstructor, loader, on_batch, timing, with_gt, keep_vertices, metric_backend)
    timing.wall = time.perf_counter() - start
    timing.input_wait = loader.wait_s
    return timing


def _account_loading(timing: Timing, host: HostBatch, workers: int) -> None:
    share = max(1, workers)
    timing.decode += host.decode_s / share
    timing.ground_truth += host.gt_s / share


def _cpu_loop(reconstructor, loader, on_batch, timing, with_gt, keep_vertices, metric_backend) -> None:
    for host in loader:
        if host is None:  # nothing ready: nothing is in flight here either
            continue
        _account_loading(timing, host, loader.workers)
        t0 = time.perf_counter()
        images = images_to_unit(np, host.images)
        t1 = time.perf_counter()
        _, refined = reconstructor.run(images, host.cameras)
        refined = np.asarray(refined)
        t2 = time.perf_counter()
        scores = None
        if with_gt:
            if metric_backend in ("scipy", "faiss"):
                scores = _host_scores(refined, host.gts, metric_backend)
            else:
                gt, lengths = _gt_arrays(host)
                scores = evaluate_batch(refined, gt, lengths_gt=lengths)
        t3 = time.perf_counter()
        timing.upload += t1 - t0
        timing.network += t2 - t1
        timing.metrics += t3 - t2
        on_batch(
            BatchResult(
                host.samples, refined if keep_vertices or not with_gt else None, scores, (t2 - t1) * 1000.0 / len(host)
            )
        )


@dataclass
class _InFlight:
    host: HostBatch
    slot: int
    events: list  # start, after network, after metrics, results on the host
    refined: object  # device (B, N, 3), kept alive until copied
    packed: object  # device (B, 2 + T) float64 scores, or None
    host_vertices: np.ndarray | None
    host_scores: np.ndarray | None


def _gpu_loop(
    reconstructor, loader, on_batch, timing, with_gt, keep_vertices, metric_backend, kept: LoopBuffers
) -> None:
    cupy = reconstructor.backend.cupy
    if kept.stager is None:
        kept.stager = Stager(cupy)
        # the metrics run on a stream of their own, beside the next batch's network (which leaves SMs idle)
        kept.metric_stream = cupy.cuda.Stream(non_blocking=True)
    stager, metric_stream = kept.stager, kept.metric_stream
    on_gpu_metrics = with_gt and metric_backend in ("auto", "cupy")
    need_vertices = keep_vertices or (with_gt and not on_gpu_metrics) or not with_gt
    last_done = None

    def finish(job: _InFlight) -> None:
        nonlocal last_done
        job.events[-1].synchronize()
        ev = job.events
        timing.upload += stager.upload_seconds(job.slot)
        timing.network += cupy.cuda.get_elapsed_time(ev[0], ev[1]) / 1000.0
        timing.metrics += cupy.cuda.get_elapsed_time(ev[1], ev[2]) / 1000.0
        if last_done is not None:
            timing.gpu_idle += max(0.0, cupy.cuda.get_elapsed_time(last_done, ev[0]) / 1000.0)
        last_done = ev[1]  # the compute stream's last work for this batch
        scores = None
        if on_gpu_metrics:
            packed = job.host_scores
            scores = {"chamfer": packed[:, 0].copy(), "finite": packed[:, 1] > 0.5, "fscore": packed[:, 2:].copy()}
        elif with_gt:
            t = time.perf_counter()
            scores = _host_scores(job.host_vertices, job.host.gts, metric_backend)
            timing.metrics += time.perf_counter() - t
        vertices = job.host_vertices.copy() if need_vertices else None
        ms = cupy.cuda.get_elapsed_time(ev[0], ev[1]) / len(job.host)
        on_batch(BatchResult(job.host.samples, vertices if keep_vertices or not with_gt else None, scores, ms))

    result_buffers = kept.results
    pending: _InFlight | None = None
    try:
        for number, host in enumerate(loader):
            if host is None:  # the loader has nothing ready: finish the batch in flight before it waits
                if pending is not None:
                    finish(pending)
                    pending = None
                continue
            _account_loading(timing, host, loader.workers)
            arrays = {"images": host.images}
            lengths = None
            if on_gpu_metrics:
                arrays["gt"], lengths = _gt_arrays(host)
            slot, device = stager.stage(arrays)
            stager.wait(slot)
            stream = cupy.cuda.get_current_stream()
            events = [stream.record()]
            images = images_to_unit(cupy, device["images"])
            _, refined = reconstructor.run(images, host.cameras)
            events.append(stream.record())
            packed = None
            buffers = result_buffers[number % 2]
            host_vertices = host_scores = None
            with metric_stream:
                metric_stream.wait_event(events[1])
                if on_gpu_metrics:
                    s = evaluate_batch(refined, device["gt"], lengths_gt=lengths)
                    packed = cupy.concatenate(
                        [s["chamfer"][:, None], s["finite"][:, None].astype(cupy.float64), s["fscore"]], axis=1
                    )
                events.append(metric_stream.record())
                if need_vertices:
                    host_vertices = pinned_buffer(buffers, "vertices", refined.shape, np.float32)
                    copy_to_host(cupy, cupy.ascontiguousarray(refined, dtype=cupy.float32), host_vertices)
                if packed is not None:
                    host_scores = pinned_buffer(buffers, "scores", packed.shape, np.float64)
                    copy_to_host(cupy, packed, host_scores)
                events.append(metric_stream.record())
            stager.release(slot, events[-1])  # the slot's buffers are read until the metrics end
            job = _InFlight(host, slot, events, refined, packed, host_vertices, host_scores)
            if pending is not None:
                finish(pending)  # batch k is queued: now wait for batch k-1
            pending = job
        if pending is not None:
            finish(pending)
    finally:
        stager.close()
