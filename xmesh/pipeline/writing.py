"""Write a run's outputs off the critical path: predicted meshes in worker processes, CSV rows in a
background thread once their meshes are on disk.

File names follow the original's test script: ``{id}_predict.xyz`` (the vertices as NumPy's
``savetxt`` writes them by default, which the original's ``f_score.py`` and ``cd_distance.py``
read) and ``{id}_predict.obj`` (with the template's faces, as :meth:`xmesh.mesh.Mesh.to_obj`
writes), ``{id}`` being the list entry without ``.dat``. With ground truth, ``{id}_ground.xyz`` beside
them: the ``.dat``'s points array as the original's test script saves it (``np.savetxt`` of the whole
array, xyz and normals, in its stored dtype), which its scripts read with the prediction. Every
file is written atomically, so a
file that exists is whole; a killed run can leave only hidden temporary files, which
:func:`remove_stray_temporaries` deletes before the next run.
"""

from __future__ import annotations

import io
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path

import numpy as np

from ..dataset import load_ground_truth_array
from .heap import keep_batch_memory
from .loading import start_pool

XYZ_SUFFIX = "_predict.xyz"
OBJ_SUFFIX = "_predict.obj"
GROUND_SUFFIX = "_ground.xyz"
FORMATS = {"xyz": XYZ_SUFFIX, "obj": OBJ_SUFFIX}
_CHUNK = 8


def prediction_stem(sample) -> str:
    """``02691156_1f87..._00`` for the list entry ``02691156_1f87..._00.dat``."""
    name = str(sample)
    return name[: -len(".dat")] if name.endswith(".dat") else name


def prediction_files(folder: Path, sample, formats: Sequence[str] = tuple(FORMATS)) -> list[Path]:
    """The mesh files of ``sample`` in ``folder``, one per format."""
    stem = prediction_stem(sample)
    return [Path(folder) / f"{stem}{FORMATS[f]}" for f in formats]


def xyz_text(vertices: np.ndarray) -> str:
    """The float32 vertices as ``np.savetxt(path, vertices)`` writes them ('%.18e', spaces, one row a
    line), formatted by compiled code (:mod:`xmesh.io.exact_text`, imported where meshes are written:
    numba's import is not the loop's)."""
    from ..io.exact_text import savetxt_text

    return savetxt_text(vertices)


def ground_text(points: np.ndarray) -> str:
    """``np.savetxt(path, points)``'s text of a ground-truth points array, byte for byte: float32
    through :mod:`xmesh.io.exact_text`, any other dtype through NumPy itself."""
    if points.dtype == np.float32:
        return xyz_text(points)
    buffer = io.StringIO()
    np.savetxt(buffer, points)
    return buffer.getvalue()


def faces_text(faces: np.ndarray) -> str:
    """The 'f a b c' lines (1-based) of an OBJ."""
    return ("f %d %d %d\n" * len(faces)) % tuple((np.asarray(faces, dtype=np.int64) + 1).ravel().tolist())


def obj_text(vertices: np.ndarray, faces: np.ndarray, faces_lines: str | None = None) -> str:
    """An OBJ exactly as :meth:`xmesh.mesh.Mesh.to_obj` writes it ('%.9g' vertices, then faces), the
    vertex lines formatted by compiled code."""
    from ..io.exact_text import obj_vertex_text

    head = f"# xmesh: {len(vertices)} vertices, {len(faces)} faces\n"
    return head + obj_vertex_text(vertices) + (faces_text(faces) if faces_lines is None else faces_lines)


def remove_stray_temporaries(folder: Path) -> int:
    """Delete the hidden temporary files (``.NAME.*.tmp``) an interrupted atomic write left; their count."""
    removed = 0
    if folder.is_dir():
        for path in folder.glob(".*.tmp"):
            path.unlink(missing_ok=True)
            removed += 1
    return removed


_faces: np.ndarray | None = None
_faces_lines: str | None = None


def _init_writer(faces: np.ndarray) -> None:
    global _faces, _faces_lines
    keep_batch_memory()
    _faces = faces
    _faces_lines = faces_text(faces)
    xyz_text(np.zeros((1, 3), dtype=np.float32))  # compile (or load from numba's cache) once, now
    obj_text(np.zeros((1, 3), dtype=np.float32), np.zeros((0, 3), dtype=np.int64), "")


