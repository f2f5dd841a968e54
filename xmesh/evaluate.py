"""Evaluate a reconstructor over a test set in the official layout: Chamfer distance and F-scores.

:func:`evaluate_dataset` writes, in ``out_dir``:

- ``samples.csv``: one row per sample, ``id, category, ms, chamfer, f_5e-05, f_0.0001, f_0.00015,
  f_0.0002`` (``ms``: reconstruction time of the sample's batch divided by the batch size). Each row
  is one ``write`` of a whole line followed by ``fsync``, so an interruption loses at most the
  sample in flight. A later run with the same ``out_dir`` *resumes*: ids already in the file are
  skipped, and a last line left incomplete by an interrupted write is dropped first.
- ``summary.json`` and ``summary.txt``: per-category means (count, CD, CD x1000, F(tau), F(2tau))
  computed from the *whole* CSV, so a resumed run's summary covers every sample; written atomically.

Pipeline: background threads (``workers``) decode the images, cameras and ground truth of the next
batches (at most ``PREFETCH_DEPTH`` batches ahead) while the current batch computes. On the CuPy
backend a decoded batch is copied into a pinned host buffer and sent to the GPU asynchronously on a
separate stream (two buffers, used in turn), so the upload of batch k+1 overlaps the compute of batch
k; the compute stream waits on the upload's event before reading it.
"""
from __future__ import annotations

import contextlib
import csv
import json
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .dataset import DEFAULT_VIEWS, SampleId, SamplePaths, check_sample, load_ground_truth, read_list, sample_paths
from .errors import FileFormatError, InputError, XmeshError
from .io.atomic import atomic_write
from .io.cameras import load_cameras
from .io.images import NETWORK_SHAPE, load_images
from .metrics import BACKENDS as METRIC_BACKENDS
from .metrics import THRESHOLDS, evaluate, summarize
from .progress import Progress

CSV_NAME = "samples.csv"
SUMMARY_JSON = "summary.json"
SUMMARY_TXT = "summary.txt"
F_COLUMNS = tuple(f"f_{tau!r}" for tau in THRESHOLDS)
CSV_COLUMNS = ("id", "category", "ms", "chamfer", *F_COLUMNS)
PREFETCH_DEPTH = 2  # batches decoded ahead of the one computing
TAU, TWO_TAU = 1e-4, 2e-4  # the paper's F-score columns


# ------------------------------------------------------------------------------- loading


@dataclass
class HostBatch:
    samples: list[SampleId]
    images: np.ndarray  # (B, 3, 224, 224, 3) float32
    cameras: np.ndarray  # (B, 3, 5) float32
    gts: list[np.ndarray]  # B arrays (N_i, 3) float32

    def __len__(self) -> int:
        return len(self.samples)


def load_sample(sample: SampleId, paths: SamplePaths, views: Sequence[int] = DEFAULT_VIEWS):
    """(images (3,224,224,3), cameras (3,5), gt (N,3)) of one sample; errors name the sample."""
    try:
        check_sample(sample, paths)
        images = load_images(list(paths.images))
        cameras = load_cameras(paths.cameras, views=list(views))
        gt = load_ground_truth(paths.gt)
    except XmeshError as exc:
        if str(exc).startswith(f"sample {sample}"):
            raise
        raise type(exc)(f"sample {sample}: {exc}") from None
    return images, cameras, gt


def _assemble(batch: list[tuple[SampleId, SamplePaths]], loaded: list[tuple]) -> HostBatch:
    return HostBatch(samples=[s for s, _ in batch], images=np.stack([x[0] for x in loaded]),
                     cameras=np.stack([x[1] for x in loaded]), gts=[x[2] for x in loaded])


