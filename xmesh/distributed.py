"""The dataset pipeline on a Dask cluster: ``evaluate_dataset(..., client=...)``, ``xmesh eval
--cluster SPEC`` and ``xmesh reconstruct --list ... --cluster SPEC``.

The list goes out in shards of whole batches (:func:`run_shard`, submitted with retries). Each Dask
worker builds its model once, from a picklable :class:`ModelSpec`, and keeps it (with its CUDA
graphs) in a per-process cache for the whole run; it runs its shards through the same batch loop as
a single process (:func:`xmesh.pipeline.loop.run_batches`; its loader and writers are threads there,
as a Dask worker may not start processes) and writes the shard's meshes into the shared output
folder, atomically, before it returns the shard's CSV lines. One writer on the client appends
those lines as shards finish, so samples.csv, the summary and the resume rule are those of the
single-process run. A worker that dies takes its shard with it, and the scheduler runs that shard
again elsewhere: its rows are written once, when a run of it finishes.

SPEC: ``local:N`` (N single-threaded worker processes on this machine, for the NumPy backend),
``local-cuda`` (dask-cuda's LocalCUDACluster: one worker per visible GPU), or the address of a
running scheduler, ``tcp://HOST:PORT`` (a SLURM or Kubernetes cluster started with dask-jobqueue or
the Dask operator).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .errors import BackendUnavailableError, InputError

EXTRA = 'pip install "xmesh[dask]"'


def _require(module: str, what: str):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as exc:
        raise BackendUnavailableError(f"{what} needs {module.split('.')[0]}, which is not installed: run {EXTRA}") from exc


def client_for(spec: str):
    """A ``distributed.Client`` for SPEC (module docstring); BackendUnavailableError naming the extra
    when Dask (or dask-cuda, for ``local-cuda``) is missing; InputError for a SPEC of another form."""
    text = str(spec).strip()
    if not (text.startswith("local:") or text == "local-cuda" or "://" in text):
        raise InputError(f"--cluster {spec!r}: expected local:N (N worker processes), local-cuda (one worker per "
                         "GPU) or a scheduler address such as tcp://HOST:8786")
    distributed = _require("distributed", f"--cluster {text}")
    import dask

    # workers that may start processes: the pipeline's loader and mesh writers are processes
    dask.config.set({"distributed.worker.daemon": False})
    if text.startswith("local:"):
        try:
            count = int(text[len("local:"):])
        except ValueError:
            count = 0
        if count < 1:
            raise InputError(f"--cluster {spec!r}: N in local:N must be a whole number >= 1")
        cluster = distributed.LocalCluster(n_workers=count, threads_per_worker=1, processes=True,
                                           dashboard_address=None)
        return distributed.Client(cluster)
    if text == "local-cuda":
        dask_cuda = _require("dask_cuda", "--cluster local-cuda")
        return distributed.Client(dask_cuda.LocalCUDACluster(threads_per_worker=1, dashboard_address=None))
    return distributed.Client(text)


@dataclass(frozen=True)
class ModelSpec:
    """How to build a model on a worker: the ``Reconstructor`` arguments as picklable values (weights
    as paths or ``synthetic:SEED``), or ``factory``, a ``"module:callable"`` taking no argument."""

    weights: tuple = ()
    template: str | None = None
    backend: str = "numpy"
    precision: str = "fp32"
    view_quirk: bool = True
    factory: str | None = None

    def build(self):
        if self.factory is not None:
            module, _, name = self.factory.partition(":")
            return getattr(__import__(module, fromlist=["_"]), name)()
        from .commands.common import resolve_weights
        from .reconstruct import Reconstructor

        return Reconstructor(resolve_weights(list(self.weights)), template=self.template, backend=self.backend,
                             precision=self.precision, view_quirk=self.view_quirk)


_MODELS: dict[ModelSpec, Any] = {}  # this worker process's models, built once each
_POOLS: dict[tuple, Any] = {}        # and its loader and mesh-writer pools, started once each


def worker_model(spec: ModelSpec):
    model = _MODELS.get(spec)
    if model is None:
        model = _MODELS[spec] = spec.build()
    return model


def _worker_pool(kind: str, count: int, *init):
    from .pipeline.loading import start_pool

    key = (kind, count)
    if key not in _POOLS:
        _POOLS[key] = start_pool(count, *init) if init else start_pool(count)
    return _POOLS[key]


def prepare_worker(spec: ModelSpec, loaders: int, writers: int) -> str:
    """Build the model and start the pools on this worker before the first shard (as a single
    process builds its model before its first batch)."""
    from .pipeline.writing import _init_writer

    model = worker_model(spec)
    _worker_pool("load", loaders)
    if writers:
        _worker_pool("write", writers, _init_writer, (model.faces,))
    return os.environ.get("CUDA_VISIBLE_DEVICES", "")


@dataclass
class ShardResult:
    samples: int
    csv_text: str
    timing: dict = field(default_factory=dict)
    worker: str = ""


def run_shard(spec: ModelSpec, items: list, batch_size: int, views: Sequence[int], with_gt: bool,
              metric_backend: str, predict_dir: str | None, formats: Sequence[str], workers: int) -> ShardResult:
    """Run on a Dask worker: reconstruct (and score) ``items`` in batches, write their meshes, and
    return their CSV lines (empty without ground truth)."""
    from .evaluate import format_rows
    from .pipeline.loop import run_batches
    from .pipeline.writing import _init_writer, prediction_stem, write_predictions

    writers = max(1, workers) if predict_dir is not None else 0
    prepare_worker(spec, workers, writers)
    model = worker_model(spec)
    writer_pool = _worker_pool("write", writers, _init_writer, (model.faces,)) if writers else None
    if predict_dir is not None:
        Path(predict_dir).mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    pending = []

    def on_batch(result) -> None:
        if predict_dir is not None:
            stems = [prediction_stem(s) for s in result.samples]
            pending.extend(writer_pool.submit(write_predictions, predict_dir, stems[i:i + 8], result.vertices[i:i + 8],
                                              tuple(formats)) for i in range(0, len(stems), 8))
        if result.scores is not None:
            lines.append(format_rows(result))

    batches = [items[i:i + batch_size] for i in range(0, len(items), batch_size)]
    timing = run_batches(model, batches, on_batch, workers=workers, views=views, with_gt=with_gt,
                         keep_vertices=predict_dir is not None, metric_backend=metric_backend,
                         loader_pool=_worker_pool("load", workers))
    timing.write += sum(f.result() for f in pending) / max(1, writers)   # the shard's files are all written
    return ShardResult(len(items), "".join(lines), timing.as_dict(), os.environ.get("DASK_WORKER_NAME", ""))


def shard_items(todo: list, batch_size: int, workers: int) -> list[list]:
    """Whole batches per shard, about four shards per worker (so a lost worker costs little)."""
    batches = [todo[i:i + batch_size] for i in range(0, len(todo), batch_size)]
    per_shard = max(1, len(batches) // max(1, 4 * workers))
    return [[x for b in batches[i:i + per_shard] for x in b] for i in range(0, len(batches), per_shard)]


def run_on_cluster(client, spec: ModelSpec, todo: list, settings: dict, views, with_gt: bool, metric_backend: str,
                   predict_dir: Path | None, formats, commit, progress_bar) -> dict:
    """Submit the shards of ``todo`` and ``commit(csv_text)`` each as it finishes (on this thread)."""
    from distributed import as_completed

    from .pipeline.loop import Timing
    from .pipeline.writing import remove_stray_temporaries

    addresses = list(client.scheduler_info().get("workers", {}))
    workers = max(1, len(addresses))
    shards = shard_items(todo, settings["batch_size"], workers)
    writers = max(1, settings["workers"]) if predict_dir is not None else 0
    # each worker builds its model and starts its pools first, as one process does before its loop
    client.gather([client.submit(prepare_worker, spec, settings["workers"], writers, workers=[a], pure=False,
                                 allow_other_workers=False) for a in addresses])
    start = time.perf_counter()
    futures = [client.submit(run_shard, spec, shard, settings["batch_size"], tuple(views), with_gt, metric_backend,
                             str(predict_dir) if predict_dir is not None else None, tuple(formats),
                             settings["workers"], pure=False, retries=1) for shard in shards]
    total = Timing()
    try:
        for future in as_completed(futures):
            result: ShardResult = future.result()
            commit(result.csv_text)
            progress_bar.update(result.samples)
            for key, value in result.timing.items():
                if key != "wall":
                    setattr(total, key, getattr(total, key) + value)
    finally:
        for future in futures:
            future.cancel()
    total.wall = time.perf_counter() - start
    if predict_dir is not None:
        remove_stray_temporaries(predict_dir)  # a killed worker's half-written files
    return {"evaluated": len(todo), "seconds": total.wall,
            "samples_per_s": len(todo) / total.wall if total.wall > 0 else 0.0,
            "timing": total.as_dict(), "cluster_workers": workers, "shards": len(shards),
            "timing_note": f"stages summed over {workers} worker(s) and {len(shards)} shard(s); wall is the client's"}
