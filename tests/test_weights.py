"""The official variable spec, the synthetic recipe, and loading/validating weights."""

from __future__ import annotations

import json

import numpy as np
import pytest

from xmesh.errors import InputError, MissingFileError, WeightsError
from xmesh.io.weights import (
    expected_variables,
    load_weights,
    normalize_name,
    synthetic_weights,
    validate_weights,
)

SUBSET = "meshnet_subset.ckpt-5"


@pytest.fixture(scope="module")
def manifest(shared_dir):
    entries = json.loads((shared_dir / "official_index" / "manifest.json").read_text())
    return {e["name"]: tuple(e["shape"]) for e in entries}


@pytest.fixture(scope="module")
def seed5():
    return synthetic_weights(5)


@pytest.fixture(scope="module")
def expected_subset(golden_dir):
    with np.load(golden_dir / "tf_ckpt" / "meshnet_subset_expected.npz") as npz:
        return {k.replace("|", "/"): npz[k] for k in npz.files}


# ----------------------------------------------------------------------------- spec


def test_expected_variables_equal_manifest(manifest):
    both = expected_variables()
    assert len(both) == 237 and both == manifest
    s1, s2 = expected_variables(1), expected_variables(2)
    assert len(s1) == 165 and len(s2) == 72
    assert {**s1, **s2} == both and not set(s1) & set(s2)
    assert all(n.startswith("meshnetmvp2m/") for n in s1)
    assert all(n.startswith("meshnet/") for n in s2)
    p = "meshnetmvp2m/pixel2mesh/graph_conv_blk"
    assert s1[f"{p}1_1_layer_1_vars/weights_0:0"] == (2883, 192)
    assert s1[f"{p}2_1_layer_17_vars/weights_1:0"] == (3075, 192)
    assert s1[f"{p}3_15_layer_47_vars/bias:0"] == (3,)
    assert s2["meshnet/pixel2mesh/graph_drb_blk2_layer_5/localgconv_7_vars/weights_0:0"] == (339, 192)


@pytest.mark.parametrize("bad", [0, 3, "1", True])
def test_expected_variables_bad_stage(bad):
    with pytest.raises(InputError, match="stage"):
        expected_variables(bad)


def test_normalize_name():
    assert normalize_name("meshnet|cnn|conv2d_1|W") == "meshnet/cnn/conv2d_1/W:0"
    assert normalize_name("meshnet/cnn/conv2d_1/W:0") == "meshnet/cnn/conv2d_1/W:0"
    assert normalize_name("meshnet|cnn|conv2d_1|b:0") == "meshnet/cnn/conv2d_1/b:0"


# ----------------------------------------------------------------------------- synthetic recipe


def test_synthetic_seed5_matches_golden(seed5, expected_subset):
    assert len(expected_subset) == 52
    for name, want in expected_subset.items():
        got = seed5[name]
        assert got.dtype == np.float32 and got.shape == want.shape, name
        assert got.tobytes() == want.tobytes(), name


def test_synthetic_properties(seed5, manifest):
    assert {n: a.shape for n, a in seed5.items()} == manifest
    assert all(a.dtype == np.float32 for a in seed5.values())
    other = synthetic_weights(6, stages=2)
    assert sorted(other) == sorted(expected_variables(2))
    assert not np.array_equal(other["meshnet/cnn/conv2d_1/W:0"], seed5["meshnet/cnn/conv2d_1/W:0"])
    coord_bias = seed5["meshnetmvp2m/pixel2mesh/graph_conv_blk3_15_layer_47_vars/bias:0"]
    assert np.all(np.abs(coord_bias - np.array([0, 0, -0.8], np.float32)) <= 0.05)
    score_w0 = seed5["meshnet/pixel2mesh/graph_drb_blk1_layer_2/localgconv_6_vars/weights_0:0"]
    lim = np.sqrt(6 / 193)
    assert score_w0.min() >= 0 and score_w0.max() <= 0.05 * 2 * lim + 1e-7
    conv = seed5["meshnetmvp2m/cnn/conv2d_12/W:0"]
    assert np.abs(conv).max() <= np.sqrt(6 / (5 * 5 * 128))
    with pytest.raises(InputError, match="seed"):
        synthetic_weights(-1)


