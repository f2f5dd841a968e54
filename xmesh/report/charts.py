"""The report's charts, drawn by matplotlib (the ``report`` extra) on its Agg canvas, saved as PNG.

Figures are made with ``matplotlib.figure.Figure`` directly (no pyplot, no global state), so
drawing a report changes nothing for the caller's own plots.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from xmesh.io.atomic import atomic_write

DPI = 110
BAR_COLOR = "#4a78b5"
MEAN_COLOR = "#9aa7b8"
STAGE_LABELS = {
    "decode": "decode images",
    "ground_truth": "read ground truth",
    "upload": "upload",
    "network": "network",
    "metrics": "metrics",
    "write": "write results",
    "input_wait": "waiting for input",
    "gpu_idle": "GPU idle",
}


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure, path: str | os.PathLike) -> Path:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    with atomic_write(path, "wb") as handle:
        handle.write(buffer.getvalue())
    return Path(path)


def category_bars(table: dict, tau: str, two_tau: str, path) -> Path:
    """Three bar charts side by side: per-category Chamfer (x1000), F(tau) and F(2 tau), each with
    the mean over categories as a last, grey bar. ``table``: a summary dict (``categories`` and
    ``mean_over_categories``); ``tau`` / ``two_tau``: the F-score keys."""
    names = [m["name"] for m in table["categories"].values()] + ["mean"]
    rows = list(table["categories"].values()) + [table["mean_over_categories"]]
    panels = [
        ("Chamfer distance x1000 (lower is better)", [m["chamfer_x1000"] for m in rows]),
        (f"F-score, tau = {float(tau):g} (%)", [m["fscore"][tau] for m in rows]),
        (f"F-score, 2 tau = {float(two_tau):g} (%)", [m["fscore"][two_tau] for m in rows]),
    ]
    width = max(9.0, 3 * (1.2 + 0.45 * len(names)))
    figure = _figure(width, 3.4)
    axes = figure.subplots(1, 3)
    colors = [BAR_COLOR] * (len(names) - 1) + [MEAN_COLOR]
    for ax, (title, values) in zip(axes, panels):
        bars = ax.bar(range(len(names)), values, color=colors)
        ax.bar_label(bars, fmt="%.3g", fontsize=7, padding=1)
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(len(names)), names, rotation=40, ha="right", fontsize=8)
        ax.tick_params(axis="y", labelsize=8)
        top = max(values) if values and np.all(np.isfinite(values)) else 0.0
        ax.set_ylim(0.0, top * 1.18 if top > 0 else 1.0)
        ax.grid(axis="y", alpha=0.3)
    return _save(figure, path)


def chamfer_histogram(rows: list[dict], names: dict, path) -> Path:
    """The distribution of per-sample Chamfer distances: one step histogram per category on shared
    bins (logarithmic where the values span more than a factor of 20)."""
    values = np.array([r["chamfer"] for r in rows], dtype=np.float64)
    finite = values[np.isfinite(values) & (values > 0)]
    figure = _figure(7.5, 3.4)
    ax = figure.subplots()
    if finite.size:
        lo, hi = finite.min(), finite.max()
        log = hi / lo > 20.0
        if hi == lo:
            lo, hi = lo * 0.9, hi * 1.1
        bins = np.geomspace(lo, hi, 31) if log else np.linspace(lo, hi, 31)
        by_category: dict[str, list[float]] = {}
        for row in rows:
            if np.isfinite(row["chamfer"]) and row["chamfer"] > 0:
                by_category.setdefault(row["category"], []).append(row["chamfer"])
        for category in sorted(by_category):
            ax.hist(
                by_category[category],
                bins=bins,
                histtype="step",
                linewidth=1.5,
                label=f"{names.get(category, category)} ({len(by_category[category])})",
            )
        if log:
            ax.set_xscale("log")
        ax.legend(fontsize=7, ncols=2 if len(by_category) > 6 else 1)
    ax.set_title(f"Per-sample Chamfer distance ({len(values)} samples)", fontsize=9)
    ax.set_xlabel("Chamfer distance (sum of mean squared nearest distances)", fontsize=8)
    ax.set_ylabel("samples", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    return _save(figure, path)


def timing_bars(timing: dict, path) -> Path:
    """Horizontal bars of the seconds each stage of the run took, the wall time as a dashed line."""
    stages = [(k, float(v)) for k, v in timing.items() if k in STAGE_LABELS]
    stages.sort(key=lambda kv: kv[1])
    figure = _figure(7.5, 0.6 + 0.32 * max(len(stages), 1))
    ax = figure.subplots()
    bars = ax.barh([STAGE_LABELS[k] for k, _ in stages], [v for _, v in stages], color=BAR_COLOR)
    ax.bar_label(bars, fmt="%.3g s", fontsize=7, padding=2)
    wall = float(timing.get("wall", 0.0))
    title = "Where the run's time went"
    if wall > 0:
        ax.axvline(wall, color="#c0392b", linestyle="--", linewidth=1)
        title += f" (dashed: the wall time, {wall:.3g} s)"
    ax.set_xlabel("seconds", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.margins(x=0.18)
    ax.grid(axis="x", alpha=0.3)
    return _save(figure, path)
