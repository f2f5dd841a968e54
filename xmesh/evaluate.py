"""Evaluate a reconstructor over a test set in the official layout, or reconstruct a whole list.

:func:`evaluate_dataset` writes, in ``out_dir`` (:mod:`xmesh.results`):

- ``samples.csv``: one row per sample, ``id, category, ms, chamfer, f_5e-05, f_0.0001, f_0.00015,
  f_0.0002`` (``ms``: the network's time for the sample's batch divided by the batch size). A batch's
  rows are appended by one ``write`` and one ``fsync``, after its mesh files (if asked for) are on
  disk. A later run with the same ``out_dir`` *resumes*: ids already in the file are skipped, and a
  last line left incomplete by an interrupted write is dropped first.
- ``summary.json`` and ``summary.txt``: per-category means (count, CD, CD x1000, F(tau), F(2tau))
  computed from the *whole* CSV, so a resumed run's summary covers every sample, and in ``run`` this
  call's figures with its ``timing`` (seconds per stage); written atomically.
- ``f_score.log`` and ``cd.log``: the original evaluation scripts' per-category lines
  (:mod:`xmesh.results.p2m_logs`).
- with ``save_meshes``: ``predict/{id}_predict.xyz`` and ``predict/{id}_predict.obj`` per sample
  (:mod:`xmesh.pipeline.writing`); with ``save_ground`` too, the ground truth as
  ``predict/{id}_ground.xyz``, so that the original's ``f_score.py`` and ``cd_distance.py`` read the
  folder (2.4 MB of text a sample from ShapeNet's 16k points with normals, hence not by default).

:func:`reconstruct_dataset` runs the same pipeline without ground truth and writes only the meshes.
Both read: resolve the inputs, choose an executor (:mod:`xmesh.pipeline.executor`: this process,
or with ``client`` (a ``distributed.Client``) a Dask cluster, :mod:`xmesh.cluster`), run, store
the results; either executor writes the same files by the same rules.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .dataset import DEFAULT_VIEWS, list_samples, listing_args
from .errors import InputError, MissingFileError, first_few
from .metrics import BACKENDS as METRIC_BACKENDS
from .pipeline import startup
from .pipeline.executor import Executor, LocalExecutor
from .pipeline.loop import format_timing
from .pipeline.settings import GPU_BATCH, MESH_FORMATS, RunSettings
from .pipeline.writing import FORMATS, GROUND_SUFFIX, prediction_files, prediction_stem, remove_stray_temporaries
from .results import (
    CSV_COLUMNS,
    CSV_NAME,
    SUMMARY_JSON,
    SUMMARY_TXT,
    ResultsStore,
    format_table,
    read_csv,
    repair_csv,
    summary_from_rows,
)

PREDICT_FOLDER = "predict"


def _check_options(batch_size, workers, metric_backend, limit, shard_batches=None) -> None:
    def whole(value, least):
        return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and value >= least

    if batch_size is not None and not whole(batch_size, 1):
        raise InputError(
            f"batch_size={batch_size!r}: expected a whole number >= 1 (or None: {GPU_BATCH} on the GPU, 1 on the CPU)"
        )
    if workers is not None and not whole(workers, 0):
        raise InputError(f"workers={workers!r}: expected a whole number >= 0 (0 decodes inline), or None to choose")
    if metric_backend not in METRIC_BACKENDS:
        raise InputError(f"metric_backend={metric_backend!r}: choose one of {', '.join(METRIC_BACKENDS)}")
    if limit is not None and not whole(limit, 1):
        raise InputError(f"limit={limit!r}: expected a whole number >= 1, or None for the whole list")
    if shard_batches is not None and not whole(shard_batches, 1):
        raise InputError(f"shard_batches={shard_batches!r}: expected a whole number >= 1, or None to choose")


def _progress(total: int, desc: str, enabled: bool):
    """A tqdm bar on stderr; silent with ``enabled=False`` or when stderr is not a terminal."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="sample",
        file=sys.stderr,
        disable=True if not enabled else None,
        dynamic_ncols=True,
        smoothing=0.1,
    )


