"""The original evaluation scripts' log files, ``f_score.log`` and ``cd.log``.

Pixel2Mesh++'s ``f_score.py`` and ``cd_distance.py`` print one line per category, for its 13 ShapeNet
categories in a fixed order, under their own names: the synset, the name, the sample count, then
the mean F-scores at 5e-5, 1e-4, 1.5e-4 and 2e-4 (``f_score.log``: the count as a float, the scores
joined by spaces) or the mean Chamfer distance times 10,000 (``cd.log``: the count as an integer).
Both divide a category's sum by ``count + 1e-6``, and list empty categories with zeros. These
functions write the same lines from xmesh's rows, so tables and scripts made for the original keep
working; categories outside the 13 follow them, named by their synset.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..io.atomic import atomic_write
from ..metrics.scores import THRESHOLDS

F_SCORE_LOG = "f_score.log"
CD_LOG = "cd.log"

#: The original scripts' category names, in their order.
ORIGINAL_NAMES = {
    "02828884": "bench",
    "03001627": "chair",
    "03636649": "lamp",
    "03691459": "speaker",
    "04090263": "firearm",
    "04379243": "table",
    "04530566": "watercraft",
    "02691156": "plane",
    "02933112": "cabinet",
    "02958343": "car",
    "03211117": "monitor",
    "04256520": "couch",
    "04401088": "cellphone",
}


def _totals(rows: list[dict]) -> dict[str, list]:
    """{synset: [count, sum of Chamfer, sum of F-score vectors]} in the original's category order; the
    sums run row after row in float64, as the original's do."""
    totals = {cat: [0, 0.0, [0.0] * len(THRESHOLDS)] for cat in ORIGINAL_NAMES}
    for row in rows:
        entry = totals.get(row["category"]) or totals.setdefault(
            str(row["category"]), [0, 0.0, [0.0] * len(THRESHOLDS)]
        )
        entry[0] += 1
        entry[1] += float(row["chamfer"])
        sums, scores = entry[2], row["fscore"]
        for k, tau in enumerate(THRESHOLDS):
            sums[k] += float(scores[tau])
    for entry in totals.values():
        entry[2] = np.array(entry[2], dtype=np.float64)
    return totals


def f_score_lines(rows: list[dict]) -> str:
    out = []
    for cat, (count, _, fsum) in _totals(rows).items():
        score = fsum / (float(count) + 1e-6)
        shown = float(count) if count else 0  # the original counts with += 1.0 from an integer 0
        out.append(f"{cat} {ORIGINAL_NAMES.get(cat, cat)} {shown} {' '.join(str(v) for v in score)}\n")
    return "".join(out)


def cd_lines(rows: list[dict]) -> str:
    out = []
    for cat, (count, csum, _) in _totals(rows).items():
        score = (np.float64(csum) / (float(count) + 1e-6)) * 10000
        out.append(f"{cat} {ORIGINAL_NAMES.get(cat, cat)} {int(count)} {score}\n")
    return "".join(out)


def write_logs(out_dir: Path, rows: list[dict]) -> None:
    """Write ``f_score.log`` and ``cd.log`` (atomically) for the rows of a samples.csv."""
    with atomic_write(Path(out_dir) / F_SCORE_LOG, "w") as handle:
        handle.write(f_score_lines(rows))
    with atomic_write(Path(out_dir) / CD_LOG, "w") as handle:
        handle.write(cd_lines(rows))