class BatchLoader:
    """Iterate the decoded batches; with ``workers > 0`` a thread pool decodes up to ``depth``
    batches ahead (one task per sample, so the threads share a batch), else each batch is decoded
    inline when asked for."""

    def __init__(self, batches: list[list[tuple[SampleId, SamplePaths]]], workers: int = 2,
                 views: Sequence[int] = DEFAULT_VIEWS, depth: int = PREFETCH_DEPTH):
        self.batches = batches
        self.workers = int(workers)
        self.views = tuple(views)
        self.depth = max(int(depth), 1)

    def __iter__(self):
        if self.workers <= 0:
            for batch in self.batches:
                yield _assemble(batch, [load_sample(s, p, self.views) for s, p in batch])
            return
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="xmesh-load")
        pending: deque = deque()
        upcoming = iter(self.batches)

        def submit() -> None:
            batch = next(upcoming, None)
            if batch is not None:
                pending.append((batch, [pool.submit(load_sample, s, p, self.views) for s, p in batch]))

        try:
            for _ in range(self.depth):
                submit()
            while pending:
                batch, futures = pending.popleft()
                loaded = [f.result() for f in futures]
                submit()  # keep `depth` batches decoding while this one computes
                yield _assemble(batch, loaded)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


class CupyStager:
    """Upload host batches to the GPU through pinned buffers on a separate, non-blocking stream.

    Two slots (pinned host buffer + device buffer) are used in turn. Ordering, all by CUDA events:
    the host refills a slot's pinned buffer only after that slot's previous upload finished
    (``copied``); the upload into a slot's device buffer waits for the compute that last read it
    (``consumed``, recorded on the compute stream after :meth:`release`); the compute waits for the
    upload (:meth:`wait`). Nothing is synchronised with the device otherwise.
    """

    SLOTS = 2

    def __init__(self, cupy, batch_size: int, sample_shape: tuple = NETWORK_SHAPE):
        import cupyx

        self.cupy = cupy
        shape = (int(batch_size), *sample_shape)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.pinned = [cupyx.empty_pinned(shape, dtype=np.float32) for _ in range(self.SLOTS)]
        self.device = [cupy.empty(shape, dtype=cupy.float32) for _ in range(self.SLOTS)]
        self.copied = [None] * self.SLOTS
        self.consumed = [None] * self.SLOTS
        self.turn = 0

    def stage(self, images: np.ndarray):
        """Start uploading ``images`` (B, ...) float32; returns (slot, device view (B, ...))."""
        slot = self.turn % self.SLOTS
        self.turn += 1
        count = images.shape[0]
        if self.copied[slot] is not None:
            self.copied[slot].synchronize()  # the pinned buffer's previous upload is done
        host = self.pinned[slot][:count]
        np.copyto(host, images, casting="same_kind")
        if self.consumed[slot] is not None:
            self.stream.wait_event(self.consumed[slot])  # the device buffer is no longer read
        target = self.device[slot][:count]
        target.set(host, stream=self.stream)
        self.copied[slot] = self.stream.record()
        return slot, target

    def wait(self, slot: int) -> None:
        """Make the current (compute) stream wait for the upload into ``slot``."""
        self.cupy.cuda.get_current_stream().wait_event(self.copied[slot])

    def release(self, slot: int) -> None:
        """Call after the compute reading ``slot`` has been queued on the current stream."""
        self.consumed[slot] = self.cupy.cuda.get_current_stream().record()

    def close(self) -> None:
        self.stream.synchronize()


# ------------------------------------------------------------------------------- computing


@dataclass
class SampleResult:
    sample: SampleId
    ms: float
    chamfer: float
    fscore: dict  # {tau: F in percent}

    @property
    def category(self) -> str:
        return self.sample.synset


def _metric_inputs(backend, metric_backend: str, refined, refined_host, index: int, gt: np.ndarray):
    if backend.name == "cupy" and metric_backend in ("auto", "cupy"):
        return refined[index], backend.cupy.asarray(gt)
    return refined_host[index], gt


def run_pipeline(reconstructor, batches: list[list[tuple[SampleId, SamplePaths]]], workers: int = 2,
                 views: Sequence[int] = DEFAULT_VIEWS, metric_backend: str = "auto",
                 on_result: Callable[[SampleResult], None] | None = None) -> dict:
    """Reconstruct and score every batch, calling ``on_result`` per sample in order.

    Returns ``{"samples", "seconds", "samples_per_s"}`` (wall clock over the whole loop: decode,
    upload, compute, metrics)."""
    backend = reconstructor.backend
    device = getattr(backend, "device", None)
    with device if device is not None else contextlib.nullcontext():
        return _run_pipeline(reconstructor, backend, batches, workers, views, metric_backend, on_result)


