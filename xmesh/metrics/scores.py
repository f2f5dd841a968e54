"""The Pixel2Mesh++ evaluation formulas on nearest-neighbour distances, and per-category summaries.

``d1`` holds, for every predicted vertex, the squared distance to the nearest ground-truth point;
``d2`` the same from every ground-truth point to the prediction. As in the original evaluation
(``f_score.py``, ``cd_distance.py``):

- Chamfer = mean(d1) + mean(d2);
- at each threshold tau (on the *squared* distance): precision P = 100 * fraction(d1 <= tau),
  recall R = 100 * fraction(d2 <= tau), F = 2PR / (P + R + 1e-6), in percent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ..errors import InputError

#: F-score thresholds on squared distance: tau = 1e-4 and 2 tau = 2e-4 are the paper's columns.
THRESHOLDS = (5e-5, 1e-4, 1.5e-4, 2e-4)

#: The 13 ShapeNet categories of the Pixel2Mesh++ test split: synset id -> name.
CATEGORIES = {
    "02691156": "airplane",
    "02828884": "bench",
    "02933112": "cabinet",
    "02958343": "car",
    "03001627": "chair",
    "03211117": "display",
    "03636649": "lamp",
    "03691459": "loudspeaker",
    "04090263": "rifle",
    "04256520": "sofa",
    "04379243": "table",
    "04401088": "telephone",
    "04530566": "watercraft",
}

_F_EPS = 1e-6  # the original's guard in the F-score denominator (P, R in percent)


def check_thresholds(thresholds: Sequence[float]) -> tuple[float, ...]:
    """``thresholds`` as a tuple of floats; InputError unless non-empty, finite and positive."""
    try:
        values = tuple(float(t) for t in np.atleast_1d(np.asarray(thresholds, dtype=np.float64)))
    except (TypeError, ValueError) as exc:
        raise InputError(f"thresholds must be a sequence of numbers; got {thresholds!r}") from exc
    if not values or not all(np.isfinite(values)) or min(values) <= 0:
        raise InputError(
            f"thresholds must be a non-empty sequence of finite positive squared distances; got {thresholds!r}"
        )
    return values


def chamfer_from_distances(d1: np.ndarray, d2: np.ndarray) -> float:
    """Chamfer distance mean(d1) + mean(d2) of the squared nearest-neighbour distances."""
    return float(np.mean(d1, dtype=np.float64) + np.mean(d2, dtype=np.float64))


def fscore_from_distances(d1: np.ndarray, d2: np.ndarray, thresholds: Sequence[float] = THRESHOLDS) -> np.ndarray:
    """F-score in percent at each threshold, float64 array of len(thresholds)."""
    taus = np.asarray(check_thresholds(thresholds))[:, None]
    d1, d2 = np.asarray(d1), np.asarray(d2)
    precision = 100.0 * np.count_nonzero(d1[None, :] <= taus, axis=1) / d1.shape[0]
    recall = 100.0 * np.count_nonzero(d2[None, :] <= taus, axis=1) / d2.shape[0]
    return 2.0 * precision * recall / (precision + recall + _F_EPS)


def _means(rows: list[Mapping], taus: tuple[float, ...]) -> dict:
    """Count and plain means of ``chamfer`` and of ``fscore[tau]`` over ``rows``."""
    chamfer = float(np.mean([row["chamfer"] for row in rows]))
    return {
        "count": len(rows),
        "chamfer": chamfer,
        "chamfer_x1000": 1000.0 * chamfer,
        "fscore": {tau: float(np.mean([row["fscore"][tau] for row in rows])) for tau in taus},
    }


def _mean_over_13(categories: Mapping[str, Mapping], taus: tuple[float, ...]) -> dict:
    """The plain mean over the 13 :data:`CATEGORIES` of each one's means, an absent category's as 0."""
    zero = {"count": 0, "chamfer": 0.0, "fscore": dict.fromkeys(taus, 0.0)}
    rows = [categories.get(cat, zero) for cat in CATEGORIES]
    means = _means(rows, taus)
    means["count"], means["categories"] = sum(row["count"] for row in rows), len(CATEGORIES)
    return means


def _mean_over_categories(categories: Mapping[str, Mapping], taus: tuple[float, ...]) -> dict:
    """The plain mean of the present categories' means; its count the samples in them, as everywhere."""
    means = _means(list(categories.values()), taus)
    means["count"], means["categories"] = sum(row["count"] for row in categories.values()), len(categories)
    return means


def summarize(rows: Iterable[Mapping]) -> dict:
    """Per-category means of per-sample results, as in the paper's tables.

    Each row is a mapping with ``category`` (a ShapeNet synset id such as ``"02691156"``; ids outside
    :data:`CATEGORIES` are kept and named by their id), ``chamfer`` and ``fscore`` ({tau: F}, the same
    thresholds in every row), e.g. ``{"category": cat, **evaluate(pred, gt)}``.

    Returns ``{"categories": {synset: {"name", "count", "chamfer", "chamfer_x1000", "fscore"}},
    "mean_over_categories": {...}, "mean_over_13_categories": {...}, "mean_over_samples": {...}}``
    with categories in synset order (the order of the paper's tables). ``mean_over_categories``
    averages the categories present; ``mean_over_13_categories`` the 13 of :data:`CATEGORIES`, absent
    ones counted as 0: the original's convention (the last line its ``f_score.py`` prints), kept to
    compare with its logs, never a quality figure (an absent category's 0 Chamfer makes it look better
    than any category). Every ``count`` is a number of samples; the means also say how many
    ``categories`` they cover. Means are exact (the original divides by count + 1e-6).
    """
    rows = list(rows)
    if not rows:
        raise InputError("rows is empty; expected at least one per-sample result to summarize")
    for k, row in enumerate(rows):
        missing = {"category", "chamfer", "fscore"} - set(row)
        if missing:
            raise InputError(f"rows[{k}] lacks {sorted(missing)}; expected keys category, chamfer and fscore")
    taus = tuple(rows[0]["fscore"])
    for k, row in enumerate(rows):
        if tuple(row["fscore"]) != taus:
            raise InputError(
                f"rows[{k}] has F-scores at thresholds {tuple(row['fscore'])}; expected those of rows[0], {taus}"
            )
    by_category: dict[str, list[Mapping]] = {}
    for row in rows:
        by_category.setdefault(str(row["category"]), []).append(row)
    categories = {
        cat: {"name": CATEGORIES.get(cat, cat), **_means(by_category[cat], taus)} for cat in sorted(by_category)
    }
    return {
        "categories": categories,
        "mean_over_categories": _mean_over_categories(categories, taus),
        "mean_over_13_categories": _mean_over_13(categories, taus),
        "mean_over_samples": {**_means(rows, taus), "categories": len(categories)},
    }
