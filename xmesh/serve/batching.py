"""How a worker of ``xmesh serve`` gathers its batches: LitServe's batched loop with the requests received
off the worker's main thread.

LitServe's own loop takes requests from its queue one at a time and stops gathering when the batch timeout
has passed, so the receive time of the requests (each unpickled: 450 KB of pixels) bounds the batch size.
Here one thread receives requests into a local queue while the device runs a batch. A batch is whatever
has arrived, up to ``max_batch_size``: a lone request runs at once; when more than one is waiting
(concurrent traffic) the loop waits up to ``batch_timeout`` for more to fill the batch. Answers go out on
the main thread: the server's answer queues are pipe queues (:class:`xmesh.serve.server.XmeshLitServer`),
whose ``put`` hands the pickling and writing to a thread of their own. Each request's
:class:`~xmesh.serve.upload.Sample` gets its arrival time (``time.monotonic()``) in its ``stamps`` as
``"received"``.
"""
from __future__ import annotations

import os
import queue
import threading
import time

from litserve.loops.base import _SENTINEL_VALUE, _StopLoopError
from litserve.loops.simple_loops import BatchedLoop

RECEIVE_POLL_S = 1.0


class WorkerQueues:
    """The request queue of a server with several workers: a pipe queue per worker, which each server
    process fills in turn. One queue read by every worker hands its requests over one at a time (a
    reader holds its lock while it reads a request's 450 KB of pixels), which on four GPUs bounded the
    server below what its workers could run."""

    def __init__(self, queues: list):
        self.queues = queues
        self._pid = self._next = -1

    def put(self, item) -> None:
        if self._pid != os.getpid():    # each server process starts its turns at a worker of its own
            self._pid, self._next = os.getpid(), os.getpid() % len(self.queues)
        self._next = (self._next + 1) % len(self.queues)
        self.queues[self._next].put(item)

    def of_worker(self, worker_id: int):
        return self.queues[worker_id]


class PrefetchingBatchLoop(BatchedLoop):
    """A ``BatchedLoop`` (every batch size, 1 included, reaches ``predict`` as a list) whose requests are
    received in a thread of their own."""

    def __call__(self, lit_api, device, worker_id, request_queue, transport, *args, **kwargs):
        self._arrived: queue.Queue = queue.Queue()
        own = request_queue.of_worker(worker_id)   # XmeshLitServer's WorkerQueues
        threading.Thread(target=self._receive, args=(own,), name="xmesh-receive", daemon=True).start()
        super().__call__(lit_api, device, worker_id, request_queue, transport, *args, **kwargs)

    def _receive(self, request_queue) -> None:
        while True:
            try:
                item = request_queue.get()
            except (EOFError, OSError):     # the server's queue is closed: it is shutting down
                item = _SENTINEL_VALUE
            if item != _SENTINEL_VALUE:
                item[3].stamps["received"] = time.monotonic()
            self._arrived.put(item)
            if item == _SENTINEL_VALUE:
                return

    def get_batch_requests(self, lit_api, request_queue, transport) -> tuple[list, list]:
        try:
            items = [self._arrived.get(timeout=RECEIVE_POLL_S)]
        except queue.Empty:
            return [], []
        while len(items) < lit_api.max_batch_size:
            try:
                items.append(self._arrived.get_nowait())
            except queue.Empty:
                break
        if 1 < len(items) < lit_api.max_batch_size and lit_api.batch_timeout > 0:
            deadline = time.monotonic() + lit_api.batch_timeout
            while len(items) < lit_api.max_batch_size and (left := deadline - time.monotonic()) > 0:
                try:
                    items.append(self._arrived.get(timeout=left))
                except queue.Empty:
                    break
        if any(item == _SENTINEL_VALUE for item in items):
            raise _StopLoopError()
        apply_timeout = lit_api.request_timeout not in (-1, False, None)
        payloads, timed_out = [], []
        now = time.monotonic()
        for response_queue_id, uid, timestamp, x_enc in items:
            if apply_timeout and now - timestamp > lit_api.request_timeout:
                timed_out.append((response_queue_id, uid))
            else:
                payloads.append((response_queue_id, uid, x_enc))
        return payloads, timed_out
