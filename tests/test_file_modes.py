"""Every file xmesh writes gets the mode the umask gives any new file (0666 less the umask), so results
on a shared disk are as readable as the user's other files: meshes, PNGs, the report and its pictures,
the summaries, the logs, samples.csv and ground-truth .dat files, under umask 022 and 077."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# Run in a process of its own: the umask belongs to the whole process, and the evaluation's loader and
# writer processes inherit it.
WRITE_EVERYTHING = """
import os, sys
from pathlib import Path
os.umask(int(sys.argv[2], 8))
from pipeline_toy import ToyReconstructor
from xmesh.evaluate import evaluate_dataset
from xmesh.mesh import Mesh
from xmesh.report import write_report
from xmesh.synthetic.dataset import write_dataset


class ToyWithBatches(ToyReconstructor):
    def reconstruct_batch(self, images, cameras, views=None):
        return [Mesh(self.base, self.faces) for _ in images]


folder = Path(sys.argv[1])
data = write_dataset(folder / "ds", n_per_category=1, categories=("02691156", "03001627"), seed=3, n_points=500)
toy, out = ToyWithBatches(), folder / "out"
evaluate_dataset(toy, data["test_list"], data["root"], data["root"] / "gt", out, batch_size=1, workers=1,
                 progress=False, save_meshes=True, save_ground=True)
write_report(out, data["root"], data["root"] / "gt", toy, progress=False)
mesh = toy.reconstruct_batch([None], [None])[0]
for name in ("m.obj", "m.xyz", "m.ply", "m.glb"):
    getattr(mesh, "to_" + name[2:])(folder / "meshes" / name)
"""


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["umask-022", "umask-077"])
def test_every_written_file_has_the_mode_of_a_new_file_under_the_umask(tmp_path, umask):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-c", WRITE_EVERYTHING, str(tmp_path), oct(umask)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    kinds = {p.suffix for p in files} | {p.name for p in files}
    for expected in (
        ".obj",
        ".xyz",
        ".ply",
        ".glb",
        ".png",
        ".dat",
        ".log",
        "report.html",
        "summary.json",
        "summary.txt",
        "samples.csv",
    ):
        assert expected in kinds, (expected, sorted(kinds))
    assert any("gallery_" in p.name for p in files) and any(p.name.endswith("_ground.xyz") for p in files)
    want = 0o666 & ~umask
    wrong = {
        str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode))
        for p in files
        if stat.S_IMODE(p.stat().st_mode) != want
    }
    assert not wrong, (oct(want), wrong)
    assert not [p for p in files if p.name.endswith(".tmp")]  # no temporary left behind
