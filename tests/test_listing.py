"""The dataset listing: every sample's paths and the error of its first absent file, in list order,
as a check with pathlib reads them, over lists long enough to be split among the listing's threads."""

from __future__ import annotations

from pathlib import Path

import pytest

from xmesh import dataset
from xmesh.dataset import SampleId, list_samples, sample_paths
from xmesh.errors import MissingFileError

VIEWS = (0, 6, 7)


def _expected_problem(sample: SampleId, images_root: Path, gt_root: Path, with_gt: bool) -> str | None:
    """The message of the first absent file, found with pathlib (the reference)."""
    folder = images_root / "ShapeNetRendering" / sample.synset / sample.item / "rendering"
    files = [(f"rendering {v:02d}.png", folder / f"{v:02d}.png") for v in VIEWS]
    files.append(("camera metadata", folder / "rendering_metadata.txt"))
    if with_gt:
        files.append(("ground-truth", gt_root / sample.name))
    for what, path in files:
        if not path.is_file():
            state = "is not a file" if path.exists() else "does not exist"
            return f"sample {sample}: {what} file {str(path)!r} {state}"
    return None


def _layout(root: Path, count: int) -> list[str]:
    """``count`` samples with empty files in the official layout, some of them broken in different ways."""
    ids = []
    for k in range(count):
        sample = SampleId("02691156", f"item{k}", "00")
        folder = root / "ShapeNetRendering" / sample.synset / sample.item / "rendering"
        folder.mkdir(parents=True)
        for name in ("00.png", "06.png", "07.png", "rendering_metadata.txt"):
            (folder / name).touch()
        (root / "gt").mkdir(exist_ok=True)
        (root / "gt" / sample.name).touch()
        ids.append(sample.name)
    base = root / "ShapeNetRendering" / "02691156"
    (base / "item3" / "rendering" / "06.png").unlink()  # an absent view
    (base / "item5" / "rendering" / "rendering_metadata.txt").unlink()
    (base / "item5" / "rendering" / "rendering_metadata.txt").mkdir()  # a folder where a file belongs
    (root / "gt" / ids[8]).unlink()  # absent ground truth
    for name in ("00.png", "06.png", "07.png", "rendering_metadata.txt"):
        (base / "item11" / "rendering" / name).unlink()
    (base / "item11" / "rendering").rmdir()
    (base / "item11" / "rendering").touch()  # a file where a folder belongs
    (root / "gt" / ids[12]).unlink()
    (root / "gt" / ids[12]).symlink_to(root / "nowhere.dat")  # a broken link
    return ids


@pytest.mark.parametrize("with_gt", [True, False])
def test_listing_finds_the_first_absent_file_of_each_sample_in_order(tmp_path, monkeypatch, with_gt):
    monkeypatch.setattr(dataset, "LISTING_CHUNK", 4)  # 17 samples: five tasks over the threads
    ids = _layout(tmp_path, 17)
    lst = tmp_path / "list.txt"
    lst.write_text("".join(f"{i}\n" for i in ids))
    listed = list_samples(lst, tmp_path, tmp_path / "gt", VIEWS, with_gt=with_gt)
    assert [str(s) for s, _, _ in listed] == ids
    found = {str(s): (None if problem is None else str(problem)) for s, _, problem in listed}
    expected = {i: _expected_problem(SampleId.parse(i), tmp_path, tmp_path / "gt", with_gt) for i in ids}
    assert found == expected
    broken = {i for i, message in expected.items() if message is not None}
    assert broken == ({ids[3], ids[5], ids[8], ids[11], ids[12]} if with_gt else {ids[3], ids[5], ids[11]})
    assert "rendering 06.png file" in found[ids[3]] and found[ids[3]].endswith("does not exist")
    assert found[ids[5]].endswith("is not a file")
    assert all(isinstance(problem, MissingFileError) for _, _, problem in listed if problem is not None)
    for sample, paths, _ in listed:
        assert paths == sample_paths(sample, tmp_path, tmp_path / "gt", VIEWS)


def test_listing_honours_the_limit_and_the_views(tmp_path):
    ids = _layout(tmp_path, 17)
    lst = tmp_path / "list.txt"
    lst.write_text("".join(f"{i}\n" for i in ids))
    listed = list_samples(lst, tmp_path / "ShapeNetRendering", tmp_path / "gt", (7, 6, 0), limit=4)
    assert [str(s) for s, _, _ in listed] == ids[:4]
    assert [Path(p).name for p in listed[0][1].images] == ["07.png", "06.png", "00.png"]
    assert listed[3][2] is not None and "06.png" in str(listed[3][2])
