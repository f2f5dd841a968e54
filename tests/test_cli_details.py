"""The command line's smaller promises: one-line refusals of --batch-size 0, OpenCV kept quiet, warnings
for images unlike the renderings the network knows, help and ignore files that say what they should, one
line for Ctrl+C and for an example run on a backend this machine lacks."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest

from conftest import eval_argv
from xmesh import cli
from xmesh.io.images import load_images
from xmesh.mesh import Mesh
from xmesh.reconstruct import Reconstructor

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def demo_files(demo_dir):
    return [str(demo_dir / f"plane{i}.png") for i in (1, 2, 3)], str(demo_dir / "cameras.txt")


@pytest.fixture()
def no_model(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr(Reconstructor, "__init__", forbidden)


def one_error_line(capfd, argv) -> str:
    rc = cli.main(argv)
    err = capfd.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith(f"xmesh {argv[0]}: error: "), err
    return lines[0]


@pytest.mark.parametrize("command", ["eval", "reconstruct", "reconstruct --list"])
def test_batch_size_0_is_refused_the_same_way_everywhere(command, demo_files, tmp_path, capfd, no_model):
    images, cameras = demo_files
    argv = {
        "eval": ["eval", "--images", str(tmp_path), "--gt", str(tmp_path), "--list", cameras],
        "reconstruct": ["reconstruct", *images, "--cameras", cameras],
        "reconstruct --list": ["reconstruct", "--list", cameras, "--images", str(tmp_path)],
    }[command]
    line = one_error_line(
        capfd, argv + ["--weights", "synthetic:1", "--out", str(tmp_path / "o.obj"), "--batch-size", "0"]
    )
    assert line.endswith("error: --batch-size 0: expected a whole number >= 1 (default: 64 on the GPU, 1 on the CPU)")
    assert not list(tmp_path.iterdir())


def test_bench_refuses_batch_size_0_in_one_line(capfd, no_model):
    assert "--batch-sizes 1 0: expected whole numbers >= 1" in one_error_line(
        capfd, ["bench", "--backend", "numpy", "--batch-sizes", "1", "0"]
    )


def test_an_undecodable_image_shows_only_xmeshs_line(demo_files, tmp_path, capfd, no_model):
    images, cameras = demo_files
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(Path(images[0]).read_bytes()[:300])  # OpenCV logs a WARN for it unless silenced
    level = cv2.utils.logging.getLogLevel()
    line = one_error_line(
        capfd,
        [
            "reconstruct",
            str(truncated),
            *images[1:],
            "--cameras",
            cameras,
            "--weights",
            "synthetic:1",
            "--out",
            str(tmp_path / "m.obj"),
        ],
    )
    assert "truncated.png" in line and "could not be decoded" in line
    assert cv2.utils.logging.getLogLevel() == level  # the caller's level is back


def _photos(tmp_path):
    rng = np.random.default_rng(0)
    wide = tmp_path / "wide.jpg"
    cv2.imwrite(str(wide), (rng.random((1080, 1920, 3)) * 255).astype(np.uint8))
    grey = tmp_path / "grey.png"
    cv2.imwrite(str(grey), np.full((100, 100), 255, np.uint8))
    return str(wide), str(grey)


def test_images_unlike_renderings_warn_naming_the_view(demo_files, tmp_path):
    images, _ = demo_files
    wide, grey = _photos(tmp_path)
    with pytest.warns(UserWarning) as caught:
        load_images([images[0], wide, grey])
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2
    assert messages[0].startswith(f"view 2 ({wide}): it is 1920x1080, not square") and "not white" in messages[0]
    assert messages[1].startswith(f"view 3 ({grey}): it is greyscale") and "not white" not in messages[1]
    assert all("224x224 (or 137x137) colour pictures of the object alone on white" in m for m in messages)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_images(images)  # ShapeNet renderings (137x137 RGBA) are what the network knows


def test_the_cli_prints_each_image_warning_on_one_line(demo_files, tmp_path, capfd, monkeypatch):
    images, cameras = demo_files
    wide, grey = _photos(tmp_path)

    class Model:  # stands in for the network: the warnings come before it
        def __init__(self, *args, **kwargs):
            pass

        def __call__(self, images, cameras):
            return Mesh(np.zeros((3, 3), np.float32), np.array([[0, 1, 2]]))

    monkeypatch.setattr(
        sys.modules["xmesh.reconstruct"], "Reconstructor", Model
    )  # xmesh.reconstruct is also a function
    assert (
        cli.main(
            [
                "reconstruct",
                wide,
                grey,
                images[2],
                "--cameras",
                cameras,
                "--weights",
                "synthetic:1",
                "--out",
                str(tmp_path / "m.obj"),
            ]
        )
        == 0
    )
    lines = capfd.readouterr().err.strip().splitlines()
    assert [line[: len("xmesh reconstruct: warning: view 1")] for line in lines[:2]] == [
        "xmesh reconstruct: warning: view 1",
        "xmesh reconstruct: warning: view 2",
    ]
    assert lines[2].startswith("wrote ") and len(lines) == 3


def _help(capsys, command: str) -> str:
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", ["eval", "reconstruct"])
def test_cluster_help_names_every_spec_form(command, capsys):
    text = _help(capsys, command)
    for form in ("local:N", "local-cuda", "tcp://HOST:PORT", "scheduler file such as sched.json"):
        assert form in text, form


def test_what_the_demo_readme_and_examples_write_is_git_ignored():
    ignored = set((ROOT / ".gitignore").read_text().split())
    readme = "\n".join(path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    demo_default = cli.build_parser()._subparsers._group_actions[0].choices["demo"].get_default("out")
    written = {demo_default, "synth", "synth-eval"}  # the demo and the evaluation commands (README, manual)
    for example in (ROOT / "examples").glob("*.py"):  # the examples' default output folders
        written |= set(re.findall(r'add_argument\("(?:out|--keep)"[^)]*default="([^"]+)"', example.read_text()))
    assert {"xmesh-demo", "example-out", "xmesh-photos"} <= written
    assert {f"/{name}/" for name in written} <= ignored
    shots = re.findall(r"--screenshot=(\S+)", readme)
    assert shots and not any(shot.startswith("docs/") for shot in shots)  # the tracked docs/ picture stays


# ------------------------------------------------------------------------------------------ Ctrl+C

INTERRUPTED = "xmesh eval: interrupted; finished outputs are complete, nothing was left half-written"
WAIT_S = 120  # the longest a run may take to reach the moment a test interrupts it


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    from xmesh.synthetic.dataset import write_dataset

    return write_dataset(tmp_path_factory.mktemp("ds"), n_per_category=2, categories=("02691156", "04379243"), seed=4)


def _eval_process(data, out: Path):
    command = [sys.executable, "-m", "xmesh", *eval_argv(data, out, "--workers", "2")]
    return subprocess.Popen(
        command, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def _children(pid: int) -> list[str]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return path.read_text().split() if path.exists() else []


def _ctrl_c(process, until) -> str:
    """Ctrl+C to the run's process group (as a terminal sends it) once ``until()`` holds; its stderr."""
    deadline = time.monotonic() + WAIT_S
    while not until() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process.poll() is None, f"the run ended before it was interrupted: {process.stderr.read()}"
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=WAIT_S)
    assert process.returncode == 130, err
    return err


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads a process's children from /proc")
def test_ctrl_c_while_the_loaders_start_is_one_line(small_set, tmp_path):
    """Interrupted as its loader processes start: the one line, no traceback from the command, its
    forkserver or its loaders."""
    process = _eval_process(small_set, tmp_path / "out")
    # the loaders are the forkserver's children: they are there once it has started them
    err = _ctrl_c(process, lambda: any(_children(int(child)) for child in _children(process.pid)))
    assert "Traceback" not in err and err.strip().splitlines()[-1] == INTERRUPTED, err
    assert all(line.startswith("xmesh eval: ") for line in err.strip().splitlines()), err
    rows = tmp_path / "out" / "samples.csv"  # its header, where the model was built before the loaders started
    assert not rows.exists() or rows.read_text().endswith("\n")


