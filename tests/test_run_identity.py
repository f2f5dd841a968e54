"""A run's identity (weights, template, result-changing settings) recorded in its output folder: a resume
with another is refused in one line naming what differs (exit 2, nothing changed), --overwrite starts
afresh; the same rule for any dict of named values (training's resume uses it too)."""

from __future__ import annotations

import json

import pytest

from conftest import eval_argv
from xmesh import cli
from xmesh.errors import FileFormatError, InputError
from xmesh.evaluate import read_csv
from xmesh.io.weights import synthetic_weights
from xmesh.results.run_identity import (
    RUN_JSON,
    RunIdentity,
    check_or_record,
    model_identity,
    read_identity,
)
from xmesh.synthetic.dataset import write_dataset

# ------------------------------------------------------------------------------------ the rule


def test_a_folder_records_its_first_identity_and_refuses_another_naming_each_difference(tmp_path):
    first = RunIdentity.of({"weights": "a" * 64, "lr": 1e-5, "views": (0, 6, 7)}, {"weights": "seed 1"})
    check_or_record(tmp_path / "run", first)
    assert read_identity(tmp_path / "run") == first  # tuples read back as the lists JSON holds
    check_or_record(
        tmp_path / "run", RunIdentity.of({"views": [0, 6, 7], "lr": 1e-5, "weights": "a" * 64}, {"weights": "seed 1"})
    )  # the same: a resume
    other = RunIdentity.of({"weights": "b" * 64, "lr": 1e-4, "views": [0, 6, 7], "steps": 10}, {"weights": "seed 2"})
    with pytest.raises(InputError) as info:
        check_or_record(tmp_path / "run", other, option="--log-dir")
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"--log-dir {tmp_path / 'run'} holds the results of another run")
    assert "lr 1e-05 there, 0.0001 now" in message
    assert "weights aaaaaaaaaaaa (seed 1) there, bbbbbbbbbbbb (seed 2) now" in message
    assert "steps (not recorded) there, 10 now" in message and "views" not in message
    assert "--overwrite" in message
    assert read_identity(tmp_path / "run") == first  # refused: the record is unchanged
    check_or_record(tmp_path / "run", other, overwrite=True)
    assert read_identity(tmp_path / "run") == other


def test_a_damaged_record_is_named(tmp_path):
    (tmp_path / RUN_JSON).write_text("{not json")
    with pytest.raises(FileFormatError, match=f"{RUN_JSON}: not a run record of xmesh"):
        check_or_record(tmp_path, RunIdentity.of({"a": 1}))
    check_or_record(tmp_path, RunIdentity.of({"a": 1}), overwrite=True)
    assert json.loads((tmp_path / RUN_JSON).read_text())["identity"] == {"a": 1}


def test_the_model_identity_changes_with_the_weights_template_and_each_setting(golden_dir):
    weights = synthetic_weights(1)
    base = dict(model_identity(weights).fields)
    assert set(base) == {"weights", "template", "backend", "precision", "views", "view_quirk"}
    assert dict(model_identity(synthetic_weights(1)).fields) == base  # the arrays, not the object
    changed = {
        "weights": model_identity(synthetic_weights(2)),
        "template": model_identity(weights, golden_dir / "template.dat"),
        "precision": model_identity(weights, precision="fp16"),
        "backend": model_identity(weights, backend="cupy"),
        "views": model_identity(weights, views=(1, 2, 3)),
        "view_quirk": model_identity(weights, view_quirk=False),
    }
    for name, identity in changed.items():
        fields = dict(identity.fields)
        assert [key for key in base if fields[key] != base[key]] == [name]


# ------------------------------------------------------------------------------------ the commands


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("ds"), n_per_category=1, categories=("02691156", "03001627"), seed=4)


def _eval(data, out, *extra):
    return cli.main(eval_argv(data, out, "--limit", "1", *extra, weights=None))


def test_eval_refuses_to_resume_with_other_weights_template_or_precision_and_overwrite_starts_afresh(
    data, tmp_path, golden_dir, capsys
):
    out = tmp_path / "out"
    assert _eval(data, out, "--weights", "synthetic:1", "--save-meshes") == 0
    seed1 = read_csv(out / "samples.csv")
    capsys.readouterr()

    def refused(options, *named):
        before = {name: (out / name).read_bytes() for name in ("samples.csv", "summary.json", RUN_JSON)}
        assert _eval(data, out, *options) == 2, options
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("xmesh eval: error: --out "), lines  # no traceback either
        err = lines[0]
        assert f"holds the results of another run ({RUN_JSON}): {named[0]} " in err and "--overwrite" in err, err
        assert all(f"; {name} " in err or f": {name} " in err for name in named), err
        assert {name: (out / name).read_bytes() for name in before} == before  # nothing written
        return err

    err = refused(["--weights", "synthetic:2"], "weights")
    assert "(synthetic:1) there, " in err and "(synthetic:2) now" in err
    refused(["--weights", "synthetic:1", "--template", str(golden_dir / "template.dat")], "template")
    # a folder a GPU began in fp16, resumed here in fp32
    original = (out / RUN_JSON).read_text()
    record = json.loads(original)
    record["identity"].update(backend="cupy", precision="fp16")
    (out / RUN_JSON).write_text(json.dumps(record))
    err = refused(["--weights", "synthetic:1"], "backend", "precision")
    assert "precision fp16 there, fp32 now" in err
    (out / RUN_JSON).write_text(original)

    # --overwrite: seed 2's run alone, its identity recorded, seed 1's meshes gone with its rows
    stale = out / "predict" / "stale_predict.obj"
    stale.write_text("v 0 0 0\n")
    (out / "predict" / "notes.txt").write_text("mine")
    assert _eval(data, out, "--weights", "synthetic:2", "--overwrite") == 0
    rows = read_csv(out / "samples.csv")
    assert len(rows) == 1 and rows[0]["id"] == seed1[0]["id"] and rows[0]["chamfer"] != seed1[0]["chamfer"]
    summary = json.loads((out / "summary.json").read_text())
    assert "recipe seed 2" in summary["meta"]["weights"] and summary["run"]["skipped"] == 0
    assert json.loads((out / RUN_JSON).read_text())["about"]["weights"] == "synthetic:2"
    assert not stale.exists() and not list((out / "predict").glob("*_predict.*"))
    assert (out / "predict" / "notes.txt").read_text() == "mine"  # not an xmesh file: kept
    capsys.readouterr()
    assert _eval(data, out, "--weights", "synthetic:2") == 0  # and it resumes as seed 2
    assert "1 sample(s) already in" in capsys.readouterr().err


def test_reconstruct_list_refuses_other_weights_and_overwrites_its_meshes(data, tmp_path, capsys):
    out = tmp_path / "meshes"

    def listed(*extra):
        return cli.main(
            [
                "reconstruct",
                "--list",
                str(data["test_list"]),
                "--images",
                str(data["root"]),
                "--out",
                str(out),
                "--limit",
                "1",
                "--no-progress",
                *extra,
            ]
        )

    assert listed("--weights", "synthetic:1") == 0
    mesh = next(out.glob("*_predict.obj"))
    first = mesh.read_bytes()
    capsys.readouterr()
    assert listed("--weights", "synthetic:2") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "run.json): weights " in err and "(synthetic:2) now" in err, err
    assert mesh.read_bytes() == first
    assert listed("--weights", "synthetic:2", "--overwrite") == 0
    assert "(0 already there)" in capsys.readouterr().err
    assert mesh.read_bytes() != first
