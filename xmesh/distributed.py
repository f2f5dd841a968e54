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


def worker_model(spec: ModelSpec):
    model = _MODELS.get(spec)
    if model is None:
        model = _MODELS[spec] = spec.build()
    return model


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
    from .pipeline.writing import write_predictions, _init_writer, prediction_stem

    model = worker_model(spec)
    if predict_dir is not None:
        _init_writer(model.faces)
        Path(predict_dir).mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    write_s = 0.0

    def on_batch(result) -> None:
        nonlocal write_s
        if predict_dir is not None:
            write_s += write_predictions(predict_dir, [prediction_stem(s) for s in result.samples], result.vertices,
                                         formats)
        if result.scores is not None:
            lines.append(format_rows(result))

    batches = [items[i:i + batch_size] for i in range(0, len(items), batch_size)]
    timing = run_batches(model, batches, on_batch, workers=workers, views=views, with_gt=with_gt,
                         keep_vertices=predict_dir is not None, metric_backend=metric_backend)
    timing.write += write_s
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

    workers = max(1, len(client.scheduler_info().get("workers", {})) or 1)
    shards = shard_items(todo, settings["batch_size"], workers)
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
