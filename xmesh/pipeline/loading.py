"""Decode the inputs of whole batches ahead of the compute, in worker processes.

A sample's images stay uint8 (see :func:`xmesh.io.images.load_images_u8`), which is a quarter of the
float32 bytes to move; its ground truth is read by the restricted unpickler. Python-level parsing
(camera rows, pickles) holds the GIL, so the work runs in processes: ``workers`` processes, each
task a chunk of a batch, up to ``depth`` batches ahead of the one the loop is computing. Inside a
daemon process (a Dask worker) children are not allowed, so threads do the work there.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import select
import signal
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..dataset import DEFAULT_VIEWS, SampleId, SamplePaths, check_sample, load_ground_truth
from ..errors import XmeshError
from ..io.cameras import load_cameras
from ..io.images import UINT8_TO_UNIT, load_images_u8
from .heap import keep_batch_memory

PREFETCH_DEPTH = 3  # batches decoded ahead of the one computing
CHUNK = 8  # samples per worker task
OWNER_POLL_S = 1.0  # how often a pool process looks for its owner where the system cannot tell it


@dataclass
class HostBatch:
    """One batch on the host: images (B, 3, 224, 224, 3) uint8 (float32 where a file is not 8-bit),
    cameras (B, 3, 5) float32, ground truth (a list of (N_i, 3) float32, or None without it) and
    the worker seconds spent decoding images and cameras (``decode_s``) and ground truth (``gt_s``)."""

    samples: list[SampleId]
    images: np.ndarray
    cameras: np.ndarray
    gts: list[np.ndarray] | None
    decode_s: float = 0.0
    gt_s: float = 0.0
    extra: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.samples)


def load_sample(sample: SampleId, paths: SamplePaths, views: Sequence[int] = DEFAULT_VIEWS, with_gt: bool = True):
    """(images (3,224,224,3) uint8 or float32, cameras (3,5), gt (N,3) or None, decode s, gt s) of one
    sample; errors name the sample."""
    try:
        if with_gt:
            check_sample(sample, paths)
        start = time.perf_counter()
        images = load_images_u8(list(paths.images))
        cameras = load_cameras(paths.cameras, views=list(views))
        decoded = time.perf_counter()
        gt = load_ground_truth(paths.gt) if with_gt else None
        done = time.perf_counter()
    except XmeshError as exc:
        if str(exc).startswith(f"sample {sample}"):
            raise
        raise type(exc)(f"sample {sample}: {exc}") from None
    return images, cameras, gt, decoded - start, done - decoded


def load_chunk(chunk: list[tuple[SampleId, SamplePaths]], views: tuple, with_gt: bool) -> list[tuple]:
    return [load_sample(s, p, views, with_gt) for s, p in chunk]


def assemble(batch: list[tuple[SampleId, SamplePaths]], loaded: list[tuple]) -> HostBatch:
    images = [x[0] for x in loaded]
    if any(i.dtype != images[0].dtype for i in images):  # a float32 sample (a 16-bit file) among uint8 ones
        images = [i if i.dtype == np.float32 else UINT8_TO_UNIT[i] for i in images]
    return HostBatch(
        samples=[s for s, _ in batch],
        images=np.stack(images),
        cameras=np.stack([x[1] for x in loaded]).astype(np.float32),
        gts=None if loaded[0][2] is None else [x[2] for x in loaded],
        decode_s=sum(x[3] for x in loaded),
        gt_s=sum(x[4] for x in loaded),
    )


def submit_batch(pool: Executor | None, batch: list, views: tuple, with_gt: bool) -> list[Future] | None:
    """Start decoding ``batch`` in ``pool``, a task per ``CHUNK`` samples; None without a pool (the
    batch is then decoded inline by :func:`decoded`)."""
    if pool is None:
        return None
    return [pool.submit(load_chunk, batch[i : i + CHUNK], views, with_gt) for i in range(0, len(batch), CHUNK)]


def decoded(batch: list, futures: list[Future] | None, views: tuple, with_gt: bool) -> list[tuple]:
    """The per-sample results of ``batch``: its tasks' (waiting for them), or decoded here."""
    if futures is None:
        return load_chunk(batch, views, with_gt)
    return [x for f in futures for x in f.result()]


