"""Agreement with what the ORIGINAL TensorFlow Pixel2Mesh++ computed (../shared/golden/demo_seed1.npz).

Everything is loaded through xmesh's real loaders: the official-layout template `template.dat`,
the synthetic weights of seed 1 (the recipe in golden/README.md), the demo PNGs through the image
loader and `cameras.txt` through the camera loader.
"""
from __future__ import annotations

import numpy as np
import pytest

from xmesh import Reconstructor
from xmesh.io.cameras import load_cameras
from xmesh.io.images import load_images
from xmesh.io.template import load_template
from xmesh.io.weights import synthetic_weights
from xmesh.model.network import Trace

# Tolerances of golden/README.md and the issue. The original casts pixel positions to integers
# (stage 1) and takes floor/ceil (stage 2), so a last-bit difference can move a sample to the
# neighbouring pixel; these are the fractions of vertices allowed to differ.
MAP_RTOL = 1e-5
BLOCK_ATOL = 1e-5
BLOCK_MIN_FRACTION = 0.999
DISPLACEMENT_RTOL = 1e-3


def relative(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def golden(golden_dir):
    return dict(np.load(golden_dir / "demo_seed1.npz"))


@pytest.fixture(scope="module")
def inputs(demo_dir):
    images = load_images([demo_dir / f"plane{i}.png" for i in (1, 2, 3)])
    cameras = load_cameras(demo_dir / "cameras.txt")
    return images, cameras


@pytest.fixture(scope="module")
def run(golden_dir, inputs):
    model = Reconstructor(synthetic_weights(1), template=load_template(golden_dir / "template.dat"))
    images, cameras = inputs
    trace = Trace()
    coarse, refined = model.run(images[None], cameras[None], trace=trace)
    return model, trace, coarse[0], refined[0]


def test_inputs_load_like_the_original(golden, inputs):
    images, cameras = inputs
    np.testing.assert_array_equal(images, golden["images"])
    np.testing.assert_array_equal(cameras, golden["cameras"])


@pytest.mark.parametrize("index,key", enumerate(["stage1_feat56", "stage1_feat28", "stage1_feat14", "stage1_feat7"]))
def test_stage1_cnn_maps(golden, run, index, key):
    assert relative(run[1].stage1_maps[index], golden[key]) <= MAP_RTOL


@pytest.mark.parametrize("index,key", enumerate(["stage2_feat224_view0", "stage2_feat112", "stage2_feat56"]))
def test_stage2_cnn_maps(golden, run, index, key):
    ours = run[1].stage2_maps[index]
    ours = ours[0] if key.endswith("view0") else ours
    assert relative(ours, golden[key]) <= MAP_RTOL


@pytest.mark.parametrize("block", [1, 2, 3])
def test_stage1_block_coordinates(golden, run, block):
    ours = run[1].stage1_blocks[block - 1][0]
    ref = golden[f"stage1_block{block}"]
    assert ours.shape == ref.shape
    close = np.abs(ours - ref).max(axis=1) <= BLOCK_ATOL
    assert close.mean() >= BLOCK_MIN_FRACTION, f"only {close.mean():.4%} of block {block}'s vertices within {BLOCK_ATOL}"


@pytest.mark.parametrize("block", [1, 2])
def test_stage2_displacements(golden, run, block):
    previous = golden["stage1_block3"] if block == 1 else golden["stage2_block1"]
    ours_previous = run[1].stage1_blocks[2][0] if block == 1 else run[1].stage2_blocks[0][0]
    ours = run[1].stage2_blocks[block - 1][0] - ours_previous
    ref = golden[f"stage2_block{block}"] - previous
    assert relative(ours, ref) <= DISPLACEMENT_RTOL


def test_final_mesh_is_block_two(golden, run):
    np.testing.assert_array_equal(run[3], run[1].stage2_blocks[1][0])
    assert np.abs(run[3] - golden["stage2_block2"]).max() < 1e-3