def _run_pipeline(reconstructor, backend, batches, workers, views, metric_backend, on_result) -> dict:
    stager = None
    if backend.name == "cupy":
        stager = CupyStager(backend.cupy, max(len(b) for b in batches))
    loader = iter(BatchLoader(batches, workers=workers, views=views))
    done = 0
    start = time.perf_counter()

    def stage(batch: HostBatch | None):
        if batch is None or stager is None:
            return batch, None, None if batch is None else batch.images
        slot, images = stager.stage(batch.images)
        return batch, slot, images

    try:
        host, slot, images = stage(next(loader, None))
        while host is not None:
            t0 = time.perf_counter()
            if stager is not None:
                stager.wait(slot)
            _, refined = reconstructor.run(images, host.cameras)
            if stager is not None:
                stager.release(slot)
                # decode/upload the next batch while the GPU computes this one
                upcoming = stage(next(loader, None))
            refined_host = backend.to_numpy(refined)
            ms = (time.perf_counter() - t0) * 1000.0 / len(host)
            if stager is None:
                upcoming = stage(next(loader, None))
            for b, sample in enumerate(host.samples):
                pred, gt = _metric_inputs(backend, metric_backend, refined, refined_host, b, host.gts[b])
                scores = evaluate(pred, gt, THRESHOLDS, backend=metric_backend)
                if on_result is not None:
                    on_result(SampleResult(sample, ms, scores["chamfer"], scores["fscore"]))
                done += 1
            host, slot, images = upcoming
    finally:
        if stager is not None:
            stager.close()
        if hasattr(loader, "close"):
            loader.close()
    seconds = time.perf_counter() - start
    return {"samples": done, "seconds": seconds, "samples_per_s": done / seconds if seconds > 0 else 0.0}


# ------------------------------------------------------------------------------- the CSV


def _format_row(result: SampleResult) -> str:
    values = [str(result.sample), result.category, f"{result.ms:.3f}", repr(float(result.chamfer)),
              *(repr(float(result.fscore[tau])) for tau in THRESHOLDS)]
    return ",".join(values) + "\n"


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
    """Append whole rows to samples.csv: one ``os.write`` per line, then ``fsync``."""

    def __init__(self, path: Path):
        self.path = path
        fresh = not path.exists() or path.stat().st_size == 0
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if fresh:
            self.write(",".join(CSV_COLUMNS) + "\n")

    def write(self, line: str) -> None:
        data = line.encode("utf-8")
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
    lines.append(line("mean", "(categories)", summary["mean_over_categories"]))
    lines.append(line("mean", "(samples)", summary["mean_over_samples"]))
    lines.append(f"tau = {TAU:g}, 2 tau = {TWO_TAU:g} (squared distances); F in percent; "
                 f"mean reconstruction time {summary['mean_ms_per_sample']:.1f} ms/sample")
    return "\n".join(lines) + "\n"


def _write_summary(out_dir: Path, summary: dict) -> None:
    with atomic_write(out_dir / SUMMARY_JSON, "w") as handle:
        json.dump(summary, handle, indent=2)
        handle.write("\n")
    with atomic_write(out_dir / SUMMARY_TXT, "w") as handle:
        handle.write(format_table(summary))


# ------------------------------------------------------------------------------- the loop


