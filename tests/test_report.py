"""The evaluation report: report.html and its pictures, from a resumed run, old summaries, the CLI, a browser."""

from __future__ import annotations

import io
import json
import re
import shutil
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

import browser
from conftest import eval_argv
from drawings import assert_same_drawing, edge_band
from pipeline_toy import ToyReconstructor
from xmesh import cli
from xmesh.dataset import load_ground_truth, sample_paths
from xmesh.errors import MissingExtraError
from xmesh.evaluate import evaluate_dataset, read_csv
from xmesh.io.cameras import load_cameras
from xmesh.io.weights import synthetic_weights
from xmesh.mesh import Mesh, read_obj
from xmesh.pictures.views import mesh_panel
from xmesh.reconstruct import Reconstructor
from xmesh.render.draw import to_world
from xmesh.report import write_report
from xmesh.report.gallery import PANEL, pick_samples
from xmesh.synthetic.dataset import write_dataset

pytest.importorskip("matplotlib")

CATS = ("02691156", "03001627", "04379243")
TIMING = {
    "wall": 12.5,
    "decode": 1.75,
    "ground_truth": 0.5,
    "upload": 0.25,
    "network": 7.25,
    "metrics": 1.5,
    "write": 0.625,
    "input_wait": 0.375,
    "gpu_idle": 0.0,
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """6 samples, 2 in each of 3 categories."""
    return write_dataset(tmp_path_factory.mktemp("ds"), n_per_category=2, categories=CATS, seed=7)


@pytest.fixture(scope="module")
def resumed(data, tmp_path_factory):
    """A stand-in network evaluates 3 samples with --save-meshes, then a second run resumes and does
    the other 3; the report is written after it."""
    out = tmp_path_factory.mktemp("toy") / "out"
    toy = ToyReconstructor()
    args = (toy, data["test_list"], data["root"], data["root"] / "gt", out)
    evaluate_dataset(*args, batch_size=2, workers=1, progress=False, save_meshes=True, limit=3)
    summary = evaluate_dataset(*args, batch_size=2, workers=1, progress=False, save_meshes=True)
    assert summary["run"]["skipped"] == 3 and summary["run"]["evaluated"] == 3
    page = write_report(out, data["root"], data["root"] / "gt")
    return {
        "out": out,
        "page": page,
        "html": page.read_text(),
        "rows": read_csv(out / "samples.csv"),
        "summary": summary,
    }


def _sources(text: str) -> list[str]:
    return re.findall(r'<img [^>]*src="([^"]+)"', text)


def _rgb(path: Path) -> np.ndarray:
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    assert image is not None, path
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def test_pick_samples_takes_the_best_median_and_worst_of_each_category():
    rows = [
        {"id": f"0269_{k}_00.dat", "category": "0269", "chamfer": c, "fscore": {}}
        for k, c in enumerate([0.5, 0.1, 0.9, 0.3, float("nan")])
    ]
    rows += [
        {"id": "0300_a_00.dat", "category": "0300", "chamfer": 0.2, "fscore": {}},
        {"id": "0300_b_00.dat", "category": "0300", "chamfer": 0.4, "fscore": {}},
    ]
    picks = pick_samples(rows)
    assert [(p.row["chamfer"], p.roles) for p in picks["0269"]][:2] == [(0.1, ["best"]), (0.5, ["median"])]
    assert np.isnan(picks["0269"][2].row["chamfer"]) and picks["0269"][2].roles == ["worst"]  # a failure is worst
    assert [(p.row["id"], p.roles) for p in picks["0300"]] == [
        ("0300_a_00.dat", ["best", "median"]),
        ("0300_b_00.dat", ["worst"]),
    ]


def test_a_resumed_runs_report_covers_the_whole_csv(resumed):
    html, rows = resumed["html"], resumed["rows"]
    assert len(rows) == 6
    assert "<title>xmesh evaluation report: 6 samples</title>" in html
    for cat in CATS:
        mean = np.mean([r["chamfer"] for r in rows if r["category"] == cat])
        line = re.search(
            rf"<tr><td class='text'>{cat}</td><td class='text'>\w+</td><td>(\d+)</td><td>([0-9.e+-]+)</td>", html
        )
        assert line and int(line.group(1)) == 2 and float(line.group(2)) == pytest.approx(mean, rel=1e-5)
    assert "3 evaluated, 3 already in samples.csv (resumed)" in html


def test_every_picture_is_beside_the_page_and_nothing_comes_from_elsewhere(resumed):
    html, out = resumed["html"], resumed["out"]
    sources = _sources(html)
    assert {"report/categories.png", "report/chamfer_distribution.png", "report/timing.png"} <= set(sources)
    for src in sources:
        assert src.startswith("report/") and (out / src).is_file()
        assert min(_rgb(out / src).shape[:2]) > 50
    assert "<script" not in html.lower() and "http://" not in html and "https://" not in html
    assert sorted(p.name for p in (out / "report").iterdir()) == sorted(Path(s).name for s in sources)


def test_the_gallery_shows_best_median_and_worst_with_framed_predictions(resumed, data):
    html, out, rows = resumed["html"], resumed["out"], resumed["rows"]
    gallery = [s for s in _sources(html) if "gallery_" in s]
    assert len(gallery) == 6  # 2 samples a category: best = median, and worst
    for cat in CATS:
        ranked = sorted((r for r in rows if r["category"] == cat), key=lambda r: r["chamfer"])
        assert f"best = median: {ranked[0]['id']}" in html and f"worst: {ranked[1]['id']}" in html
    assert html.count("saved by --save-meshes") == 6
    # the prediction panel is the saved mesh, framed from camera 1's direction
    sample = rows[0]["id"]
    picture = _rgb(out / "report" / f"gallery_{sample[:-4]}.png")
    assert picture.shape == (PANEL, 4 * PANEL + 3 * 4, 3)
    paths = sample_paths(sample, data["root"], data["root"] / "gt")
    cameras = load_cameras(paths.cameras)
    mesh = read_obj(out / "predict" / f"{sample[:-4]}_predict.obj")
    expected, framing = mesh_panel(
        mesh.vertices, mesh.faces, cameras[0], PANEL, camera0_row=cameras[0], title="prediction"
    )
    panel = picture[1:-1, PANEL + 4 + 1 : 2 * PANEL + 4 - 1]
    assert np.abs(panel.astype(int) - expected[1:-1, 1:-1].astype(int)).max() <= 1
    rows_, cols_ = np.nonzero(np.any(panel[: PANEL - 20] < 250, axis=2))
    assert 0.2 <= max(np.ptp(rows_), np.ptp(cols_)) / PANEL <= 0.9  # framed
    gt = load_ground_truth(paths.gt)
    assert len(gt) > 100  # the ground-truth panel has something to show
    ground = picture[1 : PANEL - 20, 2 * (PANEL + 4) + 1 : 3 * PANEL + 2 * 4 - 1]
    red = ground[..., 0].astype(int) > ground[..., 2].astype(int) + 40  # the overlay's colour, as the legend says
    assert 0.05 < red.mean() < 0.9


def test_throughput_and_timing_are_shown_when_the_summary_has_them(resumed, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(resumed["out"], out)
    summary = json.loads((out / "summary.json").read_text())
    summary["run"].update(timing=dict(TIMING), samples_per_s=3.125, batch_size=16, evaluated=39, skipped=0)
    (out / "summary.json").write_text(json.dumps(summary))
    html = write_report(out).read_text()
    section = html[html.index("<section id='timing'>") : html.index("<section id='gallery'>")]
    assert "3.125 samples/s" in section and "<dd>16</dd>" in section and "12.500 s" in section
    for stage, seconds in TIMING.items():
        if stage != "wall":
            assert f"<td>{seconds:.3f}</td>" in section
    assert "report/timing.png" in section and "timing-absent" not in section
    # without the dataset roots the gallery still draws what it has: the saved predictions
    assert html.count("gallery-image") == 6
    picture = _rgb(out / "report" / f"gallery_{resumed['rows'][0]['id'][:-4]}.png")
    assert picture.shape == (PANEL, 3 * PANEL + 2 * 4, 3)  # a blank input panel, the prediction, a blank ground truth
    assert np.all(picture[PANEL // 2, 2 : PANEL - 2] == 245)


def test_an_old_summary_without_timing_still_gives_a_report(resumed, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(resumed["out"], out)
    summary = json.loads((out / "summary.json").read_text())
    for key in ("timing", "samples_per_s", "batch_size"):
        summary["run"].pop(key, None)
    summary.pop("meta", None)
    (out / "summary.json").write_text(json.dumps(summary))
    html = write_report(out).read_text()
    assert "id='timing-absent'" in html and "Time breakdown absent" in html
    assert not (out / "report" / "timing.png").exists()  # the earlier report's chart is gone with it
    assert "report/categories.png" in html and "not recorded" in html
    (out / "summary.json").unlink()  # no summary at all: the CSV alone still makes a report
    assert "6 samples" in write_report(out).read_text()


def test_report_without_matplotlib_fails_at_once_naming_the_extra(data, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtraError, match=r'pip install "xmesh-p2mpp\[report\]"'):
        write_report(tmp_path)
    out = tmp_path / "never"
    rc = cli.main(eval_argv(data, out, "--report"))
    err = capsys.readouterr().err
    assert rc == 2 and "xmesh-p2mpp[report]" in err and "matplotlib" in err and "Traceback" not in err
    assert not out.exists()  # refused before anything ran


def test_xmesh_eval_report_reconstructs_the_gallery_again_and_says_the_weights_are_synthetic(tmp_path):
    small = write_dataset(tmp_path / "ds", n_per_category=1, categories=CATS[:2], seed=11)
    out = tmp_path / "out"
    root = small["root"]
    assert cli.main(eval_argv(small, out, "--report")) == 0
    html = (out / "report.html").read_text()
    assert "id='synthetic-warning'" in html and "recipe seed 1" in html
    assert html.count("reconstructed again for this report") == 2
    sample = small["ids"][0]
    paths = sample_paths(sample, root, root / "gt")
    mesh = Reconstructor(synthetic_weights(1))([str(p) for p in paths.images], str(paths.cameras))
    cameras = load_cameras(paths.cameras)
    expected, framing = mesh_panel(
        mesh.vertices, mesh.faces, cameras[0], PANEL, camera0_row=cameras[0], title="prediction"
    )
    picture = _rgb(out / "report" / f"gallery_{sample[:-4]}.png")
    panel = picture[1:-1, PANEL + 4 + 1 : 2 * PANEL + 4 - 1]
    # the report reconstructs a batch, this test one sample: the meshes may differ in their last bits
    # (BLAS), so the drawings are compared as drawings of one mesh (tests/drawings.py says why)
    xy, _, _ = framing.screen(to_world(mesh.vertices, "camera0", cameras[0]), PANEL)
    band = edge_band(xy, mesh.faces, (PANEL, PANEL))
    assert_same_drawing(panel, expected[1:-1, 1:-1], band[1:-1, 1:-1])


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class ToyWithBatches(ToyReconstructor):
    """The stand-in network, also answering the gallery's ``reconstruct_batch``."""

    def reconstruct_batch(self, images, cameras, views=None):
        return [Mesh(self.base, self.faces) for _ in images]


def test_a_gallery_made_again_shows_its_progress_on_a_terminal(data, tmp_path, monkeypatch):
    toy, out = ToyWithBatches(), tmp_path / "out"
    evaluate_dataset(
        toy, data["test_list"], data["root"], data["root"] / "gt", out, batch_size=2, workers=0, progress=False
    )  # without --save-meshes: the report reconstructs its gallery
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    write_report(out, data["root"], data["root"] / "gt", toy)
    assert re.search(r"report: reconstructing the gallery: 100%.* 6/6 ", terminal.getvalue()), terminal.getvalue()


@browser.needs_chromium
def test_report_in_a_headless_browser(resumed, tmp_path):
    seen = browser.probe(resumed["page"])
    assert seen["title"] == "xmesh evaluation report: 6 samples"
    assert seen["sections"] == ["run", "metrics", "timing", "gallery"]
    assert seen["images"] and all(
        img["complete"] and img["width"] > 0 and img["height"] > 0 for img in seen["images"]
    ), [i for i in seen["images"] if not i["width"]]
    assert sum(img["cls"] == "chart" for img in seen["images"]) == 3
    assert sum(img["cls"] == "gallery-image" for img in seen["images"]) == 6
    shot = browser.screenshot(resumed["page"], tmp_path / "report.png", 1280, min(seen["height"], 12000))
    image = _rgb(shot)
    assert image.shape[1] == 1280 and image.shape[0] == min(seen["height"], 12000)
    assert (image.std(axis=2) > 30).mean() > 0.01  # coloured charts and renders, not a blank page
