"""summary.json and summary.txt: per-category means of a samples.csv, and the table people read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..io.atomic import atomic_write
from ..metrics.scores import summarize

SUMMARY_JSON = "summary.json"
SUMMARY_TXT = "summary.txt"
TAU, TWO_TAU = 1e-4, 2e-4  # the paper's F-score columns


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
    """The per-category table of a summary dict (as returned by :func:`xmesh.evaluate.evaluate_dataset`).
    The ``samples`` column counts samples in every row. The original's 13-category mean (absent
    categories as 0) is not a row of the table: it follows as the original scripts' line, for comparing
    with their logs."""
    tau, two = repr(TAU), repr(TWO_TAU)
    head = f"{'category':<10} {'name':<12} {'samples':>7} {'CD':>12} {'CD x1000':>10} {'F(tau)':>8} {'F(2tau)':>8}"
    lines = [head, "-" * len(head)]

    def line(cat: str, name: str, m: dict) -> str:
        return (
            f"{cat:<10} {name:<12} {m['count']:>7d} {m['chamfer']:>12.6g} {m['chamfer_x1000']:>10.4f} "
            f"{m['fscore'][tau]:>8.2f} {m['fscore'][two]:>8.2f}"
        )

    for cat, m in summary["categories"].items():
        lines.append(line(cat, m["name"], m))
    lines.append("-" * len(head))
    lines.append(line("mean", "(present)", summary["mean_over_categories"]))
    lines.append(line("mean", "(samples)", summary["mean_over_samples"]))
    present = len(summary["categories"])
    lines.append(
        f"means: (present) of the {present} categor{'y' if present == 1 else 'ies'} evaluated, each "
        "weighing the same; (samples) of every sample"
    )
    lines.append(
        f"tau = {TAU:g}, 2 tau = {TWO_TAU:g} (squared distances); F in percent; "
        f"mean reconstruction time {summary['mean_ms_per_sample']:.1f} ms/sample"
    )
    m = summary["mean_over_13_categories"]
    lines.append(
        f"the original scripts' mean over their 13 categories, absent ones as 0 (their convention, to compare "
        f"with their logs; not a quality figure): CD x1000 {m['chamfer_x1000']:.4f}, F(tau) "
        f"{m['fscore'][tau]:.2f}, F(2tau) {m['fscore'][two]:.2f}"
    )
    return "\n".join(lines) + "\n"


def write_summary(out_dir: Path, summary: dict) -> None:
    """summary.json and summary.txt in ``out_dir``, each written atomically."""
    with atomic_write(Path(out_dir) / SUMMARY_JSON, "w") as handle:
        json.dump(summary, handle, indent=2)
        handle.write("\n")
    with atomic_write(Path(out_dir) / SUMMARY_TXT, "w") as handle:
        handle.write(format_table(summary))