def _on_gpu(model) -> bool:
    """Whether ``model`` (a Reconstructor, or a :class:`~xmesh.reconstruct.ModelSpec`) runs on the GPU."""
    backend = getattr(model, "backend", None)
    return (backend if isinstance(backend, str) else getattr(backend, "name", "numpy")) == "cupy"


def _cluster_spec(model):
    """The ModelSpec a cluster's workers build ``model`` from: a Reconstructor's ``spec``, or a spec
    (anything with ``backend`` and ``build()``, such as :class:`xmesh.cluster.ModelSpec`)."""
    spec = getattr(model, "spec", model)
    if not (callable(getattr(spec, "build", None)) and isinstance(getattr(spec, "backend", None), str)):
        raise InputError(
            f"{type(model).__name__}: a cluster run builds the model on each worker; pass a Reconstructor "
            "or an xmesh.cluster.ModelSpec (weights as paths, a dict of arrays or 'synthetic:SEED')"
        )
    return spec


def choose_executor(model, client=None, loader_pool=None, shard_batches: int | None = None) -> Executor:
    """This process's pipeline, or with ``client`` the Dask cluster's (:mod:`xmesh.cluster`)."""
    if client is None:
        return LocalExecutor(model, loader_pool)
    from .cluster.driver import DaskExecutor

    return DaskExecutor(client, _cluster_spec(model), shard_batches)


def _run(
    executor: Executor,
    todo: list,
    settings: RunSettings,
    commit,
    progress: bool,
    desc: str,
    clock: startup.StartupClock,
) -> dict:
    with _progress(len(todo), desc, progress) as bar:
        return executor.run(todo, settings, commit, bar, clock)


def _checked_out(out_dir) -> Path:
    """``out_dir`` as a Path, refused when it is a file; it is made only once the inputs are checked
    (:func:`_prepare_out`), so that a refused run leaves no empty folder behind."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"out_dir {str(out_dir)!r} is a file; expected a folder (made if missing)")
    return out_dir


def _prepare_out(out_dir) -> Path:
    out_dir = _checked_out(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def clear_results(out_dir, evaluation: bool = True) -> int:
    """Delete what an earlier :func:`evaluate_dataset` (``evaluation``) or :func:`reconstruct_dataset`
    wrote in ``out_dir``, so that a run there starts afresh; other files stay. The count deleted."""
    from .results.p2m_logs import CD_LOG, F_SCORE_LOG

    out_dir = Path(out_dir)
    meshes = out_dir / PREDICT_FOLDER if evaluation else out_dir
    suffixes = (*FORMATS.values(), GROUND_SUFFIX) if evaluation else tuple(FORMATS.values())
    files = [p for p in meshes.glob("*") if p.name.endswith(suffixes)] if meshes.is_dir() else []
    if evaluation:
        files += [out_dir / name for name in (CSV_NAME, SUMMARY_JSON, SUMMARY_TXT, F_SCORE_LOG, CD_LOG)]
    removed = 0
    for path in files:
        if path.is_file():
            path.unlink()
            removed += 1
    return removed + remove_stray_temporaries(meshes)


def _check_identity(out_dir, identity, overwrite: bool) -> None:
    if identity is not None:
        from .results.run_identity import check_identity

        check_identity(out_dir, identity, overwrite)


def _start_out(out_dir, identity, overwrite: bool, evaluation: bool) -> None:
    """Make ``out_dir`` once the inputs are checked: the earlier results cleared with ``overwrite``, this
    run's identity recorded."""
    _prepare_out(out_dir)
    if overwrite:
        clear_results(out_dir, evaluation)
    if identity is not None:
        from .results.run_identity import record_identity

        record_identity(out_dir, identity)