# ----------------------------------------------------------------------------- loading


def test_load_npz_with_pipe_keys_and_no_suffix(tmp_path, seed5):
    stage1 = {k: v for k, v in seed5.items() if k.startswith("meshnetmvp2m/")}
    path = tmp_path / "w1.npz"
    np.savez(
        path,
        **{k.replace("/", "|").removesuffix(":0"): v.astype(np.float64) for k, v in stage1.items()},
        extra_unused=np.ones(3),
    )
    got = load_weights(path, stages=(1,))
    assert sorted(got) == sorted(stage1)
    for name, arr in got.items():
        assert arr.dtype == np.float32 and arr.tobytes() == stage1[name].tobytes(), name


def test_load_list_of_checkpoint_npz_and_dict(tmp_path, golden_dir, seed5):
    # stage 2: the TF-written checkpoint holds 52 of its 72 variables (seed 5); the other 20
    # (convs 9-18) come from a dict listed after it; stage 1 from an .npz with official keys
    ckpt_names = set(load_weights([golden_dir / "tf_ckpt" / SUBSET, seed5], stages=2))
    assert len(ckpt_names) == 72
    stage1_npz = tmp_path / "s1.npz"
    np.savez(stage1_npz, **{k: v for k, v in seed5.items() if k.startswith("meshnetmvp2m/")})
    rest = {f"meshnet/cnn/conv2d_{k}/{v}:0": seed5[f"meshnet/cnn/conv2d_{k}/{v}:0"] for k in range(9, 19) for v in "Wb"}
    assert len(rest) == 20
    got = load_weights([stage1_npz, str(golden_dir / "tf_ckpt" / f"{SUBSET}.index"), rest])
    assert sorted(got) == sorted(seed5)
    for name, arr in got.items():
        assert arr.tobytes() == seed5[name].tobytes(), name


def test_load_dict_drops_other_stage_and_later_overrides(seed5):
    got = load_weights(seed5, stages=[2])
    assert sorted(got) == sorted(expected_variables(2))
    name = "meshnet/cnn/conv2d_1/b:0"
    patched = {name: np.full(16, 0.25)}
    got = load_weights([seed5, patched], stages=2)
    assert got[name].dtype == np.float32 and np.all(got[name] == 0.25)


def test_missing_stage_hint(seed5):
    stage1 = {k: v for k, v in seed5.items() if k.startswith("meshnetmvp2m/")}
    with pytest.raises(WeightsError) as err:
        load_weights(stage1)
    msg = str(err.value)
    assert "72 missing" in msg and "stage-2 (meshnet)" in msg and "pass the meshnet checkpoint too" in msg
    assert sorted(err.value.missing) == sorted(expected_variables(2))
    assert "\n" not in msg and "meshnet/cnn/conv2d_1/W:0" not in msg  # one line: the hint stands for the 72 names
    assert load_weights(stage1, stages=1).keys() == stage1.keys()


def test_partial_missing_lists_exact_names(golden_dir):
    with pytest.raises(WeightsError) as err:
        load_weights(golden_dir / "tf_ckpt", stages=2)
    want = sorted(f"meshnet/cnn/conv2d_{k}/{v}:0" for k in range(9, 19) for v in "Wb")
    assert sorted(err.value.missing) == want
    msg = str(err.value)
    # one line: the first three names in the model's order, then the count of the rest
    first = [n for n in expected_variables(2) if n in want][:3]
    assert "\n" not in msg and f"20 missing variable(s): {', '.join(first)} and 17 more" in msg, msg
    assert sum(n in msg for n in want) == 3
    assert "pass the" not in msg  # no whole stage is missing, so no hint about the other checkpoint
    assert "meshnet/cnn/conv2d_8/W:0" not in msg