def init_loader_process() -> None:
    """A loading process's start: the batch heap, and OpenCV on one thread."""
    import cv2

    keep_batch_memory()
    cv2.setNumThreads(1)  # the pool is the parallelism; OpenCV's own threads would oversubscribe


def make_pool(workers: int, initializer=init_loader_process, initargs: tuple = ()) -> Executor:
    """``workers`` processes (forkserver: children of a clean process, not of one holding a CUDA
    context), or threads inside a daemon process, where children are not allowed."""
    if multiprocessing.current_process().daemon:
        if initializer is not init_loader_process:
            initializer(*initargs)  # the threads share this process's state
        return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="xmesh-pool")
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        # imported once, in the forkserver (numba's import with the mesh text formatting, which this process
        # skips), and its quick end
        context.set_forkserver_preload(
            ["xmesh.pipeline.loading", "xmesh.pipeline.writing", "xmesh.io.exact_text", "xmesh.pipeline.server_exit"]
        )
        _start_forkserver_deaf_to_ctrl_c()
    else:
        context = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=_pool_process_start,
        initargs=(os.getpid(), initializer, initargs),
    )


@contextlib.contextmanager
def children_deaf_to_ctrl_c():
    """SIGINT ignored in this process while the block starts processes, which keep it ignored (a forked
    one inherits it, a spawned interpreter leaves it so): Ctrl+C in a terminal reaches every process
    of a command, and the command alone answers it, without a traceback from each process it started.
    Only the main thread may set a handler (elsewhere the block runs as it is); a Ctrl+C in the
    milliseconds the block takes is lost."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def ctrl_c_held():
    """Ctrl+C held back while the block forks processes, and raised here once it is done: a process
    forked meanwhile keeps the holding handler (it never raises KeyboardInterrupt on its own, so it
    prints no traceback), and no Ctrl+C is lost. For processes that exec a new interpreter, which
    drops handlers, see :func:`children_deaf_to_ctrl_c`. Only the main thread may set a handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        raise KeyboardInterrupt


def _start_forkserver_deaf_to_ctrl_c() -> None:
    """Start the forkserver (where it is not running yet) deaf to Ctrl+C, as its children, the pool's
    processes, then are (:func:`children_deaf_to_ctrl_c`): no traceback from its imports or theirs."""
    from multiprocessing import forkserver

    with children_deaf_to_ctrl_c():
        forkserver.ensure_running()


def _pool_process_start(owner: int, initializer, initargs: tuple) -> None:
    """A pool process's start: it ends itself once ``owner`` (the process whose pool it serves) has
    gone, then runs ``initializer``. An owner killed outright never shuts its pool down, and the
    pool's processes would otherwise wait for tasks for ever (keeping the forkserver alive too).
    Ctrl+C is the owner's to answer: a pool process ignores SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_end_after, args=(owner,), name="xmesh-owner-watch", daemon=True).start()
    initializer(*initargs)


def _end_after(owner: int) -> None:
    try:
        handle = os.pidfd_open(owner)  # readable once the owner has ended
    except (AttributeError, OSError):  # no pidfd (an old kernel), or the owner is gone already
        handle = None
    if handle is not None:
        select.select([handle], [], [])
    else:
        while True:
            time.sleep(OWNER_POLL_S)
            try:
                os.kill(owner, 0)
            except ProcessLookupError:
                break
            except PermissionError:  # alive, under another user (a reused id)
                pass
    os._exit(0)


def _ready() -> int:
    return os.getpid()


def start_pool(workers: int, initializer=init_loader_process, initargs: tuple = ()) -> Executor | None:
    """A pool whose processes are starting (one trivial task each is queued from a thread, so all of
    them start now), or None for ``workers`` 0: start it before building the model, so that its start-up overlaps the
    model's."""
    if workers <= 0:
        return None
    pool = make_pool(workers, initializer, initargs)

    def start() -> None:  # the first start waits for the forkserver's imports: not on the caller's time
        try:
            for _ in range(workers):
                pool.submit(_ready)
        except (RuntimeError, EOFError, OSError):  # shut down meanwhile, or its processes could not start
            pass  # (the pool's first task raises it again for its user)

    threading.Thread(target=start, name="xmesh-pool-start", daemon=True).start()
    return pool


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)


