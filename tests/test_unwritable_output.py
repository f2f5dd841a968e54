"""Every command checks that it can write its outputs before it computes: one line, exit 2, nothing built.

The cases fail for root too (tests may run as root, whom chmod does not stop): a path in /proc, a
path through a regular file, and a read-only file system (the OS's EROFS, raised where the check
makes its temporary file).
"""

from __future__ import annotations

import errno

import pytest

from conftest import eval_argv
from xmesh import cli
from xmesh.errors import UnwritableOutputError
from xmesh.io import writable
from xmesh.io.writable import check_writable_file, check_writable_folder
from xmesh.reconstruct import Reconstructor
from xmesh.synthetic.dataset import write_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("ds"), n_per_category=1, categories=("02691156",), seed=3)


@pytest.fixture()
def nothing_computed(monkeypatch):
    """Fails the test if a model is built, a picture rendered or a checkpoint converted."""
    called = []

    def forbidden(name):
        def record(*args, **kwargs):
            called.append(name)
            raise AssertionError(f"{name} ran before the output was checked")

        return record

    monkeypatch.setattr(Reconstructor, "__init__", forbidden("Reconstructor"))
    monkeypatch.setattr("xmesh.pictures.views.render_mesh_file", forbidden("render_mesh_file"))
    monkeypatch.setattr("xmesh.io.checkpoint.convert", forbidden("convert"))
    monkeypatch.setattr("xmesh.synthetic.dataset.demo_inputs", forbidden("demo_inputs"))
    monkeypatch.setattr("xmesh.pipeline.loading.start_pool", forbidden("start_pool"))
    monkeypatch.setattr("xmesh.ground_truth.write_object_ground_truth", forbidden("write_object_ground_truth"))
    yield called
    assert not called


@pytest.fixture()
def read_only(monkeypatch):
    """A read-only file system: making any file or folder fails with EROFS."""

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(writable.tempfile, "mkstemp", refuse)
    monkeypatch.setattr(writable.tempfile, "mkdtemp", refuse)


def _places(tmp_path):
    """An output path in /proc, and one whose folder is a regular file."""
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    return {"proc": "/proc/xmesh-out", "under_a_file": str(a_file / "out")}


def one_line_exit_2(capsys, argv, path: str) -> str:
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"xmesh {argv[0]}: error: ") and path in lines[0], lines[0]
    assert "cannot be written" in lines[0] and "nothing was computed" in lines[0]
    return lines[0]


def _commands(place: str, dataset, demo_dir, golden_dir):
    images = [str(demo_dir / f"plane{i}.png") for i in (1, 2, 3)]
    root = str(dataset["root"])
    return {
        "eval": eval_argv(dataset, place, "--report"),
        "reconstruct --list": [
            "reconstruct",
            "--list",
            str(dataset["test_list"]),
            "--images",
            root,
            "--weights",
            "synthetic:1",
            "--out",
            place,
            "--no-progress",
        ],
        "reconstruct": [
            "reconstruct",
            *images,
            "--cameras",
            str(demo_dir / "cameras.txt"),
            "--weights",
            "synthetic:1",
            "--out",
            place + ".obj",
        ],
        "reconstruct --coarse-out": [
            "reconstruct",
            *images,
            "--cameras",
            str(demo_dir / "cameras.txt"),
            "--weights",
            "synthetic:1",
            "--out",
            "{ok}/mesh.obj",
            "--coarse-out",
            place + ".obj",
        ],
        "render": [
            "render",
            str(demo_dir / "predict.obj"),
            "--cameras",
            str(demo_dir / "cameras.txt"),
            "--out",
            place + ".png",
        ],
        "demo": ["demo", "--out", place],
        "convert": ["convert", str(golden_dir / "tf_ckpt" / "meshnet_subset.ckpt-5"), place + ".npz"],
        "ground-truth": [
            "ground-truth",
            str(demo_dir / "predict.obj"),
            "--synset",
            "02691156",
            "--images",
            root,
            "--out",
            place,
        ],
        "train": [
            "train",
            "--stage",
            "2",
            "--images",
            root,
            "--gt",
            root + "/gt",
            "--list",
            str(dataset["test_list"]),
            "--weights",
            "synthetic:1",
            "--out",
            place,
            "--no-progress",
        ],
    }


COMMANDS = (
    "eval",
    "reconstruct --list",
    "reconstruct",
    "reconstruct --coarse-out",
    "render",
    "demo",
    "convert",
    "ground-truth",
    "train",
)


# with --coarse-out on a read-only file system, --out is refused first (as another test's case shows)
CASES = [
    (c, p)
    for c in COMMANDS
    for p in ("proc", "under_a_file", "read_only")
    if (c, p) != ("reconstruct --coarse-out", "read_only")
]


@pytest.mark.parametrize("command,place", CASES)
def test_an_unwritable_output_fails_at_once_with_one_line(
    command, place, dataset, demo_dir, golden_dir, tmp_path, capsys, nothing_computed, request
):
    if place == "read_only":
        request.getfixturevalue("read_only")
        path = str(tmp_path / "out")
    else:
        path = _places(tmp_path)[place]
    argv = [arg.replace("{ok}", str(tmp_path)) for arg in _commands(path, dataset, demo_dir, golden_dir)[command]]
    line = one_line_exit_2(capsys, argv, path)
    if place == "read_only":
        assert "Read-only file system" in line
    assert not list(tmp_path.glob("out*")) and not list(tmp_path.glob("mesh*"))


def test_the_checks_leave_nothing_behind_and_accept_folders_still_to_make(tmp_path):
    assert check_writable_folder(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert check_writable_file(tmp_path / "x" / "mesh.obj") == tmp_path / "x" / "mesh.obj"
    assert check_writable_folder(tmp_path) == tmp_path
    assert list(tmp_path.iterdir()) == []  # neither the folders nor a probe file were left
    (tmp_path / "f").write_text("a file")
    with pytest.raises(UnwritableOutputError, match="it is a file, not a folder"):
        check_writable_folder(tmp_path / "f")
    with pytest.raises(UnwritableOutputError, match="is a file, not a folder"):
        check_writable_file(tmp_path / "f" / "deeper" / "mesh.obj")
    with pytest.raises(UnwritableOutputError, match="it is a folder"):
        check_writable_file(tmp_path)
    with pytest.raises(UnwritableOutputError, match="/proc takes no new files"):
        check_writable_file("/proc/mesh.obj")
    assert isinstance(UnwritableOutputError("x"), PermissionError)