def test_wrong_shape_dtype_and_nonfinite(seed5):
    bad = dict(seed5)
    shape_name = "meshnet/cnn/conv2d_3/W:0"
    dtype_name = "meshnetmvp2m/cnn/conv2d_2/b:0"
    nan_name = "meshnet/pixel2mesh/graph_drb_blk1_layer_2/localgconv_3_vars/bias:0"
    inf_name = "meshnetmvp2m/cnn/conv2d_4/b:0"
    bad[shape_name] = np.zeros((3, 3, 32, 16), np.float32)
    bad[dtype_name] = np.zeros(16, np.int32)
    bad[nan_name] = np.where(np.arange(192) == 7, np.nan, 0).astype(np.float32)
    bad[inf_name] = np.full(32, 1e300)  # finite as float64, inf as float32
    del bad["meshnet/cnn/conv2d_18/b:0"]
    with pytest.raises(WeightsError) as err:
        validate_weights(bad, (1, 2))
    e = err.value
    msg = str(e)
    assert e.missing == ["meshnet/cnn/conv2d_18/b:0"]
    assert e.wrong_shape == [(shape_name, (3, 3, 16, 32), (3, 3, 32, 16))]
    assert e.wrong_dtype == [(dtype_name, "int32")]
    assert sorted(e.non_finite) == sorted([(nan_name, 1), (inf_name, 32)])
    assert "expected (3, 3, 16, 32), got (3, 3, 32, 16)" in msg and "int32" in msg
    with pytest.raises(WeightsError):
        load_weights(bad)
    validate_weights(seed5)  # the intact set passes


def test_missing_files_and_bad_sources(tmp_path):
    with pytest.raises(MissingFileError, match="absent.npz"):
        load_weights(tmp_path / "absent.npz")
    with pytest.raises(MissingFileError, match="no_such.ckpt"):
        load_weights(str(tmp_path / "no_such.ckpt"))
    with pytest.raises(InputError, match="source"):
        load_weights(42)
    with pytest.raises(InputError, match="source"):
        load_weights([])
    with pytest.raises(InputError, match="stages"):
        load_weights({}, stages=(3,))


# ----------------------------------------------------------------------------- weights arguments


def test_synthetic_weights_argument(seed5, monkeypatch):
    """'synthetic:SEED' (alone or as a one-element list) resolves to the recipe's arrays in the
    library, so the Python API takes it as the command line does; other values pass through."""
    import importlib

    from xmesh.io.weight_sources import describe_weights, resolve_weights
    from xmesh.reconstruct import ModelSpec

    for given in ("synthetic:5", ["synthetic:5"]):
        arrays = resolve_weights(given)
        assert sorted(arrays) == sorted(seed5)
        assert all(np.array_equal(arrays[k], seed5[k]) for k in seed5)
    assert resolve_weights(["a.npz"]) == "a.npz" and resolve_weights(["a", "b"]) == ["a", "b"]
    assert resolve_weights(seed5) is seed5
    with pytest.raises(InputError, match=r"weights 'synthetic:x5': expected synthetic:N"):
        resolve_weights("synthetic:x5")
    with pytest.raises(InputError, match=r"--weights 'synthetic:-1'"):
        resolve_weights(["synthetic:-1"], option="--weights")
    assert "NOT the trained" in describe_weights("synthetic:5") and describe_weights(["a", "b"]) == "weights from a, b"

    reconstruct_module = importlib.import_module("xmesh.reconstruct")  # the package's name is the function
    received = []
    real = reconstruct_module.load_weights
    monkeypatch.setattr(reconstruct_module, "load_weights", lambda source: received.append(source) or real(source))
    model = ModelSpec.of(["synthetic:5"]).build()
    assert model.spec.weights == "synthetic:5"  # the recipe's name travels, not its arrays
    assert all(np.array_equal(received[0][k], seed5[k]) for k in seed5)
