"""report.html: one self-contained page (inline CSS, no script, pictures beside it in report/)."""

from __future__ import annotations

import html
from pathlib import Path

from xmesh.report.charts import STAGE_LABELS

STYLE = """
body { font-family: sans-serif; margin: 24px auto; max-width: 1180px; color: #222; background: #fff; }
h1 { font-size: 24px; margin-bottom: 4px; } h2 { font-size: 19px; margin-top: 30px; border-bottom: 1px solid #ddd; }
h3 { font-size: 15px; margin: 18px 0 6px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; } th { background: #f0f2f5; }
td.text, th.text { text-align: left; }
.warning { background: #fff3cd; border: 1px solid #e0b100; padding: 8px 12px; margin: 10px 0; }
.note { color: #666; font-size: 13px; }
img { max-width: 100%; display: block; margin: 6px 0; }
.gallery figure { margin: 8px 0 16px; } .gallery figcaption { font-size: 13px; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 14px; font-size: 14px; }
dt { font-weight: bold; } dd { margin: 0; }
"""


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _num(value, fmt: str = ".4g") -> str:
    return "n/a" if value is None else format(float(value), fmt)


def image_tag(src: str, alt: str, cls: str) -> str:
    return f'<img class="{cls}" src="{_e(src)}" alt="{_e(alt)}">'


def facts(items) -> str:
    return "<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in items) + "</dl>"


def metrics_table(table: dict, tau: str, two_tau: str) -> str:
    head = (
        "<tr><th class='text'>category</th><th class='text'>name</th><th>samples</th><th>Chamfer</th>"
        f"<th>Chamfer x1000</th><th>F(&tau;={float(tau):g}) %</th><th>F(2&tau;={float(two_tau):g}) %</th></tr>"
    )

    def line(cat, name, m):
        return (
            f"<tr><td class='text'>{_e(cat)}</td><td class='text'>{_e(name)}</td><td>{m['count']}</td>"
            f"<td>{_num(m['chamfer'], '.6g')}</td><td>{_num(m['chamfer_x1000'], '.4f')}</td>"
            f"<td>{_num(m['fscore'][tau], '.2f')}</td><td>{_num(m['fscore'][two_tau], '.2f')}</td></tr>"
        )

    body = [line(cat, m["name"], m) for cat, m in table["categories"].items()]
    body.append(line("mean", "over categories", table["mean_over_categories"]))
    body.append(line("mean", "over samples", table["mean_over_samples"]))
    return f"<table>{head}{''.join(body)}</table>"


def timing_section(run: dict, chart: str | None) -> str:
    timing = run.get("timing")
    if not isinstance(timing, dict) or "wall" not in timing:
        return (
            "<p class='note' id='timing-absent'>Time breakdown absent: this summary.json has no per-stage "
            "<code>timing</code> (it was written by an xmesh without it, or its last run evaluated nothing new). "
            "Run <code>xmesh eval</code> on new samples for the throughput and the breakdown.</p>"
        )
    rate = run.get("samples_per_s")
    parts = [
        facts(
            [
                ("samples evaluated in this run", run.get("evaluated", "n/a")),
                ("throughput", f"{_num(rate, '.3f')} samples/s" if rate is not None else "n/a"),
                ("batch size", run.get("batch_size", "n/a")),
                ("loader / writer processes", f"{run.get('workers', 'n/a')} / {run.get('writers', 'n/a')}"),
                ("wall time", f"{_num(timing['wall'], '.3f')} s"),
            ]
        )
    ]
    if chart:
        parts.append(image_tag(chart, "seconds per stage of the run", "chart"))
    rows = "".join(
        f"<tr><td class='text'>{_e(STAGE_LABELS[k])}</td><td>{_num(v, '.3f')}</td></tr>"
        for k, v in sorted(timing.items(), key=lambda kv: -float(kv[1]))
        if k in STAGE_LABELS
    )
    parts.append(f"<table><tr><th class='text'>stage</th><th>seconds</th></tr>{rows}</table>")
    parts.append(
        "<p class='note'>Stages overlap (the loader and writers run beside the network), so they need "
        "not add up to the wall time. These figures cover the run that wrote summary.json; the metrics "
        "above cover every sample in samples.csv.</p>"
    )
    return "".join(parts)


def gallery_section(picks: dict, names: dict, tau: str, folder: str) -> str:
    if not picks:
        return "<p class='note'>No samples.</p>"
    parts = [
        "<p class='note'>Each row: input view 1; the prediction and the ground truth, each framed to fit "
        "from camera 1's direction (xN: N times the size camera 1 sees); both as camera 1 sees them "
        "(prediction grey, ground truth red).</p>"
    ]
    for category, category_picks in picks.items():
        parts.append(f"<h3>{_e(names.get(category, category))} ({_e(category)})</h3>")
        for pick in category_picks:
            row = pick.row
            label = (
                f"{' = '.join(pick.roles)}: {row['id']}, Chamfer {_num(row['chamfer'], '.4g')}, "
                f"F(tau) {_num(row['fscore'].get(float(tau)), '.2f')} %"
            )
            note = f" ({pick.source})" if pick.source else ""
            problems = "".join(f"<br><span class='note'>{_e(p)}</span>" for p in pick.problems)
            image = image_tag(f"{folder}/{pick.picture.name}", label, "gallery-image") if pick.picture else ""
            parts.append(f"<figure>{image}<figcaption>{_e(label)}{_e(note)}{problems}</figcaption></figure>")
    return "<div class='gallery'>" + "".join(parts) + "</div>"


def page(title: str, sections: list[tuple[str, str, str]], banner: str = "") -> str:
    """The page: ``sections`` are (id, heading, inner HTML)."""
    body = [f"<h1>{_e(title)}</h1>", banner]
    for ident, heading, inner in sections:
        body.append(f"<section id='{_e(ident)}'><h2>{_e(heading)}</h2>{inner}</section>")
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n"
    )


def write_page(path: Path, text: str) -> Path:
    from xmesh.io.atomic import atomic_write

    with atomic_write(path, "w") as handle:
        handle.write(text)
    return Path(path)