def _fail_on_missing(listed: list, todo: list) -> None:
    """Raise one MissingFileError for the samples to run with a file absent: the first one's message, and
    how many others there are with the first few of their ids."""
    problems = {s: problem for s, _, problem in listed if problem is not None}
    failing = [sample for sample, _ in todo if sample in problems]
    if not failing:
        return
    first = problems[failing[0]]
    if len(failing) == 1:
        raise first
    others = first_few([str(sample) for sample in failing[1:]])
    raise MissingFileError(
        f"{len(failing)} of the {len(todo)} sample(s) to run lack files: {first}; also {others}"
    ) from None


def _have_files(folder: Path, sample, formats, ground: bool = False) -> bool:
    """Whether every mesh file of ``sample`` (with ``ground``, its ground-truth text too) is there and
    not empty (a power cut can leave a renamed file whose data never reached the disk; a killed
    process cannot)."""
    paths = prediction_files(folder, sample, formats)
    if ground:
        paths.append(Path(folder) / f"{prediction_stem(sample)}{GROUND_SUFFIX}")
    for path in paths:
        try:
            if path.stat().st_size == 0:
                return False
        except FileNotFoundError:
            return False
    return True


def evaluate_dataset(
    reconstructor,
    list_file,
    images_root,
    gt_root,
    out_dir,
    batch_size: int | None = None,
    workers: int | None = None,
    metric_backend: str = "auto",
    limit: int | None = None,
    progress: bool = True,
    views: Sequence[int] = DEFAULT_VIEWS,
    save_meshes: bool = False,
    meta: dict | None = None,
    loader_pool=None,
    client=None,
    shard_batches: int | None = None,
    save_ground: bool = False,
    identity=None,
    overwrite: bool = False,
) -> dict:
    """Evaluate ``reconstructor`` on the samples of ``list_file`` (the first ``limit`` of them);
    see the module docstring for the outputs and the resume rule. ``batch_size`` and ``workers``
    (loader processes) default to the GPU's or the CPU's settings (:meth:`RunSettings.choose`).
    Returns the summary dict (also written to summary.json): ``samples``, ``categories`` {synset:
    {name, count, chamfer, chamfer_x1000, fscore {tau: F}}}, ``mean_over_categories`` (those present),
    ``mean_over_13_categories`` (absent ones as 0, as the original prints), ``mean_over_samples``,
    ``mean_ms_per_sample`` and ``run`` (this call: evaluated, skipped,
    seconds, samples_per_s, the settings, and ``timing``: seconds per stage). ``loader_pool``: an
    executor from :func:`xmesh.pipeline.loading.start_pool`, started before the model was built so
    that its start-up overlaps the model's (the command line does this).

    ``client``: a ``distributed.Client``; the samples then run on its workers (:mod:`xmesh.cluster`),
    ``reconstructor`` may be an :class:`xmesh.cluster.ModelSpec` from which each worker builds its
    own model, and ``shard_batches`` caps the batches sent to a worker at once; ``run`` gains
    ``cluster``, and its stage seconds are per worker.

    ``identity``: the run's :class:`~xmesh.results.run_identity.RunIdentity`; an ``out_dir`` recording
    another is refused, else it is recorded (``out_dir/run.json``) once the inputs are checked.
    ``overwrite``: start afresh, the earlier results deleted (:func:`clear_results`) instead of resumed.
    """
    clock = startup.adopt()
    _check_options(batch_size, workers, metric_backend, limit, shard_batches)
    if save_ground and not save_meshes:
        raise InputError("save_ground=True writes {id}_ground.xyz beside the predictions: it needs save_meshes=True")
    predict_dir = Path(out_dir) / PREDICT_FOLDER if save_meshes else None
    settings = RunSettings.choose(
        _on_gpu(reconstructor),
        batch_size,
        workers,
        save_meshes,
        views=views,
        with_gt=True,
        metric_backend=metric_backend,
        mesh_dir=str(predict_dir) if predict_dir is not None else None,
        ground_root=str(gt_root) if save_ground else None,
    )
    listed = startup.take(list_samples, *listing_args(list_file, images_root, gt_root, views, limit, True))
    items = [(s, p) for s, p, _ in listed]
    _check_identity(out_dir, identity, overwrite)
    store = None if overwrite else ResultsStore(_checked_out(out_dir))
    if predict_dir is not None and store is not None:
        remove_stray_temporaries(predict_dir)
    # a sample is done when its row is in the CSV and, with meshes, its files are whole on disk
    todo = [
        (s, p)
        for s, p in items
        if store is None
        or str(s) not in store.done_ids
        or (predict_dir is not None and not _have_files(predict_dir, s, MESH_FORMATS, ground=save_ground))
    ]
    _fail_on_missing(listed, todo)  # before any compute
    _start_out(out_dir, identity, overwrite, evaluation=True)
    if store is None:
        store = ResultsStore(Path(out_dir))
    clock.mark("listing")

    run_info = {
        "evaluated": 0,
        "skipped": len(items) - len(todo),
        "repaired_last_line": store.repaired_last_line,
        "seconds": 0.0,
        "samples_per_s": 0.0,
        **settings.as_summary(),
        "save_meshes": bool(save_meshes),
        "save_ground": bool(save_ground),
    }
    if todo:
        executor = choose_executor(reconstructor, client, loader_pool, shard_batches)
        run_settings = settings.chosen_by_workers() if client is not None and workers is None else settings
        with store:
            run_info.update(_run(executor, todo, run_settings, store.append, progress, "xmesh eval", clock))
    return store.finish(run_info, meta, clock)


