"""The evaluation report: ``OUT/report.html`` with its pictures in ``OUT/report/``.

:func:`write_report` reads ``OUT/samples.csv`` (every sample, so a resumed run's report covers
them all) and ``OUT/summary.json`` (the weights and the run's throughput and timing), draws the
charts with matplotlib (the ``report`` extra: ``pip install "xmesh-p2mpp[report]"``) and the gallery
with xmesh's own renderer, and writes a page that needs nothing from the network to be viewed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from xmesh.dataset import DEFAULT_VIEWS
from xmesh.errors import FileFormatError, InputError, MissingExtraError, MissingFileError

REPORT_HTML = "report.html"
REPORT_FOLDER = "report"
EXTRA_HINT = 'pip install "xmesh-p2mpp[report]"'


def require_matplotlib() -> None:
    """MissingExtraError naming the ``report`` extra where matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    except ImportError as exc:
        raise MissingExtraError(
            f"--report draws its charts with matplotlib, which is not installed ({exc}); "
            f"install the report extra: {EXTRA_HINT}"
        ) from None


def _read_summary(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FileFormatError(
            f"{path}: not the JSON xmesh eval writes ({exc}); run xmesh eval again to rewrite it"
        ) from None
    if not isinstance(summary, dict):
        raise FileFormatError(f"{path}: holds a {type(summary).__name__}; expected the JSON object xmesh eval writes")
    return summary


def is_synthetic(meta: dict) -> bool:
    """Whether the run's weights were the synthetic recipe (as ``meta`` records them)."""
    if "synthetic_weights" in meta:
        return bool(meta["synthetic_weights"])
    return "synthetic" in str(meta.get("weights", "")).lower()


def write_report(
    out_dir: str | os.PathLike,
    images_root=None,
    gt_root=None,
    reconstructor=None,
    views: Sequence[int] = DEFAULT_VIEWS,
    progress: bool = True,
) -> Path:
    """Write ``out_dir/report.html`` and its pictures in ``out_dir/report/`` from the evaluation in
    ``out_dir``; returns the page's path. ``images_root`` / ``gt_root`` (the dataset, as given to
    ``xmesh eval``) give the gallery its input views and ground truth; predictions are read from
    ``out_dir/predict/`` or, where absent, made again by ``reconstructor`` (with a progress bar on a
    terminal unless ``progress`` is False)."""
    require_matplotlib()
    from xmesh.report import charts, gallery, page
    from xmesh.results import CSV_NAME, SUMMARY_JSON, TAU, TWO_TAU, read_csv, summary_from_rows

    out_dir = Path(out_dir)
    csv_path = out_dir / CSV_NAME
    if not csv_path.is_file():
        raise MissingFileError(f"{csv_path} does not exist; expected the output folder of xmesh eval")
    rows = read_csv(csv_path)
    if not rows:
        raise InputError(f"{csv_path}: no evaluated samples; nothing to report")
    summary = _read_summary(out_dir / SUMMARY_JSON)
    table = summary_from_rows(rows)
    tau, two_tau = repr(TAU), repr(TWO_TAU)
    names = {cat: m["name"] for cat, m in table["categories"].items()}
    folder = out_dir / REPORT_FOLDER
    folder.mkdir(parents=True, exist_ok=True)

    bars = charts.category_bars(table, tau, two_tau, folder / "categories.png")
    spread = charts.chamfer_histogram(rows, names, folder / "chamfer_distribution.png")
    run = summary.get("run", {}) if isinstance(summary.get("run"), dict) else {}
    timing_chart = None
    if isinstance(run.get("timing"), dict) and "wall" in run["timing"]:
        timing_chart = charts.timing_bars(run["timing"], folder / "timing.png")
    picks = gallery.draw_gallery(
        gallery.pick_samples(rows), out_dir, folder, images_root, gt_root, reconstructor, views, progress
    )
    keep = {bars.name, spread.name, *(p.picture.name for c in picks.values() for p in c if p.picture)}
    if timing_chart is not None:
        keep.add(timing_chart.name)
    for stale in folder.glob("*.png"):  # pictures of an earlier report that this one does not show
        if stale.name not in keep:
            stale.unlink()

    meta = summary.get("meta", {}) if isinstance(summary.get("meta"), dict) else {}
    synthetic = is_synthetic(meta)
    banner = (
        (
            "<div class='warning' id='synthetic-warning'><b>Synthetic weights.</b> This run used xmesh's "
            "synthetic test recipe (random numbers, not the trained Pixel2Mesh++ weights): the figures show the "
            "pipeline working, not reconstruction quality.</div>"
        )
        if synthetic
        else ""
    )
    weights = meta.get("weights", "not recorded (summary.json has no meta)")
    run_facts = [
        ("weights", weights),
        ("synthetic weights", "yes" if synthetic else "no"),
        ("backend", f"{meta.get('backend', 'n/a')} ({meta.get('precision', 'n/a')})"),
        ("template", meta.get("template", "n/a")),
        ("input views", meta.get("views", list(views))),
        ("samples in samples.csv", len(rows)),
        ("categories", len(table["categories"])),
    ]
    if run:
        run_facts.append(
            (
                "last run",
                f"{run.get('evaluated', 0)} evaluated, {run.get('skipped', 0)} already in samples.csv (resumed)"
                if run.get("skipped")
                else f"{run.get('evaluated', 0)} evaluated",
            )
        )
    tau_text = f"{float(tau):g}"
    sections = [
        ("run", "Run", page.facts(run_facts)),
        (
            "metrics",
            "Metrics per category",
            page.metrics_table(table, tau, two_tau)
            + page.image_tag(
                f"{REPORT_FOLDER}/{bars.name}", f"per-category Chamfer and F-scores (tau = {tau_text})", "chart"
            )
            + page.image_tag(f"{REPORT_FOLDER}/{spread.name}", "distribution of per-sample Chamfer distance", "chart"),
        ),
        (
            "timing",
            "Throughput and time breakdown",
            page.timing_section(run, f"{REPORT_FOLDER}/{timing_chart.name}" if timing_chart else None),
        ),
        (
            "gallery",
            "Gallery: best, median and worst samples of each category",
            page.gallery_section(picks, names, tau, REPORT_FOLDER),
        ),
    ]
    title = f"xmesh evaluation report: {len(rows)} samples"
    return page.write_page(out_dir / REPORT_HTML, page.page(title, sections, banner))


__all__ = ["write_report", "require_matplotlib", "is_synthetic", "REPORT_HTML", "REPORT_FOLDER"]
