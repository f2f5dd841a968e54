"""What a training run writes as it goes: the per-step CSV, the validation CSV and the loss curves.

``train_log.csv``: one row a step (step, epoch, the samples, the loss, every loss term, the step's
seconds and samples/s, and the wall seconds since the step before ended), appended and flushed as each
step ends; a resumed run first drops the rows after its checkpoint's step (they are computed again, to
the same values on NumPy). ``val_log.csv``: one row an
epoch (the evaluation pipeline's Chamfer and F-scores over the validation list). ``loss.png``: the
curves of both, drawn with matplotlib (the ``report`` extra), imported only here.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

from ..io.atomic import atomic_output

TRAIN_LOG = "train_log.csv"
VAL_LOG = "val_log.csv"
LOSS_PICTURE = "loss.png"
TRAIN_HEAD = ["step", "epoch", "samples", "loss"]
TRAIN_TAIL = ["seconds", "samples_per_s", "wall_s"]


def read_rows(path: Path) -> list[dict]:
    """The rows of a CSV log (a last line cut short by a kill is dropped)."""
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    return list(csv.DictReader(io.StringIO(text)))


def _rewrite(path: Path, header: list[str], rows: list[dict]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    with atomic_output(path, "w", "training log") as handle:
        handle.write(buffer.getvalue())


class StepLog:
    """``train_log.csv`` of ``out_dir``, kept up to ``step`` (the rows after it are dropped)."""

    def __init__(self, out_dir: Path, step: int):
        self.path = Path(out_dir) / TRAIN_LOG
        rows = [r for r in read_rows(self.path) if int(r["step"]) <= step]
        self.header: list[str] | None = None
        if rows:
            self.header = list(rows[0])
            _rewrite(self.path, self.header, rows)
        elif self.path.exists():
            self.path.unlink()
        self.handle = None

    def append(
        self, step: int, epoch: int, samples: list[str], loss: float, terms: dict, seconds: float, wall: float
    ) -> None:
        """A step's row: ``seconds`` the step's compute, ``wall`` since the step before ended (its loading,
        logging and checkpoint included)."""
        if self.header is None:
            self.header = TRAIN_HEAD + list(terms) + TRAIN_TAIL
            _rewrite(self.path, self.header, [])
        if self.handle is None:
            self.handle = open(self.path, "a", encoding="utf-8", newline="")
        row = {
            "step": step,
            "epoch": epoch,
            "samples": ";".join(samples),
            "loss": repr(float(loss)),
            "seconds": f"{seconds:.6f}",
            "samples_per_s": f"{len(samples) / max(seconds, 1e-12):.3f}",
            "wall_s": f"{wall:.6f}",
        }
        row.update({name: repr(float(value)) for name, value in terms.items()})
        csv.DictWriter(self.handle, fieldnames=self.header, lineterminator="\n").writerow(row)
        self.handle.flush()

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None


def validated_epochs(out_dir: Path) -> set[int]:
    return {int(r["epoch"]) for r in read_rows(Path(out_dir) / VAL_LOG)}


def append_validation(out_dir: Path, epoch: int, step: int, summary: dict) -> dict:
    """Add the epoch's validation summary (``evaluate_dataset``'s) to ``val_log.csv``; returns the row."""
    means = summary["mean_over_samples"]
    row = {
        "epoch": epoch,
        "step": step,
        "samples": summary["samples"],
        "chamfer": repr(means["chamfer"]),
        "chamfer_x1000": repr(means["chamfer_x1000"]),
    }
    row.update({f"f_{tau}": repr(value) for tau, value in means["fscore"].items()})
    path = Path(out_dir) / VAL_LOG
    rows = [r for r in read_rows(path) if int(r["epoch"]) != epoch] + [row]
    _rewrite(path, list(row), rows)
    return row


def plot_curves(out_dir: Path) -> Path | None:
    """``loss.png``: the loss and its terms by step and the validation Chamfer by epoch; None where
    matplotlib is not installed (or nothing is logged yet)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    steps = read_rows(Path(out_dir) / TRAIN_LOG)
    if not steps:
        return None
    val = read_rows(Path(out_dir) / VAL_LOG)
    x = [int(r["step"]) for r in steps]
    terms = [k for k in steps[0] if k not in TRAIN_HEAD + TRAIN_TAIL]
    figure = Figure(figsize=(15 if val else 10, 4.2), dpi=100)
    FigureCanvasAgg(figure)
    panels = figure.subplots(1, 3 if val else 2)
    panels[0].plot(x, [float(r["loss"]) for r in steps], lw=0.8)
    panels[0].set(title="loss", xlabel="step", yscale="log")
    for name in terms:
        values = [abs(float(r[name])) for r in steps]
        if any(values):
            panels[1].plot(x, values, lw=0.7, label=name)
    panels[1].set(title="loss terms (absolute)", xlabel="step", yscale="log")
    if terms:
        panels[1].legend(fontsize=5, ncol=2)
    if val:
        panels[2].plot([int(r["epoch"]) for r in val], [float(r["chamfer_x1000"]) for r in val], "o-")
        panels[2].set(title="validation Chamfer x1000", xlabel="epoch")
    figure.tight_layout()
    path = Path(out_dir) / LOSS_PICTURE
    with atomic_output(path, "wb", "loss curves") as handle:
        figure.savefig(handle, format="png")
    return path


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def remove_outputs(out_dir: Path) -> None:
    for name in (TRAIN_LOG, VAL_LOG, LOSS_PICTURE):
        path = Path(out_dir) / name
        if path.exists():
            os.unlink(path)
