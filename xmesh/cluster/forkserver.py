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
worker is made and long before its model's first CUDA call. The forkserver starts with the
variables each nanny sets before it starts a worker (:func:`nanny_environ`: one BLAS thread, read
as NumPy is imported), so a forked worker computes as a spawned one did; ``PYTHONHASHSEED`` is the
forkserver's, one for all the workers. There is one forkserver per process: a loader pool started
later in the same process forks from this one (it has the loaders' modules, through
:mod:`.worker`); where a loader pool started one first, its environment is not the nannies', and
the workers are spawned as fresh interpreters instead.
"""
from __future__ import annotations

import importlib.util
import multiprocessing
import multiprocessing.forkserver
import os
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
_pid: int | None = None   # the forkserver started here


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


def nanny_environ() -> dict:
    """The variables each Dask nanny sets before it starts a worker (``distributed.nanny.pre-spawn-environ``:
    one BLAS thread, glibc's trim threshold), a variable already set keeping its value."""
    import dask
    import distributed  # noqa: F401  (its configuration's defaults)

    wanted = dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {}
    return {name: os.environ.get(name, str(value)) for name, value in wanted.items() if value is not None}


def _servers() -> set[int]:
    import psutil   # a dependency of distributed

    return {p.pid for p in psutil.Process().children() if _is_forkserver(p)}


def _is_forkserver(process) -> bool:
    try:
        return any("multiprocessing.forkserver" in part for part in process.cmdline())
    except Exception:   # gone meanwhile, or not ours to read
        return False


def _ensure(modules: list[str]) -> bool:
    """Start the forkserver with ``modules`` and the nannies' environment (NumPy's BLAS reads it as
    the forkserver imports NumPy); False where another forkserver runs already (a loader pool's,
    started without that environment)."""
    global _pid
    running = _servers()
    if running and _pid not in running:
        return False
    os.environ.update(nanny_environ())   # as each nanny does in this process before it starts a worker
    multiprocessing.get_context(METHOD).set_forkserver_preload(list(modules))   # read by the start below
    multiprocessing.forkserver.ensure_running()   # returns once started; its imports go on in it
    _pid = next(iter(_servers() - running), _pid)
    return True


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
    """Whether a local cluster's workers are to be forked: the forkserver started by :func:`start`
    (waited for), else one started now with ``modules``; False where the platform has none
    (:func:`available`) or a forkserver that this module did not start runs already (one per
    process: a loader pool's), whose environment is not the nannies'."""
    global _starting
    if not available():
        return False
    with _lock:
        thread, _starting = _starting, None
    if thread is not None:
        thread.join()
    return _ensure(modules)   # nothing more where ours runs; started again where it has ended
