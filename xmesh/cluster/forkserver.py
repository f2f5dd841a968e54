"""The process a local cluster's workers are forked from, with what a worker imports already imported.

By default a Dask nanny starts its worker as a fresh interpreter ('spawn'), which imports
distributed, xmesh and the model's backend before the worker can join. The local clusters here
use multiprocessing's forkserver instead (Dask's ``distributed.worker.multiprocessing-method``,
set by :mod:`.connect` while the cluster starts), started with :func:`worker_modules` imported:
each worker is a fork of a process that has them. A command starts it in a thread (:func:`start`)
as soon as it knows it will start a local cluster, beside its own imports and the listing;
:func:`ready` waits for that start (or makes it, for a library call) before the nannies start.

Nothing imported there touches CUDA: CuPy's import makes no CUDA context (a forked one would be
broken), and each worker's ``CUDA_VISIBLE_DEVICES`` is set by its nanny in the worker, before the
worker is made and long before its model's first CUDA call. A worker has the environment of the
process when the forkserver started, with its nanny's ``env`` on top; variables read only as a
process starts (glibc's ``MALLOC_TRIM_THRESHOLD_``, ``PYTHONHASHSEED``) come from the forkserver's
start, so the workers share one hash seed, and :func:`xmesh.pipeline.heap.keep_batch_memory` sets the
heap explicitly. There is one forkserver per process: a loader pool started in the same process
forks from the one running (this one has the loaders' modules too, through :mod:`.worker`), and a
forkserver that a loader pool started first serves the workers, who then import what it lacks.
"""
from __future__ import annotations

import importlib.util
import multiprocessing
import threading

#: imported by every worker: Dask, the model's plugin and shard task, the model, and the
#: forkserver's quick end once its owner has gone (:mod:`xmesh.pipeline.server_exit`)
WORKER_MODULES = ("distributed", "xmesh.cluster.worker", "xmesh.reconstruct", "xmesh.pipeline.server_exit")
#: a backend's own modules, imported when a worker builds its model (the NumPy backend's numba
#: kernels compiled or read from numba's cache as they are imported; CuPy's import calls no CUDA)
BACKEND_MODULES = {"numpy": ("xmesh.backends.numpy_backend", "xmesh.backends.numba_kernels"),
                   "cupy": ("cupy", "xmesh.backends.cupy_backend")}
METHOD = "forkserver"

_lock = threading.Lock()
_starting: threading.Thread | None = None


def available() -> bool:
    """Whether this platform has a forkserver (not on Windows), and Dask is installed."""
    if METHOD not in multiprocessing.get_all_start_methods():
        return False
    try:
        return importlib.util.find_spec("distributed") is not None
    except (ImportError, ValueError):   # a module entry of None (made unimportable on purpose), or a broken one
        return False


def worker_modules(backend: str | None = None, main: tuple = ()) -> list[str]:
    """The modules the forkserver imports: ``main`` (what each worker imports again as the parent's
    main script, e.g. ``xmesh.cli`` for the ``xmesh`` command), :data:`WORKER_MODULES` and those
    of ``backend`` ("numpy" or "cupy"; none for another or None)."""
    return [*main, *WORKER_MODULES, *BACKEND_MODULES.get(str(backend).lower(), ())]


def _ensure(modules: list[str]) -> None:
    import multiprocessing.forkserver

    multiprocessing.get_context(METHOD).set_forkserver_preload(list(modules))   # read by the start below
    multiprocessing.forkserver.ensure_running()   # returns once started; its imports go on in it


def _start_quietly(modules: list[str]) -> None:
    try:
        _ensure(modules)
    except Exception:   # tried again by ready(), where its error is raised
        pass


def start(modules: list[str]) -> bool:
    """Start the forkserver with ``modules`` in a thread now (where :func:`available`); True if started."""
    global _starting
    if not available():
        return False
    thread = threading.Thread(target=_start_quietly, args=(modules,), name="xmesh-forkserver-start", daemon=True)
    with _lock:
        _starting = thread
    thread.start()
    return True


def ready(modules: list[str]) -> bool:
    """The forkserver running (the one :func:`start` started, waited for; else one started now with
    ``modules``, or the one running already); False where there is none (:func:`available`)."""
    global _starting
    if not available():
        return False
    with _lock:
        thread, _starting = _starting, None
    if thread is not None:
        thread.join()
    _ensure(modules)   # nothing more where it runs; started again where it has ended
    return True
