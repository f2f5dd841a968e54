"""The TensorFlow V2 checkpoint writer, against checkpoints TensorFlow itself wrote."""

from __future__ import annotations

import json

import numpy as np
import pytest

from xmesh.errors import InputError
from xmesh.io.checkpoint import read_checkpoint, read_index, resolve_prefix
from xmesh.io.crc32c import crc32c
from xmesh.io.tf_checkpoint_writer import write_checkpoint
from xmesh.io.weights import expected_variables, load_weights, synthetic_weights

SUBSET = "meshnet_subset.ckpt-5"


@pytest.fixture(scope="module")
def subset_arrays(golden_dir):
    with np.load(golden_dir / "tf_ckpt" / "meshnet_subset_expected.npz") as npz:
        return {k.replace("|", "/"): npz[k] for k in npz.files}


def test_golden_subset_files_are_tensorflows_bytes(golden_dir, subset_arrays, tmp_path):
    """The 52 arrays of the TF-written checkpoint, written here: index, data shard and state file are
    byte for byte the ones TensorFlow's saver wrote (same table blocks, entries, offsets, crcs)."""
    write_checkpoint(tmp_path / SUBSET, subset_arrays)
    for name in (f"{SUBSET}.index", f"{SUBSET}.data-00000-of-00001", "checkpoint"):
        assert (tmp_path / name).read_bytes() == (golden_dir / "tf_ckpt" / name).read_bytes(), name


def test_official_names_round_trip_bit_for_bit(tmp_path):
    weights = synthetic_weights(3)
    assert len(weights) == 237
    prefix = write_checkpoint(tmp_path / "run" / "model.ckpt-7", weights)
    assert resolve_prefix(tmp_path / "run") == prefix
    back = read_checkpoint(prefix)
    assert list(back) == sorted(weights)
    for name, array in weights.items():
        assert back[name].dtype == np.float32 and back[name].shape == array.shape
        assert back[name].tobytes() == array.tobytes(), name
    # every other command loads weights through load_weights; the checkpoint folder is a source
    loaded = load_weights(tmp_path / "run", stages=(1, 2))
    assert all(loaded[n].tobytes() == weights[n].tobytes() for n in weights)


def test_official_layout_matches_the_official_indexes(shared_dir, tmp_path):
    """For the official checkpoints' names and shapes, the entries come out as in the real .index files:
    same names, dtypes, shapes, shard, offsets and sizes (data in name order, unpadded)."""
    folder = shared_dir / "official_index"
    for stem, stage in (("meshnetmvp2m.ckpt-50", 1), ("meshnet.ckpt-10", 2)):
        official = read_index(folder / f"{stem}.index")
        arrays = {n: np.zeros(s, np.float32) for n, s in expected_variables(stage).items()}
        written = read_index(write_checkpoint(tmp_path / stem, arrays, state_file=False))
        assert list(written) == list(official)
        for name, info in official.items():
            got = written[name]
            assert (got.dtype, got.shape, got.shard, got.offset, got.size) == (
                info.dtype,
                info.shape,
                info.shard,
                info.offset,
                info.size,
            ), name
            assert got.crc == crc32c(arrays[name])
    manifest = json.loads((folder / "manifest.json").read_text())
    assert len(manifest) == 237


def test_several_blocks_and_dtypes(tmp_path):
    """Enough long names to fill several 256 KiB table blocks, other dtypes, scalars and empty arrays."""
    rng = np.random.default_rng(0)
    arrays = {f"scope_{i:05d}/" + "x" * 120 + "/W:0": rng.standard_normal(3).astype(np.float32) for i in range(4000)}
    arrays["global_step:0"] = np.array(12345, dtype=np.int64)
    arrays["beta1_power:0"] = np.array(0.81, dtype=np.float32)
    arrays["mask:0"] = rng.integers(0, 2, (4, 5)).astype(bool)
    arrays["empty:0"] = np.zeros((0, 3), np.float64)
    arrays["big_endian:0"] = np.arange(6, dtype=">i4").reshape(2, 3)
    prefix = write_checkpoint(tmp_path / "many", arrays)
    index_size = (tmp_path / "many.index").stat().st_size
    assert index_size > 2 * 262144
    back = read_checkpoint(prefix)
    assert sorted(back) == sorted(arrays)
    for name, array in arrays.items():
        assert back[name].shape == array.shape and np.array_equal(back[name], array), name
        assert back[name].dtype == array.dtype.newbyteorder("="), name


def test_bad_arrays_refused(tmp_path):
    with pytest.raises(InputError, match="'s:0'.*dtype <U1"):
        write_checkpoint(tmp_path / "x", {"s:0": np.array(["a"])})
    with pytest.raises(InputError, match="non-empty name"):
        write_checkpoint(tmp_path / "x", {"": np.zeros(2)})
    assert not list(tmp_path.iterdir())


def test_rewrite_replaces_whole_files(tmp_path, subset_arrays):
    """A second save under the same prefix replaces both files; the reader sees the new arrays."""
    write_checkpoint(tmp_path / "m", {"a:0": np.ones(5, np.float32)})
    write_checkpoint(tmp_path / "m", {"a:0": np.full(2, 3.0, np.float32), "b:0": np.zeros(1, np.float32)})
    back = read_checkpoint(tmp_path / "m")
    assert back["a:0"].tolist() == [3.0, 3.0] and back["b:0"].tolist() == [0.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "m.data-00000-of-00001", "m.index"]
