"""Training data: samples as the test loader loads them, ground truth with normals, stage 2's starting meshes."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from tolerance import assert_mostly_within
from xmesh.dataset import SampleId
from xmesh.errors import FileFormatError, MissingFileError
from xmesh.io.images import load_images
from xmesh.io.weights import synthetic_weights
from xmesh.reconstruct import Reconstructor
from xmesh.template_gen import generate_template
from xmesh.train.data import TrainingSet, load_labels
from xmesh.train.starts import Stage1Model, StartMeshes, compute_starts


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from xmesh.synthetic.dataset import write_dataset

    root = tmp_path_factory.mktemp("train_data")
    info = write_dataset(root, n_per_category=1, categories=("02691156", "04379243"), seed=5, n_points=800)
    return {
        "root": root,
        "list": info["test_list"],
        "gt": root / "gt",
        "ids": info["ids"],
        "renderings": info["renderings"],
    }


def test_samples_load_as_the_test_loader_loads_them(dataset):
    data = TrainingSet(dataset["list"], dataset["root"], dataset["gt"])
    data.check()
    assert [str(s) for s in data.ids] == dataset["ids"]
    sample = data.load(1)
    folder = dataset["renderings"][1]
    expected = load_images([folder / f"{v:02d}.png" for v in (0, 6, 7)])
    assert sample.images.dtype == np.float32 and sample.images.tobytes() == expected.tobytes()
    rows = np.loadtxt(folder / "rendering_metadata.txt", dtype=np.float32)
    assert np.array_equal(sample.cameras, rows[[0, 6, 7]])
    with open(dataset["gt"] / dataset["ids"][1], "rb") as handle:
        _, points = pickle.load(handle)
    assert sample.labels.shape == (800, 6) and np.array_equal(sample.labels, points)
    np.testing.assert_allclose(np.linalg.norm(sample.labels[:, 3:], axis=1), 1.0, atol=1e-5)


def test_the_originals_bare_training_array_and_bad_ground_truth(tmp_path):
    """The original's training .dat is the bare (N, 6) array; 3 columns or NaN are refused naming the sample."""
    sample = SampleId.parse("02691156_abc_00.dat")
    points = np.random.default_rng(0).standard_normal((50, 6)).astype(np.float32)
    with open(tmp_path / "bare.dat", "wb") as handle:
        pickle.dump(points, handle, protocol=2)
    assert np.array_equal(load_labels(sample, str(tmp_path / "bare.dat")), points)
    with open(tmp_path / "xyz.dat", "wb") as handle:
        pickle.dump(points[:, :3], handle, protocol=2)
    with pytest.raises(FileFormatError, match="02691156_abc_00.dat.*3 columns.*needs 6"):
        load_labels(sample, str(tmp_path / "xyz.dat"))
    points[7, 4] = np.nan
    with open(tmp_path / "nan.dat", "wb") as handle:
        pickle.dump(points, handle, protocol=2)
    with pytest.raises(FileFormatError, match="first at row 7"):
        load_labels(sample, str(tmp_path / "nan.dat"))


def test_a_missing_rendering_is_named_before_loading(dataset, tmp_path):
    listing = tmp_path / "list.txt"
    listing.write_text(dataset["ids"][0] + "\n04379243_missing_00.dat\n")
    data = TrainingSet(listing, dataset["root"], dataset["gt"])
    with pytest.raises(MissingFileError, match=r"--list .*list.txt: sample 04379243_missing_00.dat: rendering 00.png"):
        data.check()


def test_starts_are_the_networks_coarse_meshes(dataset, tmp_path):
    """Stage 1's meshes computed through the batch pipeline are the whole network's coarse output, written
    as {id}_predict.xyz; a second call finds them all and computes nothing."""
    weights = synthetic_weights(2)
    template = generate_template()
    info = compute_starts(weights, template, dataset["list"], dataset["root"], tmp_path / "starts", progress=False)
    assert info["evaluated"] == 2
    starts = StartMeshes(tmp_path / "starts", 2466)
    data = TrainingSet(dataset["list"], dataset["root"], dataset["gt"])
    starts.check(data.ids)
    model = Reconstructor(weights, template=template)
    for index in range(2):
        sample = data.load(index)
        coarse, _ = model.run(sample.images[None], sample.cameras[None])
        assert_mostly_within(starts.load(sample.id), np.asarray(coarse)[0])  # two code paths: the golden tolerance
    again = compute_starts(weights, template, dataset["list"], dataset["root"], tmp_path / "starts", progress=False)
    assert again["evaluated"] == 0 and again["skipped"] == 2
    own = Stage1Model(weights, template)
    single = own.run(sample.images[None], sample.cameras[None])
    assert single[0] is single[1]


def test_start_meshes_by_the_originals_name_and_bad_files(tmp_path):
    sample = SampleId.parse("02691156_abc_03.dat")
    starts = StartMeshes(tmp_path, 4)
    with pytest.raises(MissingFileError, match="02691156_abc_03_predict.xyz or 02691156_abc_00_predict.xyz"):
        starts.check([sample])
    mesh = np.arange(12, dtype=np.float32).reshape(4, 3) / 7
    np.savetxt(tmp_path / "02691156_abc_00_predict.xyz", mesh)  # the original's coarse_intermediate name
    assert np.array_equal(starts.load(sample), mesh)
    np.savetxt(tmp_path / "02691156_abc_03_predict.xyz", mesh[:3])  # the sample's own name comes first
    with pytest.raises(FileFormatError, match="holds 3x3 values; expected 4 finite vertices"):
        starts.load(sample)


def test_own_objects_train_from_renderings_and_xmesh_ground_truth(tmp_path):
    """A user's object: its mesh rendered ShapeNet-style, `xmesh ground-truth` for its .dat, a list line;
    the training set reads it as it reads the official layout."""
    from xmesh import cli
    from xmesh.mesh import Mesh
    from xmesh.synthetic.dataset import shapenet_cameras, write_rendering_set
    from xmesh.synthetic.shapes import make_shape

    vertices, faces = make_shape("chair", np.random.default_rng(4))
    Mesh(vertices, faces).to_obj(tmp_path / "stool.obj")
    write_rendering_set(
        tmp_path / "renders" / "03001627" / "stool", (vertices, faces), shapenet_cameras(24, np.random.default_rng(0))
    )
    assert (
        cli.main(
            [
                "ground-truth",
                str(tmp_path / "stool.obj"),
                "--synset",
                "03001627",
                "--images",
                str(tmp_path / "renders"),
                "--out",
                str(tmp_path / "gt"),
                "--points",
                "900",
            ]
        )
        == 0
    )
    (tmp_path / "list.txt").write_text("03001627_stool_00.dat\n")
    data = TrainingSet(tmp_path / "list.txt", tmp_path / "renders", tmp_path / "gt")
    data.check()
    sample = data.load(0)
    assert sample.images.shape == (3, 224, 224, 3) and sample.labels.shape == (900, 6)
    np.testing.assert_allclose(np.linalg.norm(sample.labels[:, 3:], axis=1), 1.0, atol=1e-5)
