"""How a worker of ``xmesh serve`` gathers and runs its batches: LitServe's batched loop with the
requests received off the worker's main thread and two batches in flight.

LitServe's own loop takes requests from its queue one at a time and stops gathering when the batch timeout
has passed, so the receive time of the requests (each unpickled: 450 KB of pixels) bounds the batch size.
Here one thread receives requests into a local queue while the device runs a batch. A batch is whatever
has arrived, up to ``max_batch_size``: a lone request runs at once; when more than one is waiting
(concurrent traffic) the loop waits up to ``batch_timeout`` for more to fill the batch.

LitServe's loop runs a batch from its requests to its answers before it gathers the next. Here a batch
runs in the API's two halves (``launch``, ``collect``: :mod:`xmesh.serve.inflight`): the loop gathers
and launches batch k+1 while batch k is still on the device, then collects and answers batch k while
batch k+1 runs. When nothing has arrived, the batch in flight is answered at once. Answers go out on
the main thread: the server's answer queues are pipe queues (:class:`xmesh.serve.server.XmeshLitServer`),
whose ``put`` hands the pickling and writing to a thread of their own. Each request's
:class:`~xmesh.serve.upload.Sample` gets its arrival time (``time.monotonic()``) in its ``stamps`` as
``"received"``.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException
from litserve.callbacks import EventTypes
from litserve.loops.base import _SENTINEL_VALUE
from litserve.loops.simple_loops import BatchedLoop
from litserve.utils import LitAPIStatus, LoopResponseType, PickleableHTTPException

log = logging.getLogger("xmesh.serve")

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
        if self._pid != os.getpid():  # each server process starts its turns at a worker of its own
            self._pid, self._next = os.getpid(), os.getpid() % len(self.queues)
        self._next = (self._next + 1) % len(self.queues)
        self.queues[self._next].put(item)

    def of_worker(self, worker_id: int):
        return self.queues[worker_id]


@dataclass
class InFlight:
    """A launched batch: where each request's answer goes, and what the API's ``launch`` returned."""

    response_queue_ids: tuple
    uids: tuple
    job: Any


class PrefetchingBatchLoop(BatchedLoop):
    """A ``BatchedLoop`` (every batch size, 1 included, reaches the API as a list) whose requests are
    received in a thread of their own and which launches a batch before it answers the one before
    (see the module docstring). The API provides ``launch(inputs) -> job`` and ``collect(job) ->
    outputs`` besides LitServe's methods."""

    def __call__(self, lit_api, device, worker_id, request_queue, transport, *args, **kwargs):
        self._arrived: queue.Queue = queue.Queue()
        own = request_queue.of_worker(worker_id)  # XmeshLitServer's WorkerQueues
        threading.Thread(target=self._receive, args=(own,), name="xmesh-receive", daemon=True).start()
        super().__call__(lit_api, device, worker_id, request_queue, transport, *args, **kwargs)

    def _receive(self, request_queue) -> None:
        while True:
            try:
                item = request_queue.get()
            except (EOFError, OSError):  # the server's queue is closed: it is shutting down
                item = _SENTINEL_VALUE
            if item != _SENTINEL_VALUE:
                item[3].stamps["received"] = time.monotonic()
            self._arrived.put(item)
            if item == _SENTINEL_VALUE:
                return

    def run_batched_loop(self, lit_api, request_queue, transport, callback_runner, lit_spec=None) -> None:
        in_flight: InFlight | None = None
        stopping = False
        try:
            while not stopping:
                requests, timed_out, stopping = self.gather(lit_api, busy=in_flight is not None)
                for response_queue_id, uid in timed_out:
                    self.put_response(
                        transport,
                        response_queue_id,
                        uid,
                        HTTPException(504, "Request timed out"),
                        LitAPIStatus.ERROR,
                        LoopResponseType.REGULAR,
                    )
                launched = self._launch(lit_api, transport, requests, callback_runner) if requests else None
                if in_flight is not None:
                    self._answer(lit_api, transport, in_flight, callback_runner)
                in_flight = launched
            if in_flight is not None:
                self._answer(lit_api, transport, in_flight, callback_runner)
        except KeyboardInterrupt:  # pragma: no cover - as LitServe's loop
            self.kill()

    def gather(self, lit_api, busy: bool) -> tuple[list, list, bool]:
        """(requests to run as (response queue id, uid, input), requests that waited past the request
        timeout as (response queue id, uid), whether the server is stopping). ``busy``: a batch is in
        flight, so nothing is waited for when no request has arrived."""
        try:
            items = [self._arrived.get_nowait() if busy else self._arrived.get(timeout=RECEIVE_POLL_S)]
        except queue.Empty:
            return [], [], False
        while len(items) < lit_api.max_batch_size and items[-1] != _SENTINEL_VALUE:
            try:
                items.append(self._arrived.get_nowait())
            except queue.Empty:
                break
        if 1 < len(items) < lit_api.max_batch_size and lit_api.batch_timeout > 0:
            deadline = time.monotonic() + lit_api.batch_timeout
            while (
                len(items) < lit_api.max_batch_size
                and items[-1] != _SENTINEL_VALUE
                and (left := deadline - time.monotonic()) > 0
            ):
                try:
                    items.append(self._arrived.get(timeout=left))
                except queue.Empty:
                    break
        stopping = items[-1] == _SENTINEL_VALUE
        if stopping:
            items.pop()
        apply_timeout = lit_api.request_timeout not in (-1, False, None)
        requests, timed_out = [], []
        now = time.monotonic()
        for response_queue_id, uid, timestamp, x_enc in items:
            if apply_timeout and now - timestamp > lit_api.request_timeout:
                timed_out.append((response_queue_id, uid))
            else:
                requests.append((response_queue_id, uid, x_enc))
        return requests, timed_out, stopping

    def _launch(self, lit_api, transport, requests: list, callback_runner) -> InFlight | None:
        response_queue_ids, uids, inputs = zip(*requests)
        try:
            callback_runner.trigger_event(EventTypes.BEFORE_DECODE_REQUEST.value, lit_api=lit_api)
            decoded = [lit_api.decode_request(x) for x in inputs]
            callback_runner.trigger_event(EventTypes.AFTER_DECODE_REQUEST.value, lit_api=lit_api)
            callback_runner.trigger_event(EventTypes.BEFORE_PREDICT.value, lit_api=lit_api)
            return InFlight(response_queue_ids, uids, lit_api.launch(lit_api.batch(decoded)))
        except Exception as exc:  # noqa: BLE001 - every request gets an answer; the worker keeps serving
            self._fail(transport, InFlight(response_queue_ids, uids, None), exc)
            return None

    def _answer(self, lit_api, transport, batch: InFlight, callback_runner) -> None:
        try:
            outputs = lit_api.unbatch(lit_api.collect(batch.job))
            callback_runner.trigger_event(EventTypes.AFTER_PREDICT.value, lit_api=lit_api)
            if len(outputs) != len(batch.uids):
                raise HTTPException(500, detail=f"the batch of {len(batch.uids)} requests gave {len(outputs)} answers")
            callback_runner.trigger_event(EventTypes.BEFORE_ENCODE_RESPONSE.value, lit_api=lit_api)
            encoded = [lit_api.encode_response(y) for y in outputs]
            callback_runner.trigger_event(EventTypes.AFTER_ENCODE_RESPONSE.value, lit_api=lit_api)
        except Exception as exc:  # noqa: BLE001 - every request gets an answer; the worker keeps serving
            self._fail(transport, batch, exc)
            return
        for response_queue_id, uid, answer in zip(batch.response_queue_ids, batch.uids, encoded):
            self.put_response(transport, response_queue_id, uid, answer, LitAPIStatus.OK, LoopResponseType.REGULAR)

    def _fail(self, transport, batch: InFlight, exc: Exception) -> None:
        """Answer each request of ``batch`` with ``exc``, as LitServe's loop does."""
        for response_queue_id, uid in zip(batch.response_queue_ids, batch.uids):
            if isinstance(exc, HTTPException):
                self.put_response(
                    transport,
                    response_queue_id,
                    uid,
                    PickleableHTTPException.from_exception(exc),
                    LitAPIStatus.ERROR,
                    LoopResponseType.REGULAR,
                )
            else:
                self.put_error_response(transport, response_queue_id, uid, exc, LoopResponseType.REGULAR)
        if not isinstance(exc, HTTPException):
            log.error("a batch of %d request(s) failed", len(batch.uids), exc_info=exc)
