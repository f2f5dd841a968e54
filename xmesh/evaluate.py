"""Evaluate a reconstructor over a test set in the official layout, or reconstruct a whole list.

:func:`evaluate_dataset` writes, in ``out_dir``:

- ``samples.csv``: one row per sample, ``id, category, ms, chamfer, f_5e-05, f_0.0001, f_0.00015,
  f_0.0002`` (``ms``: the network's time for the sample's batch divided by the batch size). A batch's
  rows are appended by one ``write`` and one ``fsync``, after its mesh files (if asked for) are on
  disk. A later run with the same ``out_dir`` *resumes*: ids already in the file are skipped, and a
  last line left incomplete by an interrupted write is dropped first.
- ``summary.json`` and ``summary.txt``: per-category means (count, CD, CD x1000, F(tau), F(2tau))
  computed from the *whole* CSV, so a resumed run's summary covers every sample, and in ``run`` this
  call's figures with its ``timing`` (seconds per stage); written atomically.
- ``f_score.log`` and ``cd.log``: the original evaluation scripts' per-category lines
  (:mod:`xmesh.io.p2m_logs`).
- with ``save_meshes``: ``predict/{id}_predict.xyz``, ``predict/{id}_predict.obj`` and the ground
  truth as ``predict/{id}_ground.xyz`` per sample (:mod:`xmesh.pipeline.writing`), the files the
  original's ``f_score.py`` and ``cd_distance.py`` read.

:func:`reconstruct_dataset` runs the same pipeline without ground truth and writes only the meshes.
The pipeline itself is :mod:`xmesh.pipeline`. With ``client`` (a ``distributed.Client``) both run on
a Dask cluster (:mod:`xmesh.cluster`) and write the same files, by the same rules.
"""
from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from .dataset import DEFAULT_VIEWS, list_samples, listing_args
from .errors import FileFormatError, InputError, XmeshError
from .io.atomic import atomic_write
from .io.p2m_logs import write_logs
from .metrics import BACKENDS as METRIC_BACKENDS
from .metrics import THRESHOLDS, summarize
from .pipeline.loading import default_workers
from .pipeline import startup
from .pipeline.loop import BatchResult, format_timing, run_batches
from .pipeline.writing import (FORMATS, GROUND_SUFFIX, BatchFinisher, MeshWriter, prediction_stem,
                               remove_stray_temporaries)

CSV_NAME = "samples.csv"
SUMMARY_JSON = "summary.json"
SUMMARY_TXT = "summary.txt"
PREDICT_FOLDER = "predict"
F_COLUMNS = tuple(f"f_{tau!r}" for tau in THRESHOLDS)
CSV_COLUMNS = ("id", "category", "ms", "chamfer", *F_COLUMNS)
TAU, TWO_TAU = 1e-4, 2e-4  # the paper's F-score columns
GPU_BATCH = 64  # the default batch size on the GPU: within 5% of the best samples/s on an H100


def format_rows(result: BatchResult, skip: set | frozenset = frozenset()) -> str:
    """The CSV lines of a scored batch, less those of samples in ``skip`` (already in the CSV)."""
    lines = []
    for b, sample in enumerate(result.samples):
        if str(sample) in skip:
            continue
        values = [str(sample), sample.synset, f"{result.ms:.3f}", repr(float(result.scores["chamfer"][b])),
                  *(repr(float(f)) for f in result.scores["fscore"][b])]
        lines.append(",".join(values) + "\n")
    return "".join(lines)


def repair_csv(path: Path) -> bool:
    """Drop an incomplete last line (an interrupted write); True when something was cut."""
    if not path.exists():
        return False
    with open(path, "r+b") as handle:
        data = handle.read()
        if not data or data.endswith(b"\n"):
            return False
        keep = data.rfind(b"\n") + 1
        handle.truncate(keep)
        handle.flush()
        os.fsync(handle.fileno())
    return True


