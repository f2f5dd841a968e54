"""``xmesh serve``'s server: LitServe with one worker process per device (:mod:`xmesh.serve.worker`) and
our routes (:mod:`xmesh.serve.routes`) in its HTTP server processes.

LitServe gathers the requests of all server processes in one queue; here each worker has a queue of its
own, which the server processes fill in turn, and the answers go back to each server process through
queues of their own, all pipe-based ``multiprocessing`` queues rather than LitServe's default of a
multiprocessing Manager's (every put and get a round trip through the Manager's process, a request's
pixels pickled twice on the way), see :class:`XmeshLitServer`. Each worker takes up to
``max_batch`` of its requests (:mod:`xmesh.serve.batching`: a lone request runs at once; when several are
waiting, the worker waits at most ``batch_timeout_ms`` for more). SIGTERM to the main process
first stops the HTTP server processes, which answer the requests they hold (uvicorn's graceful
shutdown: no new connections, the open ones finished), then stops the workers.
"""

from __future__ import annotations

import fcntl
import logging
import multiprocessing
import os
import signal
import sys
import threading
from contextlib import suppress
from dataclasses import dataclass

import litserve as ls
import numpy as np
from litserve.transport.process_transport import MPQueueTransport
from starlette.middleware.gzip import GZipMiddleware

from xmesh.pipeline.loading import ctrl_c_held
from xmesh.serve.batching import WorkerQueues
from xmesh.serve.routes import Admission, Limits, add_routes
from xmesh.serve.upload import Sample
from xmesh.serve.worker import ModelSettings, ReconstructAPI

API_PATH = "/v1/reconstruct"
DRAIN_TIMEOUT_S = 60.0
HTTP_PROCESS_PREFIX = "LitServer-"  # how LitServe names its HTTP server processes
MONITOR_THREAD = "litserve-monitoring"  # LitServe's thread that watches the workers
MONITOR_INTERVAL_S = 0.25
PIPE_BYTES = 1 << 20  # a request's 450 KB of views in one write and one read (Linux's default pipe: 64 KB)
# The HTTP processes' interpreter switch interval (the default is 5 ms): how long a thread that wants the
# interpreter lock back (a decoding thread done, a queue's thread done writing a request or reading an
# answer) may wait while the event loop runs Python. On an H100 host a lone request's median fell by
# 0.9-1.0 ms with it (docs/PERFORMANCE.md, Serving).
SWITCH_INTERVAL_S = 0.0005


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    devices: tuple[int, ...] | None = None  # GPU indices; None: one CPU worker
    max_batch: int = 64
    batch_timeout_ms: float = 2.0
    max_body_mb: int = 64
    max_queue: int = 2048
    read_timeout_s: float = 30.0
    http_processes: int = 2
    body_timeout_s: float = 120.0