def _replace_file(path: Path, text: str) -> None:
    """Write ``text`` to a hidden temporary file beside ``path`` and rename it there: a reader, or a
    run killed at any point, sees the whole file or none. No fsync: a killed process loses nothing
    the kernel holds, and after a power cut the next run rewrites a file found missing or empty."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8", newline="") as handle:
        handle.write(text)
    os.replace(tmp, path)


def write_predictions(
    folder: str, stems: Sequence[str], vertices: np.ndarray, formats: Sequence[str], ground_root: str | None = None
) -> float:
    """Write each sample's files (in a writer process), with ``ground_root`` (the folder of the
    ``{id}.dat`` ground truth) also ``{id}_ground.xyz``; returns the seconds it took."""
    start = time.perf_counter()
    for stem, verts in zip(stems, vertices):
        if ground_root is not None:
            points = load_ground_truth_array(Path(ground_root) / f"{stem}.dat")
            _replace_file(Path(folder) / f"{stem}{GROUND_SUFFIX}", ground_text(points))
        if "xyz" in formats:
            _replace_file(Path(folder) / f"{stem}{XYZ_SUFFIX}", xyz_text(verts))
        if "obj" in formats:
            _replace_file(Path(folder) / f"{stem}{OBJ_SUFFIX}", obj_text(verts, _faces, _faces_lines))
    return time.perf_counter() - start


class MeshWriter:
    """Writer processes for predicted meshes (``workers`` of them; threads inside a daemon process);
    with ``ground_root``, each sample's ``{id}_ground.xyz`` too."""

    def __init__(
        self,
        folder: Path,
        faces: np.ndarray,
        workers: int,
        formats: Sequence[str] = ("xyz", "obj"),
        ground_root: str | os.PathLike | None = None,
    ):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.formats = tuple(formats)
        self.ground_root = None if ground_root is None else os.fspath(ground_root)
        self.pool = start_pool(max(1, int(workers)), initializer=_init_writer, initargs=(np.asarray(faces),))

    def submit(self, stems: Sequence[str], vertices: np.ndarray) -> list[Future]:
        return [
            self.pool.submit(
                write_predictions,
                str(self.folder),
                list(stems[i : i + _CHUNK]),
                np.ascontiguousarray(vertices[i : i + _CHUNK]),
                self.formats,
                self.ground_root,
            )
            for i in range(0, len(stems), _CHUNK)
        ]

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class BatchFinisher:
    """A background thread that completes batches in order: it waits for a batch's mesh files, then
    calls ``commit(batch)`` (e.g. append its CSV rows, one write and one fsync). At most ``depth``
    batches wait; ``put`` blocks beyond that. An error in a batch stops the thread and is raised by
    the next ``put`` or by ``close``. ``blocked_s``: the caller's time spent blocked in ``put``;
    ``busy_s``: the thread's time committing; ``mesh_s``: the writer processes' seconds."""

    def __init__(self, commit: Callable[[object], None], depth: int = 8):
        self.commit = commit
        self.queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self.error: BaseException | None = None
        self.blocked_s = self.busy_s = self.mesh_s = 0.0
        self.thread = threading.Thread(target=self._run, name="xmesh-finish", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            if self.error is not None:
                continue
            batch, futures = item
            try:
                self.mesh_s += sum(f.result() for f in futures)
                start = time.perf_counter()
                self.commit(batch)
                self.busy_s += time.perf_counter() - start
            except BaseException as exc:  # handed to the main thread
                self.error = exc

    def _raise(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def put(self, batch, futures: list[Future]) -> None:
        """Queue ``batch``; it is committed once ``futures`` (its mesh files) are done."""
        self._raise()
        start = time.perf_counter()
        self.queue.put((batch, futures))
        self.blocked_s += time.perf_counter() - start

    def close(self) -> None:
        """Finish every batch put so far; raise the first error."""
        self.queue.put(None)
        self.thread.join()
        self._raise()
