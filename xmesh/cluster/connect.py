"""``--cluster SPEC``: which Dask cluster a run uses, and the client that reaches it.

SPEC is one of

- ``local:N``: N worker processes on this machine, one thread each (the NumPy backend);
- ``local-cuda``: one worker per visible GPU (each worker's ``CUDA_VISIBLE_DEVICES`` names its GPU
  first, its CPU affinity is that GPU's CPUs where known), two threads each so that a worker
  decodes its next shard while the current one computes;
- ``tcp://HOST:PORT`` (or ``tls://``): a running scheduler, e.g. one started by dask-jobqueue on
  SLURM or by the Dask Kubernetes operator;
- a ``.json`` file: a scheduler file (``dask scheduler --scheduler-file``).

The two local forms are started here (:mod:`.local`); the workers of ``local-cuda`` are not
daemon processes, so the loader and mesh writers run in processes there as in the single-process
run (a ``local:N`` worker runs them in threads).
Dask is an optional extra: without it :func:`open_client` fails at once, naming the extra.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import re
from pathlib import Path

from ..errors import BackendUnavailableError, InputError

CONNECT_TIMEOUT = "10s"
_FORMS = "local:N (N worker processes here), local-cuda (one worker per GPU), tcp://HOST:PORT (a running scheduler)"


def parse_cluster_spec(spec: str, option: str = "--cluster") -> tuple[str, object]:
    """('local', N), ('local-cuda', None), ('address', 'tcp://...') or ('file', path); InputError otherwise."""
    text = str(spec).strip()
    match = re.fullmatch(r"local:(\d+)", text)
    if match:
        count = int(match.group(1))
        if count < 1:
            raise InputError(f"{option} {spec}: expected at least 1 worker process (local:N with N >= 1)")
        return "local", count
    if text == "local-cuda":
        return "local-cuda", None
    if re.fullmatch(r"(tcp|tls)://[^\s/:]+:\d+/?", text):
        return "address", text.rstrip("/")
    if text.endswith(".json"):
        return "file", text
    raise InputError(f"{option} {spec!r}: not a cluster; expected one of {_FORMS}, or a scheduler file (.json)")


def require(module: str, extra: str, what: str):
    """Import ``module`` or fail with the pip line that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"{what} needs {module} ({exc.msg if hasattr(exc, 'msg') else exc}); "
            f'install it with: pip install "xmesh-p2mpp[{extra}]"'
        ) from None


@contextlib.contextmanager
def open_client(spec: str, option: str = "--cluster", model=None):
    """A ``distributed.Client`` for ``spec``; a local cluster started here is closed on exit.
    ``model``: the :class:`~xmesh.reconstruct.ModelSpec` of the run, whose plugin the workers get as
    they join, so that each starts building its model at once (the run registers the same plugin
    again, which then changes nothing)."""
    kind, value = parse_cluster_spec(spec, option)
    require("distributed", "dask", f"{option} {spec}")
    plugins = ()
    if model is not None:
        from .worker import model_plugin

        plugins = (model_plugin(model),)
    if kind in ("local", "local-cuda"):
        with _local_cluster(kind, value, plugins, option, spec) as client:
            yield client
        return
    import distributed

    try:
        if kind == "file":
            if not Path(value).is_file():
                raise InputError(
                    f"{option} {spec}: no such scheduler file; expected the JSON file that "
                    "`dask scheduler --scheduler-file` writes"
                )
            client = distributed.Client(scheduler_file=value, timeout=CONNECT_TIMEOUT)
        else:
            client = distributed.Client(value, timeout=CONNECT_TIMEOUT)
    except (OSError, TimeoutError) as exc:
        raise InputError(
            f"{option} {spec}: no scheduler answered within {CONNECT_TIMEOUT} ({exc}); "
            "start one (dask scheduler, dask-jobqueue, the Dask Kubernetes operator) "
            "and give its address"
        ) from None
    try:
        for plugin in plugins:
            client.register_plugin(plugin)
        yield client
    finally:
        client.close()


@contextlib.contextmanager
def _local_cluster(kind: str, count, plugins, option: str, spec: str):
    """A client of a cluster started here (:mod:`.local`); for ``local-cuda`` its worker processes
    are not daemons while it runs (they start loader and writer processes)."""
    import dask

    from .local import close_local, start_local, worker_specs

    specs = worker_specs(kind, count)
    restore = dask.config.get("distributed.worker.daemon", True)
    if kind == "local-cuda":
        dask.config.set({"distributed.worker.daemon": False})  # read again by each worker (re)start
    try:
        try:
            cluster, client = start_local(specs, plugins)
        except (OSError, TimeoutError, RuntimeError) as exc:
            raise BackendUnavailableError(
                f"{option} {spec}: could not start its {len(specs)} worker process(es) ({type(exc).__name__}: {exc})"
            ) from None
        try:
            yield client
        finally:
            close_local(cluster, client)
    finally:
        dask.config.set({"distributed.worker.daemon": restore})


def describe(client) -> str:
    """'N workers (T threads) at ADDRESS' and the dashboard link where there is one."""
    threads = client.nthreads()
    text = f"{len(threads)} worker(s), {sum(threads.values())} thread(s), scheduler {client.scheduler.address}"
    link = getattr(client, "dashboard_link", None) if importlib.util.find_spec("bokeh") else None
    return text + (f", dashboard {link}" if link else "")