def reconstruct_dataset(
    reconstructor,
    list_file,
    images_root,
    out_dir,
    batch_size: int | None = None,
    workers: int | None = None,
    limit: int | None = None,
    progress: bool = True,
    views: Sequence[int] = DEFAULT_VIEWS,
    formats: Sequence[str] = MESH_FORMATS,
    loader_pool=None,
    client=None,
    shard_batches: int | None = None,
    identity=None,
    overwrite: bool = False,
) -> dict:
    """Reconstruct every sample of ``list_file`` (official layout, no ground truth needed) into
    ``out_dir/{id}_predict.xyz`` and ``.obj``. Resumable: a sample whose files all exist is skipped.
    Returns ``{"evaluated", "skipped", "seconds", "samples_per_s", settings..., "timing"}``.
    ``client``, ``shard_batches``, ``identity`` and ``overwrite``: as for :func:`evaluate_dataset`."""
    clock = startup.adopt()
    _check_options(batch_size, workers, "auto", limit, shard_batches)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise InputError(f"formats={list(formats)!r}: choose among {', '.join(FORMATS)}")
    settings = RunSettings.choose(
        _on_gpu(reconstructor),
        batch_size,
        workers,
        save_meshes=True,
        views=views,
        with_gt=False,
        mesh_dir=str(out_dir),
        formats=tuple(formats),
    )
    listed = startup.take(list_samples, *listing_args(list_file, images_root, out_dir, views, limit, False))
    items = [(s, p) for s, p, _ in listed]
    out_dir = _checked_out(out_dir)
    _check_identity(out_dir, identity, overwrite)
    if not overwrite:
        remove_stray_temporaries(out_dir)
    todo = [(s, p) for s, p in items if overwrite or not _have_files(out_dir, s, formats)]
    _fail_on_missing(listed, todo)
    _start_out(out_dir, identity, overwrite, evaluation=False)
    clock.mark("listing")
    info = {
        "evaluated": 0,
        "skipped": len(items) - len(todo),
        "seconds": 0.0,
        "samples_per_s": 0.0,
        **settings.as_summary(),
    }
    if todo:
        executor = choose_executor(reconstructor, client, loader_pool, shard_batches)
        run_settings = settings.chosen_by_workers() if client is not None and workers is None else settings
        info.update(_run(executor, todo, run_settings, lambda text: None, progress, "xmesh reconstruct", clock))
        if "timing" in info:
            info["timing"].update(clock.after_last_batch(info["seconds"]))
    return info


__all__ = [
    "evaluate_dataset",
    "reconstruct_dataset",
    "choose_executor",
    "RunSettings",
    "read_csv",
    "repair_csv",
    "summary_from_rows",
    "format_table",
    "format_timing",
    "CSV_COLUMNS",
]
