"""samples.csv: one row per evaluated sample, appended a batch at a time, read back for a resume.

Columns: ``id, category, ms, chamfer, f_5e-05, f_0.0001, f_0.00015, f_0.0002`` (``ms``: the
network's time for the sample's batch divided by the batch size). :class:`CsvAppender` appends a
batch's rows by one ``write`` and one ``fsync``; :func:`repair_csv` drops a last line left
incomplete by an interrupted write; :func:`read_csv` reads the rows and refuses a file it did not
write.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from ..errors import FileFormatError
from ..metrics.scores import THRESHOLDS

CSV_NAME = "samples.csv"
F_COLUMNS = tuple(f"f_{tau!r}" for tau in THRESHOLDS)
CSV_COLUMNS = ("id", "category", "ms", "chamfer", *F_COLUMNS)


def format_rows(result) -> str:
    """The CSV lines of a scored batch (a :class:`xmesh.pipeline.loop.BatchResult`)."""
    lines = []
    for b, sample in enumerate(result.samples):
        values = [
            str(sample),
            sample.synset,
            f"{result.ms:.3f}",
            repr(float(result.scores["chamfer"][b])),
            *(repr(float(f)) for f in result.scores["fscore"][b]),
        ]
        lines.append(",".join(values) + "\n")
    return "".join(lines)


def row_id(line: str) -> str:
    """The sample id of a CSV line."""
    return line.split(",", 1)[0]


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
        raise FileFormatError(
            f"{path}: not UTF-8 text (byte {exc.start}); expected the samples.csv xmesh eval writes"
        ) from None
    lines = text.splitlines()
    if not lines:
        return []
    header = tuple(next(csv.reader([lines[0]])))
    if header != CSV_COLUMNS:
        raise FileFormatError(
            f"{path}: header {','.join(header)!r}; expected {','.join(CSV_COLUMNS)!r}. "
            "It was not written by this version of xmesh eval: use another --out folder"
        )
    rows, seen = [], {}
    for lineno, fields in enumerate(csv.reader(lines[1:]), start=2):
        if not fields:
            continue
        if len(fields) != len(CSV_COLUMNS):
            raise FileFormatError(
                f"{path}, line {lineno}: {len(fields)} fields; expected {len(CSV_COLUMNS)} "
                f"({','.join(CSV_COLUMNS)}). Remove the line to re-evaluate that sample"
            )
        try:
            numbers = [float(v) for v in fields[2:]]
        except ValueError:
            raise FileFormatError(
                f"{path}, line {lineno}: {','.join(fields)!r} holds a non-number where "
                "ms, chamfer and F-scores are expected; remove the line to re-evaluate it"
            ) from None
        if fields[0] in seen:
            raise FileFormatError(
                f"{path}, line {lineno}: sample {fields[0]} repeats line {seen[fields[0]]}; remove one of them"
            )
        seen[fields[0]] = lineno
        rows.append(
            {
                "id": fields[0],
                "category": fields[1],
                "ms": numbers[0],
                "chamfer": numbers[1],
                "fscore": dict(zip(THRESHOLDS, numbers[2:])),
            }
        )
    return rows


class CsvAppender:
    """Append whole rows to samples.csv: one ``os.write`` per call (a batch's lines), then ``fsync``."""

    def __init__(self, path: Path):
        self.path = path
        fresh = not path.exists() or path.stat().st_size == 0
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # the umask decides
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