def pipe_queue(context):
    """A pipe-based queue of ``context`` whose pipe holds PIPE_BYTES where the system allows (Linux's
    ``F_SETPIPE_SZ``, up to ``/proc/sys/fs/pipe-max-size`` for a user), else the system's default.

    With a 64 KB pipe a request's views cross in seven or more writes and reads, and after each read
    the worker's receiving thread waits for its interpreter lock, which the batch loop and the answer
    queues' threads hold in turn: on four H100s a worker took in 650-690 requests a second that way."""
    queue = context.Queue()
    with suppress(OSError, AttributeError):  # a pipe that may not grow (limits, no F_SETPIPE_SZ) stays as it is
        fcntl.fcntl(queue._reader.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    return queue


def pipe_bytes(queue) -> int:
    """The capacity of a :func:`pipe_queue`'s pipe, in bytes."""
    return fcntl.fcntl(queue._reader.fileno(), fcntl.F_GETPIPE_SZ)


class XmeshLitServer(ls.LitServer):
    """LitServer whose request queues (one a worker, :class:`~xmesh.serve.batching.WorkerQueues`) and answer
    queues are pipe-based ``multiprocessing`` queues (created
    before the server processes fork, passed to the spawned workers as LitServe passes its own; their pipes
    widened by :func:`pipe_queue`), and
    whose shutdown stops its worker monitor before the Manager it polls goes away (else the monitor's
    next poll fails with ConnectionResetError and logs a traceback).

    A pipe queue's ``put`` returns at once (a thread of the putting process pickles and writes), its
    ``get`` reads the pipe directly. LitServe's ``fast_queue=True`` would use ZeroMQ for the answers,
    but in LitServe 0.2.19 it is ignored (LitServe issue 751), and it leaves the request queue a
    Manager's. The Manager stays for what LitServe keeps in it: the workers' status and the shutdown
    event."""

    def _init_manager(self, num_api_servers: int):
        with ctrl_c_held():  # the Manager's process, forked: stopped by this one, without a traceback
            manager = super()._init_manager(num_api_servers)
        context = multiprocessing.get_context("spawn")  # spawn-made locks may go to forked and spawned processes
        for path in self.litapi_request_queues:
            workers = len(self._inference_workers_config_for_api(path))
            self.litapi_request_queues[path] = WorkerQueues([pipe_queue(context) for _ in range(workers)])
        self._transport = MPQueueTransport(None, [pipe_queue(context) for _ in range(num_api_servers)])
        return manager

    def _start_server(self, *args, **kwargs):
        with ctrl_c_held():  # uvicorn's processes, forked: until uvicorn sets its own handlers
            return super()._start_server(*args, **kwargs)

    def _perform_graceful_shutdown(self, manager, uvicorn_workers, shutdown_reason: str = "normal"):
        # from a thread of its own: this thread's connection to the Manager may be cut in the middle of the
        # wait() that SIGTERM or Ctrl+C interrupted
        stopper = threading.Thread(target=self._stop_monitor, daemon=True)
        stopper.start()
        stopper.join(MONITOR_INTERVAL_S * 8)
        super()._perform_graceful_shutdown(manager, uvicorn_workers, shutdown_reason)

    def _stop_monitor(self) -> None:
        with suppress(EOFError, OSError):  # a Manager already gone (Ctrl+C reaches it too) stops the monitor itself
            self._shutdown_event.set()
        for thread in threading.enumerate():
            if thread.name == MONITOR_THREAD and thread is not threading.current_thread():
                thread.join(MONITOR_INTERVAL_S * 4)


def build_server(settings: ModelSettings, options: ServeOptions, faces: np.ndarray, info: dict) -> ls.LitServer:
    """The LitServer with our routes in place of LitServe's own page and predict route."""
    from litserve.server import RegularRequestHandler

    api = ReconstructAPI(settings, options.max_batch, options.batch_timeout_ms / 1000.0, API_PATH)
    if options.devices is None:
        server = XmeshLitServer(api, accelerator="cpu", devices=1, workers_per_device=1, timeout=False)
    else:
        server = XmeshLitServer(
            api, accelerator="cuda", devices=list(options.devices), workers_per_device=1, timeout=False
        )
    server.monitor_internal = MONITOR_INTERVAL_S
    app = server.app
    app.router.routes = [r for r in app.router.routes if getattr(r, "path", None) not in ("/", API_PATH)]
    # meshes go out as they are: gzip at level 9 would cost the server more than the network saves
    app.user_middleware = [m for m in app.user_middleware if m.cls is not GZipMiddleware]
    handler = RegularRequestHandler(api, server)

    async def submit(sample: Sample) -> dict:
        return await handler.handle_request(sample, Sample)

    limits = Limits(options.max_body_mb * 2**20, options.read_timeout_s, options.max_queue, options.body_timeout_s)
    add_routes(app, submit, faces, info, limits, Admission(options.max_queue))
    return server


def _http_processes() -> list:
    return [p for p in multiprocessing.active_children() if p.name.startswith(HTTP_PROCESS_PREFIX)]


def _drain_then_stop(main_pid: int):
    """The SIGTERM handler: in the main process, let the HTTP processes finish the requests they hold,
    then stop as Ctrl+C does; in a process forked from it, SIGTERM's default action."""

    def handler(signum, frame) -> None:
        if os.getpid() != main_pid:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        processes = _http_processes()
        print(
            f"xmesh serve: SIGTERM: finishing the requests in flight in {len(processes)} server process(es)",
            file=sys.stderr,
        )
        for process in processes:
            os.kill(process.pid, signal.SIGTERM)
        for process in processes:
            process.join(DRAIN_TIMEOUT_S)
        raise KeyboardInterrupt

    return handler


class _QuietShutdown(logging.Filter):
    """Drops LitServe's warning that an HTTP process had stopped before it stopped them: ours drained them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Already not alive" not in record.getMessage()


def serve(settings: ModelSettings, options: ServeOptions, faces: np.ndarray, info: dict) -> None:
    """Run the server until SIGTERM or Ctrl+C."""
    server = build_server(settings, options, faces, info)
    previous = signal.signal(signal.SIGTERM, _drain_then_stop(os.getpid()))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # the HTTP processes fork from this one and keep it
    logging.getLogger("litserve").setLevel(logging.WARNING)
    logging.getLogger("litserve.server").addFilter(_QuietShutdown())
    logging.getLogger("python_multipart").setLevel(logging.ERROR)  # a malformed body is answered, not logged
    try:
        server.run(
            host=options.host,
            port=options.port,
            num_api_servers=options.http_processes,
            generate_client_file=False,
            log_level="warning",
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
        sys.setswitchinterval(interval)
        for child in multiprocessing.active_children():  # anything a stop before LitServe's own left behind
            child.terminate()
            child.join(5)