def read_csv(path: Path) -> list[dict]:
    """The rows of a samples.csv as dicts {id, category, ms, chamfer, fscore {tau: F}}."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise FileFormatError(f"{path}: not UTF-8 text (byte {exc.start}); expected the samples.csv xmesh eval writes") from None
    lines = text.splitlines()
    if not lines:
        return []
    header = tuple(next(csv.reader([lines[0]])))
    if header != CSV_COLUMNS:
        raise FileFormatError(f"{path}: header {','.join(header)!r}; expected {','.join(CSV_COLUMNS)!r}. "
                              "It was not written by this version of xmesh eval: use another --out folder")
    rows, seen = [], {}
    for lineno, fields in enumerate(csv.reader(lines[1:]), start=2):
        if not fields:
            continue
        if len(fields) != len(CSV_COLUMNS):
            raise FileFormatError(f"{path}, line {lineno}: {len(fields)} fields; expected {len(CSV_COLUMNS)} "
                                  f"({','.join(CSV_COLUMNS)}). Remove the line to re-evaluate that sample")
        try:
            numbers = [float(v) for v in fields[2:]]
        except ValueError:
            raise FileFormatError(f"{path}, line {lineno}: {','.join(fields)!r} holds a non-number where "
                                  "ms, chamfer and F-scores are expected; remove the line to re-evaluate it") from None
        if fields[0] in seen:
            raise FileFormatError(f"{path}, line {lineno}: sample {fields[0]} repeats line {seen[fields[0]]}; "
                                  "remove one of them")
        seen[fields[0]] = lineno
        rows.append({"id": fields[0], "category": fields[1], "ms": numbers[0], "chamfer": numbers[1],
                     "fscore": dict(zip(THRESHOLDS, numbers[2:]))})
    return rows


class CsvAppender:
    """Append whole rows to samples.csv: one ``os.write`` per call (a batch's lines), then ``fsync``."""

    def __init__(self, path: Path):
        self.path = path
        fresh = not path.exists() or path.stat().st_size == 0
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if fresh:
            self.write(",".join(CSV_COLUMNS) + "\n")

    def write(self, text: str) -> None:
        data = text.encode("utf-8")
        written = os.write(self.fd, data)
        if written != len(data):  # a regular file takes it all unless the disk is full
            raise OSError(f"{self.path}: short write ({written} of {len(data)} bytes); is the disk full?")
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# ------------------------------------------------------------------------------- summary


def _json_means(means: dict) -> dict:
    out = {k: v for k, v in means.items() if k != "fscore"}
    out["fscore"] = {repr(tau): value for tau, value in means["fscore"].items()}
    return out


def summary_from_rows(rows: list[dict]) -> dict:
    """summarize() of the CSV rows, JSON-ready (F-score keys are the thresholds as text)."""
    table = summarize(rows)
    return {
        "samples": len(rows),
        "categories": {cat: {"name": v["name"], **_json_means(v)} for cat, v in table["categories"].items()},
        "mean_over_categories": _json_means(table["mean_over_categories"]),
        "mean_over_13_categories": _json_means(table["mean_over_13_categories"]),
        "mean_over_samples": _json_means(table["mean_over_samples"]),
        "mean_ms_per_sample": float(np.mean([r["ms"] for r in rows])),
    }


def format_table(summary: dict) -> str:
    """The per-category table of a summary dict (as returned by :func:`evaluate_dataset`)."""
    tau, two = repr(TAU), repr(TWO_TAU)
    head = f"{'category':<10} {'name':<12} {'count':>6} {'CD':>12} {'CD x1000':>10} {'F(tau)':>8} {'F(2tau)':>8}"
    lines = [head, "-" * len(head)]

    def line(cat: str, name: str, m: dict) -> str:
        return (f"{cat:<10} {name:<12} {m['count']:>6d} {m['chamfer']:>12.6g} {m['chamfer_x1000']:>10.4f} "
                f"{m['fscore'][tau]:>8.2f} {m['fscore'][two]:>8.2f}")

    for cat, m in summary["categories"].items():
        lines.append(line(cat, m["name"], m))
    lines.append("-" * len(head))
    lines.append(line("mean", "(present)", summary["mean_over_categories"]))
    lines.append(line("mean", "(all 13)", summary["mean_over_13_categories"]))
    lines.append(line("mean", "(samples)", summary["mean_over_samples"]))
    present = len(summary["categories"])
    lines.append(f"means: (present) over the {present} categor{'y' if present == 1 else 'ies'} evaluated; (all 13) over "
                 "the original's 13 categories, absent ones as 0, as its f_score.py prints")
    lines.append(f"tau = {TAU:g}, 2 tau = {TWO_TAU:g} (squared distances); F in percent; "
                 f"mean reconstruction time {summary['mean_ms_per_sample']:.1f} ms/sample")
    return "\n".join(lines) + "\n"


def _write_summary(out_dir: Path, summary: dict) -> None:
    with atomic_write(out_dir / SUMMARY_JSON, "w") as handle:
        json.dump(summary, handle, indent=2)
        handle.write("\n")
    with atomic_write(out_dir / SUMMARY_TXT, "w") as handle:
        handle.write(format_table(summary))




# ------------------------------------------------------------------------------- running


def _check_options(batch_size, workers, metric_backend, limit, shard_batches=None) -> None:
    def whole(value, least):
        return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and value >= least

    if batch_size is not None and not whole(batch_size, 1):
        raise InputError(f"batch_size={batch_size!r}: expected a whole number >= 1 (or None: {GPU_BATCH} on the GPU, 1 on the CPU)")
    if workers is not None and not whole(workers, 0):
        raise InputError(f"workers={workers!r}: expected a whole number >= 0 (0 decodes inline), or None to choose")
    if metric_backend not in METRIC_BACKENDS:
        raise InputError(f"metric_backend={metric_backend!r}: choose one of {', '.join(METRIC_BACKENDS)}")
    if limit is not None and not whole(limit, 1):
        raise InputError(f"limit={limit!r}: expected a whole number >= 1, or None for the whole list")
    if shard_batches is not None and not whole(shard_batches, 1):
        raise InputError(f"shard_batches={shard_batches!r}: expected a whole number >= 1, or None to choose")


def choose_settings(gpu: bool, batch_size=None, workers=None, save_meshes: bool = False) -> dict:
    """The batch size and process counts a run uses: given values, else the GPU's or the CPU's
    defaults (:func:`xmesh.pipeline.loading.default_workers`). ``workers`` given sets the loaders and,
    with meshes, as many writers."""
    loaders, writers = default_workers(gpu, save_meshes)
    if workers is not None:
        loaders, writers = int(workers), (max(1, int(workers)) if save_meshes else 0)
    return {"batch_size": int(batch_size) if batch_size is not None else (GPU_BATCH if gpu else 1),
            "workers": loaders, "writers": writers}


def _batches(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _progress(total: int, desc: str, enabled: bool):
    """A tqdm bar on stderr; silent with ``enabled=False`` or when stderr is not a terminal."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="sample", file=sys.stderr, disable=True if not enabled else None,
                dynamic_ncols=True, smoothing=0.1)


def _on_gpu(model) -> bool:
    """Whether ``model`` (a Reconstructor, or a cluster.ModelSpec) runs on the GPU."""
    backend = getattr(model, "backend", None)
    return (backend if isinstance(backend, str) else getattr(backend, "name", "numpy")) == "cupy"


def _cluster_spec(model):
    """The ModelSpec a cluster's workers build ``model`` from: a Reconstructor's ``spec``, or a spec
    (anything with ``backend`` and ``build()``, such as :class:`xmesh.cluster.ModelSpec`)."""
    spec = getattr(model, "spec", model)
    if not (callable(getattr(spec, "build", None)) and isinstance(getattr(spec, "backend", None), str)):
        raise InputError(f"{type(model).__name__}: a cluster run builds the model on each worker; pass a Reconstructor "
                         "or an xmesh.cluster.ModelSpec (weights as paths, a dict of arrays or 'synthetic:SEED')")
    return spec


def _prepare_out(out_dir) -> Path:
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"out_dir {str(out_dir)!r} is a file; expected a folder (made if missing)")
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def check_finite(result: BatchResult) -> None:
    """Refuse a scored batch whose prediction holds NaN or infinite coordinates, naming the sample."""
    if result.scores is not None:
        bad = np.flatnonzero(~result.scores["finite"])
        if bad.size:
            raise XmeshError(f"sample {result.samples[bad[0]]}: the network's prediction holds NaN or infinite "
                             "coordinates; check the weights (and --precision) used")


def _run(reconstructor, todo, settings, out_dir: Path, predict_dir: Path | None, commit, progress, desc,
         views, with_gt, metric_backend, formats=("xyz", "obj"), loader_pool=None, ground_root=None, clock=None) -> dict:
    """Run the pipeline over ``todo``; ``commit(result, text)`` is called in order from the finisher
    thread once a batch's meshes are written (with ``ground_root``, the ground-truth text files too).
    Returns this run's figures with its timing."""
    writer = MeshWriter(predict_dir, reconstructor.faces, settings["writers"], formats,
                        ground_root) if predict_dir else None
    finisher = None
    with _progress(len(todo), desc, progress) as bar:
        def finish(item) -> None:
            commit(item)
            bar.update(len(item.samples))

        finisher = BatchFinisher(finish)

        def on_batch(result: BatchResult) -> None:
            check_finite(result)
            futures = writer.submit([prediction_stem(s) for s in result.samples], result.vertices) if writer else []
            finisher.put(result, futures)

        started = (clock or startup.StartupClock()).first_batch()
        try:
            timing = run_batches(reconstructor, _batches(todo, settings["batch_size"]), on_batch,
                                 workers=settings["workers"], views=views, with_gt=with_gt,
                                 keep_vertices=writer is not None, metric_backend=metric_backend,
                                 loader_pool=loader_pool)
        finally:
            try:
                finisher.close()   # commit every batch that completed, also when the run failed
            finally:
                if writer is not None:
                    writer.close()
    timing.write = finisher.busy_s + finisher.mesh_s / max(1, settings["writers"])
    return {"evaluated": len(todo), "seconds": timing.wall,
            "samples_per_s": len(todo) / timing.wall if timing.wall > 0 else 0.0,
            "timing": {**timing.as_dict(), **started}}


def _on_cluster(client, model, todo, settings, predict_dir: Path | None, commit, progress, desc, views, with_gt,
                metric_backend, formats=("xyz", "obj"), shard_batches=None, workers=None, ground_root=None, clock=None) -> dict:
    """:func:`_run` on a Dask cluster: the workers write the meshes, ``commit(text)`` the CSV lines.
    ``workers`` None: each worker chooses its loader and writer processes from its own cores."""
    from .cluster.driver import run_on_cluster

    if workers is None:
        settings = {**settings, "workers": None, "writers": None}

    with _progress(len(todo), desc, progress) as bar:
        info = run_on_cluster(client, _cluster_spec(model), todo, settings, predict_dir, commit, bar, views, with_gt,
                              metric_backend, formats, shard_batches, ground_root, clock)
    if predict_dir is not None:
        remove_stray_temporaries(predict_dir)   # left by a worker killed while writing
    return info


def evaluate_dataset(reconstructor, list_file, images_root, gt_root, out_dir, batch_size: int | None = None,
                     workers: int | None = None, metric_backend: str = "auto", limit: int | None = None,
                     progress: bool = True, views: Sequence[int] = DEFAULT_VIEWS, save_meshes: bool = False,
                     meta: dict | None = None, loader_pool=None, client=None, shard_batches: int | None = None) -> dict:
    """Evaluate ``reconstructor`` on the samples of ``list_file`` (the first ``limit`` of them);
    see the module docstring for the outputs and the resume rule. ``batch_size`` and ``workers``
    (loader processes) default to the GPU's or the CPU's settings (:func:`choose_settings`).
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
    """
    clock = startup.adopt()
    _check_options(batch_size, workers, metric_backend, limit, shard_batches)
    settings = choose_settings(_on_gpu(reconstructor), batch_size, workers, save_meshes)
    listed = startup.take(list_samples, *listing_args(list_file, images_root, gt_root, views, limit, True))
    items = [(s, p) for s, p, _ in listed]
    out_dir = _prepare_out(out_dir)
    csv_path = out_dir / CSV_NAME
    repaired = repair_csv(csv_path)
    done_ids = {row["id"] for row in read_csv(csv_path)} if csv_path.exists() else set()
    predict_dir = out_dir / PREDICT_FOLDER if save_meshes else None
    if predict_dir is not None:
        remove_stray_temporaries(predict_dir)
    # a sample is done when its row is in the CSV and, with meshes, its files are whole on disk
    todo = [(s, p) for s, p in items if str(s) not in done_ids
            or (predict_dir is not None and not _have_files(predict_dir, s, ("xyz", "obj"), ground=True))]
    _fail_on_missing(listed, todo)   # before any compute
    clock.mark("listing")

    run_info = {"evaluated": 0, "skipped": len(items) - len(todo), "repaired_last_line": repaired,
                "seconds": 0.0, "samples_per_s": 0.0, **settings, "save_meshes": bool(save_meshes)}
    if todo and client is not None:
        appender = CsvAppender(csv_path)
        try:
            run_info.update(_on_cluster(client, reconstructor, todo, settings, predict_dir,
                                        lambda text: _append_new(appender, text, done_ids), progress, "xmesh eval",
                                        views, True, metric_backend, shard_batches=shard_batches, workers=workers,
                                        ground_root=gt_root if save_meshes else None, clock=clock))
        finally:
            appender.close()
    elif todo:
        appender = CsvAppender(csv_path)
        try:
            run_info.update(_run(reconstructor, todo, settings, out_dir, predict_dir,
                                 lambda result: appender.write(format_rows(result, skip=done_ids)), progress,
                                 "xmesh eval",
                                 views, True, metric_backend, loader_pool=loader_pool,
                                 ground_root=gt_root if save_meshes else None, clock=clock))
        finally:
            appender.close()

    rows = read_csv(csv_path) if csv_path.exists() else []
    if not rows:
        raise InputError(f"{csv_path}: no evaluated samples to summarise")
    summary = summary_from_rows(rows)
    summary["run"] = run_info
    if meta:
        summary["meta"] = dict(meta)
    write_logs(out_dir, rows)
    if "timing" in run_info:
        run_info["timing"].update(clock.after_last_batch(run_info["seconds"]))
    _write_summary(out_dir, summary)
    return summary


def _fail_on_missing(listed: list, todo: list) -> None:
    """Raise the MissingFileError of the first sample to run with a file absent."""
    problems = {s: problem for s, _, problem in listed if problem is not None}
    for sample, _ in todo:
        if sample in problems:
            raise problems[sample]


def _append_new(appender: CsvAppender, text: str, skip: set) -> None:
    """Append a shard's CSV lines, less those of samples already in the CSV."""
    lines = [line for line in text.splitlines(keepends=True) if line.split(",", 1)[0] not in skip]
    if lines:
        appender.write("".join(lines))


def prediction_files(out_dir: Path, sample, formats=tuple(FORMATS)) -> list[Path]:
    stem = prediction_stem(sample)
    return [Path(out_dir) / f"{stem}{FORMATS[f]}" for f in formats]


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


def reconstruct_dataset(reconstructor, list_file, images_root, out_dir, batch_size: int | None = None,
                        workers: int | None = None, limit: int | None = None, progress: bool = True,
                        views: Sequence[int] = DEFAULT_VIEWS, formats: Sequence[str] = ("xyz", "obj"),
                        loader_pool=None, client=None, shard_batches: int | None = None) -> dict:
    """Reconstruct every sample of ``list_file`` (official layout, no ground truth needed) into
    ``out_dir/{id}_predict.xyz`` and ``.obj``. Resumable: a sample whose files all exist is skipped.
    Returns ``{"evaluated", "skipped", "seconds", "samples_per_s", settings..., "timing"}``.
    ``client`` and ``shard_batches``: as for :func:`evaluate_dataset`."""
    clock = startup.adopt()
    _check_options(batch_size, workers, "auto", limit, shard_batches)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise InputError(f"formats={list(formats)!r}: choose among {', '.join(FORMATS)}")
    settings = choose_settings(_on_gpu(reconstructor), batch_size, workers, save_meshes=True)
    listed = startup.take(list_samples, *listing_args(list_file, images_root, out_dir, views, limit, False))
    items = [(s, p) for s, p, _ in listed]
    out_dir = _prepare_out(out_dir)
    remove_stray_temporaries(out_dir)
    todo = [(s, p) for s, p in items if not _have_files(out_dir, s, formats)]
    _fail_on_missing(listed, todo)
    clock.mark("listing")
    info = {"evaluated": 0, "skipped": len(items) - len(todo), "seconds": 0.0, "samples_per_s": 0.0, **settings}
    if todo and client is not None:
        info.update(_on_cluster(client, reconstructor, todo, settings, out_dir, lambda text: None, progress,
                                "xmesh reconstruct", views, False, "auto", tuple(formats), shard_batches, workers, clock=clock))
    elif todo:
        info.update(_run(reconstructor, todo, settings, out_dir, out_dir, lambda result: None, progress,
                         "xmesh reconstruct", views, False, "auto", tuple(formats), loader_pool=loader_pool,
                         clock=clock))
    if "timing" in info:
        info["timing"].update(clock.after_last_batch(info["seconds"]))
    return info


__all__ = ["evaluate_dataset", "reconstruct_dataset", "read_csv", "repair_csv", "summary_from_rows", "format_table",
           "format_timing", "choose_settings", "CSV_COLUMNS"]