@pytest.mark.parametrize("launch", ["python -m xmesh", "the xmesh script"])
def test_ctrl_c_while_python_imports_xmesh_is_one_line(launch, tmp_path):
    """Ctrl+C while the package's modules are imported (a second or more on a busy machine): a stand-in
    for SciPy, which xmesh imports then, sends it, at a point no sleep has to find."""
    (tmp_path / "scipy").mkdir()
    (tmp_path / "scipy" / "__init__.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n")
    command = {
        "python -m xmesh": ["-m", "xmesh", "eval", "--help"],
        "the xmesh script": [
            "-c",
            "import sys; sys.argv = ['/usr/local/bin/xmesh', 'eval', '--help']; "
            "from xmesh.cli import command; command()",
        ],
    }[launch]
    done = subprocess.run(
        [sys.executable, *command],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])},
    )
    assert done.returncode == 130 and done.stdout == "", done.stderr
    assert done.stderr == "xmesh: interrupted while starting; nothing was written\n"


def test_ctrl_c_in_the_middle_of_eval_is_one_line_and_keeps_whole_rows(small_set, tmp_path):
    from xmesh.results import read_csv

    rows = tmp_path / "out" / "samples.csv"
    process = _eval_process(small_set, tmp_path / "out")
    err = _ctrl_c(process, lambda: rows.exists() and len(read_csv(rows)) >= 1)
    assert "Traceback" not in err and err.strip().splitlines()[-1] == INTERRUPTED, err
    assert all(line.startswith("xmesh eval: ") for line in err.strip().splitlines()), err
    done = read_csv(rows)
    assert 1 <= len(done) < len(small_set["ids"]) and {row["id"] for row in done} <= set(small_set["ids"])
    assert rows.read_text().endswith("\n")  # every row whole


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_an_example_run_with_backend_cupy_without_cupy_says_so_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "reconstruct_from_python.py"), str(tmp_path), "--backend", "cupy"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(
        "reconstruct_from_python.py: error: backend='cupy' needs CuPy, which is not installed"
    )
    assert done.stderr.count("\n") == 1