def host_share(peers: int = 1) -> int:
    """The cores one of ``peers`` processes running the loop on this host may count on: those it may
    run on (its CPU affinity), at most an even share of the host's, so that the workers of one host
    (one per GPU) do not each take the whole machine for their loaders."""
    usable = usable_cores()
    return max(1, min(usable, (os.cpu_count() or usable) // max(1, int(peers))))


def default_workers(gpu: bool, writers: bool = False, cores: int | None = None) -> tuple[int, int]:
    """(loader, mesh writer) processes for ``cores`` (default: this process's, :func:`usable_cores`).
    On the GPU the cores but three (the loop, its helper threads, the driver's), at most 12 loaders:
    on an H100 machine's cores a sample costs 4-6 ms to decode and about half that to write as text,
    while the network takes one in about 1 ms, so with meshes two thirds of them load and the rest
    write. On the CPU one of each: the network bounds it there."""
    if not gpu:
        return 1, 1 if writers else 0
    spare = max(3, (usable_cores() if cores is None else int(cores)) - 3)
    if not writers:
        return min(12, spare), 0
    loaders = max(2, (2 * spare) // 3)
    return loaders, max(1, spare - loaders)


class BatchLoader:
    """Iterate the decoded batches in order. ``workers`` > 0: a pool decodes up to ``depth`` batches
    ahead; 0: each batch is decoded inline when asked for. ``wait_s`` sums the time the consumer
    spent blocked on the next batch."""

    def __init__(
        self,
        batches: list[list[tuple[SampleId, SamplePaths]]],
        workers: int = 1,
        views: Sequence[int] = DEFAULT_VIEWS,
        with_gt: bool = True,
        depth: int = PREFETCH_DEPTH,
        pool: Executor | None = None,
    ):
        self.batches = batches
        self.workers = int(workers)
        self.views = tuple(views)
        self.with_gt = bool(with_gt)
        self.depth = max(int(depth), 1)
        self.pool = pool
        self.wait_s = 0.0

    def __iter__(self):
        if self.workers <= 0 and self.pool is None:
            for batch in self.batches:
                start = time.perf_counter()
                host = assemble(batch, load_chunk(batch, self.views, self.with_gt))
                self.wait_s += time.perf_counter() - start
                yield host
            return
        own = self.pool is None
        pool = make_pool(self.workers) if own else self.pool
        pending: deque = deque()
        upcoming = iter(self.batches)

        def submit() -> bool:
            batch = next(upcoming, None)
            if batch is None:
                return False
            pending.append((batch, submit_batch(pool, batch, self.views, self.with_gt)))
            return True

        try:
            while True:
                while len(pending) <= self.depth and submit():  # this batch and `depth` more decoding
                    pass
                if not pending:
                    return
                batch, futures = pending.popleft()
                start = time.perf_counter()
                loaded = decoded(batch, futures, self.views, self.with_gt)
                self.wait_s += time.perf_counter() - start
                yield assemble(batch, loaded)
        finally:
            for _, futures in pending:
                for f in futures:
                    f.cancel()
            if own:
                pool.shutdown(wait=True, cancel_futures=True)
