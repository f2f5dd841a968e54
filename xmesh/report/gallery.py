"""The report's gallery: the best, median and worst sample of each category by Chamfer distance,
each shown as its input view, the prediction, the ground truth and both from the input camera.

Predictions come from ``OUT/predict/{id}_predict.obj`` where ``xmesh eval --save-meshes`` wrote
them; the others are reconstructed again (the gallery's samples only) when a reconstructor is given.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from xmesh.dataset import DEFAULT_VIEWS, SampleId, load_ground_truth, sample_paths
from xmesh.errors import XmeshError
from xmesh.io.cameras import load_cameras
from xmesh.mesh import read_mesh
from xmesh.pictures.panels import framed_border, hstack
from xmesh.pictures.views import image_panel, mesh_panel, points_panel
from xmesh.render.draw import save_png

PANEL = 176
ROLES = ("best", "median", "worst")
OVERLAY_POINTS = 700  # ground-truth points drawn over the prediction
RECONSTRUCT_CHUNK = 8  # gallery samples reconstructed per batch


@dataclass
class Pick:
    """One gallery sample: its CSV row, the roles it fills ("best", ...), and once drawn its picture
    (a path inside the report folder) or why there is none."""

    row: dict
    roles: list[str]
    picture: Path | None = None
    source: str = ""
    problems: list[str] = field(default_factory=list)


def pick_samples(rows: list[dict]) -> dict[str, list[Pick]]:
    """{category: the best, median and worst rows by Chamfer distance} (a sample filling several
    roles, as with fewer than 3 samples, appears once); categories in synset order."""
    by_category: dict[str, list[dict]] = {}
    for row in rows:
        by_category.setdefault(row["category"], []).append(row)
    picks: dict[str, list[Pick]] = {}
    for category in sorted(by_category):
        ranked = sorted(by_category[category], key=lambda r: (not np.isfinite(r["chamfer"]), r["chamfer"], r["id"]))
        chosen = {"best": ranked[0], "median": ranked[(len(ranked) - 1) // 2], "worst": ranked[-1]}
        found: dict[str, Pick] = {}
        for role in ROLES:
            row = chosen[role]
            if row["id"] in found:
                found[row["id"]].roles.append(role)
            else:
                found[row["id"]] = Pick(row=row, roles=[role])
        picks[category] = list(found.values())
    return picks


def _stem(sample_id: str) -> str:
    return sample_id[: -len(".dat")] if sample_id.endswith(".dat") else sample_id


def _saved_prediction(out_dir: Path, sample_id: str):
    path = out_dir / "predict" / f"{_stem(sample_id)}_predict.obj"
    if path.is_file() and path.stat().st_size > 0:
        return read_mesh(path)
    return None


def _reconstruct(reconstructor, picks: list[Pick], images_root, views, progress: bool) -> dict[str, object]:
    """The picks' meshes, reconstructed in batches on the GPU and one at a time on the CPU (where a
    batch is no faster), under a progress bar on a terminal."""
    from tqdm import tqdm

    on_gpu = getattr(getattr(reconstructor, "backend", None), "name", "numpy") == "cupy"
    size = RECONSTRUCT_CHUNK if on_gpu else 1
    meshes: dict[str, object] = {}
    with tqdm(
        total=len(picks),
        desc="report: reconstructing the gallery",
        unit="sample",
        file=sys.stderr,
        disable=None if progress else True,
        dynamic_ncols=True,
    ) as bar:
        for start in range(0, len(picks), size):
            chunk = picks[start : start + size]
            paths = [sample_paths(p.row["id"], images_root, ".", views) for p in chunk]
            results = reconstructor.reconstruct_batch(
                [list(p.images) for p in paths], [p.cameras for p in paths], views=list(views)
            )
            for pick, mesh in zip(chunk, results):
                meshes[pick.row["id"]] = mesh
            bar.update(len(chunk))
    return meshes


def draw_gallery(
    picks: dict[str, list[Pick]],
    out_dir,
    report_dir,
    images_root=None,
    gt_root=None,
    reconstructor=None,
    views: Sequence[int] = DEFAULT_VIEWS,
    progress: bool = True,
) -> dict[str, list[Pick]]:
    """Draw one picture per pick into ``report_dir`` (``gallery_{id}.png``): input view 1, the
    prediction and the ground truth framed from camera 1's direction, and both from camera 1 itself.
    Missing pieces (no images root, no prediction, an unreadable file) leave a note in ``problems``
    and a picture of what there is; predictions made again show a progress bar on a terminal unless
    ``progress`` is False. Returns ``picks`` with ``picture`` and ``source`` filled in."""
    out_dir, report_dir = Path(out_dir), Path(report_dir)
    every = [p for category in picks.values() for p in category]
    meshes: dict[str, object] = {}
    for pick in every:
        mesh = _saved_prediction(out_dir, pick.row["id"])
        if mesh is not None:
            meshes[pick.row["id"]], pick.source = mesh, "saved by --save-meshes"
    missing = [p for p in every if p.row["id"] not in meshes]
    if missing and reconstructor is not None and images_root is not None:
        try:
            meshes.update(_reconstruct(reconstructor, missing, images_root, views, progress))
            for pick in missing:
                pick.source = "reconstructed again for this report"
        except XmeshError as exc:
            for pick in missing:
                pick.problems.append(f"could not reconstruct it again: {exc}")
    for pick in every:
        if pick.row["id"] not in meshes and not pick.problems:
            pick.problems.append(
                "no prediction: run xmesh eval with --save-meshes, or give the report the reconstructor and the images"
            )
        pick.picture = _draw(pick, meshes.get(pick.row["id"]), report_dir, images_root, gt_root, views)
    return picks


def _blank(text: str) -> np.ndarray:
    from xmesh.pictures.panels import put_label

    return put_label(np.full((PANEL, PANEL, 3), 245, dtype=np.uint8), text, where="top")


def _draw(pick: Pick, mesh, report_dir: Path, images_root, gt_root, views) -> Path | None:
    sample = SampleId.parse(pick.row["id"])
    panels = []
    cameras = gt = None
    paths = sample_paths(sample, images_root if images_root is not None else ".", gt_root or ".", views)
    try:
        panels.append(
            image_panel(paths.images[0], PANEL, title="input view 1")
            if images_root is not None
            else _blank("input: no images root")
        )
        if images_root is not None:
            cameras = load_cameras(paths.cameras, views=list(views))
    except XmeshError as exc:
        pick.problems.append(str(exc))
        panels = [_blank("input unreadable")]
    if gt_root is not None:
        try:
            gt = load_ground_truth(paths.gt)
        except XmeshError as exc:
            pick.problems.append(str(exc))
    known = cameras is not None
    if not known:  # without the sample's cameras, look from a ShapeNet-like direction
        cameras = np.array([[45.0, 25.0, 0.0, 0.8, 25.0]] * 3, dtype=np.float32)
    row0 = cameras[0]
    panels.append(
        mesh_panel(mesh.vertices, mesh.faces, row0, PANEL, camera0_row=row0, title="prediction")[0]
        if mesh is not None
        else _blank("prediction: none")
    )
    panels.append(
        points_panel(gt, row0, PANEL, camera0_row=row0, title="ground truth")[0]
        if gt is not None
        else _blank("ground truth: none")
    )
    if mesh is not None and known:  # what camera 1 saw: only with the sample's own cameras
        overlay = gt[:: max(1, len(gt) // OVERLAY_POINTS)] if gt is not None else None
        panels.append(
            mesh_panel(
                mesh.vertices,
                mesh.faces,
                row0,
                PANEL,
                camera0_row=row0,
                points=overlay,
                camera_view=True,
                title="both",
                point_radius=0.8,
            )[0]
        )
    picture = hstack([framed_border(p) for p in panels])
    return save_png(report_dir / f"gallery_{_stem(sample.name)}.png", picture)