def _check_options(batch_size, workers, metric_backend, limit) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise InputError(f"batch_size={batch_size!r}: expected a whole number >= 1")
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 0:
        raise InputError(f"workers={workers!r}: expected a whole number >= 0 (0 decodes inline)")
    if metric_backend not in METRIC_BACKENDS:
        raise InputError(f"metric_backend={metric_backend!r}: choose one of {', '.join(METRIC_BACKENDS)}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1):
        raise InputError(f"limit={limit!r}: expected a whole number >= 1, or None for the whole list")


def _batches(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def measure_throughput(reconstructor, items: list[tuple[SampleId, SamplePaths]], batch_size: int = 1,
                       workers: int = 2, views: Sequence[int] = DEFAULT_VIEWS, metric_backend: str = "auto") -> dict:
    """samples/s of the pipeline over ``items`` with decoding inline (workers=0) and prefetched
    (``workers``), after one warm-up batch. Nothing is written."""
    run_pipeline(reconstructor, _batches(items[:batch_size], batch_size), workers=0, views=views,
                 metric_backend=metric_backend)
    inline = run_pipeline(reconstructor, _batches(items, batch_size), workers=0, views=views,
                          metric_backend=metric_backend)
    prefetch = run_pipeline(reconstructor, _batches(items, batch_size), workers=max(workers, 1), views=views,
                            metric_backend=metric_backend)
    return {
        "samples": len(items),
        "batch_size": batch_size,
        "inline": {"workers": 0, **inline},
        "prefetch": {"workers": max(workers, 1), **prefetch},
        "speedup": prefetch["samples_per_s"] / inline["samples_per_s"] if inline["samples_per_s"] else None,
    }


def evaluate_dataset(reconstructor, list_file, images_root, gt_root, out_dir, batch_size: int = 1, workers: int = 2,
                     metric_backend: str = "auto", limit: int | None = None, progress: bool = True,
                     views: Sequence[int] = DEFAULT_VIEWS, measure_overlap: bool | int = False,
                     meta: dict | None = None) -> dict:
    """Evaluate ``reconstructor`` on the samples of ``list_file`` (the first ``limit`` of them);
    see the module docstring for the outputs and the resume rule. Returns the summary dict (also
    written to summary.json): ``samples``, ``categories`` {synset: {name, count, chamfer,
    chamfer_x1000, fscore {tau: F}}}, ``mean_over_categories``, ``mean_over_samples``,
    ``mean_ms_per_sample``, ``run`` (this call: evaluated, skipped, seconds, samples_per_s) and
    ``throughput`` when ``measure_overlap`` (True, or the number of samples to time, default 8)
    asks to time the pipeline with workers=0 against ``workers``.
    """
    _check_options(batch_size, workers, metric_backend, limit)
    samples = read_list(list_file)
    if limit is not None:
        samples = samples[: int(limit)]
    items = [(s, sample_paths(s, images_root, gt_root, views)) for s in samples]
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"out_dir {str(out_dir)!r} is a file; expected a folder (made if missing)")
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / CSV_NAME
    repaired = repair_csv(csv_path)
    done_ids = {row["id"] for row in read_csv(csv_path)} if csv_path.exists() else set()
    todo = [(s, p) for s, p in items if str(s) not in done_ids]
    for sample, paths in todo:  # fail before any compute when a file is missing
        check_sample(sample, paths)

    run_info = {"evaluated": 0, "skipped": len(items) - len(todo), "repaired_last_line": repaired,
                "seconds": 0.0, "samples_per_s": 0.0, "batch_size": int(batch_size), "workers": int(workers)}
    if todo:
        appender = CsvAppender(csv_path)
        try:
            with Progress(len(todo), desc="xmesh eval", enabled=progress) as bar:
                def record(result: SampleResult) -> None:
                    appender.write(_format_row(result))
                    bar.update(1)

                timing = run_pipeline(reconstructor, _batches(todo, int(batch_size)), workers=int(workers),
                                      views=views, metric_backend=metric_backend, on_result=record)
        finally:
            appender.close()
        run_info.update(evaluated=timing["samples"], seconds=timing["seconds"], samples_per_s=timing["samples_per_s"])

    rows = read_csv(csv_path) if csv_path.exists() else []
    if not rows:
        raise InputError(f"{csv_path}: no evaluated samples to summarise")
    summary = summary_from_rows(rows)
    summary["run"] = run_info
    if measure_overlap:
        count = 8 if measure_overlap is True else int(measure_overlap)
        summary["throughput"] = measure_throughput(reconstructor, items[:count], int(batch_size), int(workers),
                                                   views, metric_backend)
    if meta:
        summary["meta"] = dict(meta)
    _write_summary(out_dir, summary)
    return summary
