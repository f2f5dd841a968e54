"""Agreement with what the ORIGINAL TensorFlow Pixel2Mesh++ computed (../shared/golden/demo_seed1.npz).

Everything is loaded through xmesh's real loaders: the official-layout template `template.dat`,
the synthetic weights of seed 1 (the recipe in golden/README.md), the demo PNGs through the image
loader and `cameras.txt` through the camera loader.
"""
from __future__ import annotations

import os

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
# The same tests run on the GPU with XMESH_TEST_BACKEND=cupy (fp32).
BACKEND = os.environ.get("XMESH_TEST_BACKEND", "numpy")


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
    model = Reconstructor(synthetic_weights(1), template=load_template(golden_dir / "template.dat"), backend=BACKEND)
    images, cameras = inputs
    trace = Trace()
    coarse, refined = model.run(images[None], cameras[None], trace=trace)
    host = model.backend.to_numpy
    trace.stage1_maps = [host(m) for m in trace.stage1_maps]
    trace.stage2_maps = [host(m) for m in trace.stage2_maps]
    trace.stage1_blocks = [host(b) for b in trace.stage1_blocks]
    trace.stage2_blocks = [host(b) for b in trace.stage2_blocks]
    return model, trace, host(coarse)[0], host(refined)[0]


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


def ambiguous_view0_samples(template):
    """Template vertices whose view-0 pixel is exactly a cell boundary (h or w == 112) in exact arithmetic.

    View 0's projection is a float32 round trip (out of camera 0's frame and back). For these
    vertices of the symmetric ellipsoid the exact answer lies on a cell edge, so the original's
    choice of cell was decided by its float32 rounding noise alone, which no other implementation
    reproduces bit for bit. Returns (vertex indices with h on the edge, with w on the edge).
    """
    coord = np.asarray(template.coord, np.float64)
    return np.where(np.abs(coord[:, 1]) < 1e-12)[0], np.where(np.abs(coord[:, 0]) < 1e-12)[0]


@pytest.fixture(scope="module")
def stage1_with_resolved_edges(golden_dir, golden, inputs, run):
    """Search the original's choices at those edge samples; everything else is computed as usual.

    Each ambiguous sample reads either cell 28 (h = 112) or cell 27 (h just below 112). A greedy
    search over these binary choices looks for the assignment under which our stage 1 reproduces
    the original. If the rest of our stage 1 differed from the original anywhere, no assignment
    could bring block 1 to agreement; with a wrong assignment it is far off (see the next test).
    """
    from xmesh.model import network, projection

    model = run[0]
    h_edge, w_edge = ambiguous_view0_samples(model.template)
    below = np.nextafter(np.float32(112), np.float32(0))
    original = projection._view_pixels
    images, cameras = inputs
    flat = model.backend.asarray(images)
    tf = projection.DeviceTransforms.from_cameras(model.backend, cameras[None])

    host = model.backend.to_numpy
    template_coord = model.backend.asarray(model.template.coord)

    def blocks_for(choice):
        def pixels(xp, points, tf_, view):
            h, w = original(xp, points, tf_, view)
            if view == 0 and points.shape[1] == template_coord.shape[0] and bool(xp.all(points[0] == template_coord)):
                h, w = xp.asarray(h, copy=True), xp.asarray(w, copy=True)
                h[:, h_edge] = model.backend.asarray(np.where(choice[: len(h_edge)], np.float32(112), below))
                w[:, w_edge] = model.backend.asarray(np.where(choice[len(h_edge):], np.float32(112), below))
            return h, w

        projection._view_pixels = pixels
        # a backend's fused projection kernel would bypass the hook: use the array-API path for the search
        had_kernel = "op_graph_projection" in vars(type(model.backend))
        if had_kernel:
            model.backend.op_graph_projection = None
        try:
            return [host(b) for b in network.run_stage1(model.backend, model.stage1, flat, tf)]
        finally:
            projection._view_pixels = original
            if had_kernel:
                del model.backend.op_graph_projection

    def score(choice):
        err = np.abs(blocks_for(choice)[0][0] - golden["stage1_block1"]).max(axis=1)
        return (err <= BLOCK_ATOL).mean(), -float(np.median(err))

    choice = np.zeros(len(h_edge) + len(w_edge), bool)
    best = score(choice)
    for _ in range(3):
        improved = False
        for i in range(len(choice)):
            trial = choice.copy()
            trial[i] = ~trial[i]
            s = score(trial)
            if s > best:
                choice, best, improved = trial, s, True
        if not improved:
            break
    return choice, blocks_for(choice), len(h_edge) + len(w_edge)


def test_only_float_noise_edge_samples_are_ambiguous(run, stage1_with_resolved_edges):
    choice, _, count = stage1_with_resolved_edges
    assert count == 26                      # 24 vertices on the h edge (y == 0), the 2 poles on the w edge
    assert 0 < choice.sum() < count         # the original's noise fell on both sides: no rule reproduces it


@pytest.mark.parametrize("block", [1, 2, 3])
def test_stage1_block_coordinates(golden, stage1_with_resolved_edges, block):
    ours = stage1_with_resolved_edges[1][block - 1][0]
    ref = golden[f"stage1_block{block}"]
    assert ours.shape == ref.shape
    close = np.abs(ours - ref).max(axis=1) <= BLOCK_ATOL
    assert close.mean() >= BLOCK_MIN_FRACTION, f"only {close.mean():.4%} of block {block}'s vertices within {BLOCK_ATOL}"


def test_stage1_edge_choice_matters(golden, run):
    """Without the original's noise, block 1 differs visibly: the edge samples are what the search fixes."""
    ours = run[1].stage1_blocks[0][0]
    assert np.abs(ours - golden["stage1_block1"]).max() > 1e-4


# Stage 2 from the original's own coarse mesh. Its bilinear rule is discontinuous at integer
# pixel coordinates and the moves are tiny (1e-4..1e-3), so a last-bit difference in a pixel
# position can change a vertex's move completely. The allowed outliers: 0.5% of the vertices.
OUTLIER_FRACTION = 0.005


@pytest.fixture(scope="module")
def stage2_from_golden(golden, inputs, run):
    from xmesh.model import network, projection

    model = run[0]
    images, cameras = inputs
    tf = projection.DeviceTransforms.from_cameras(model.backend, cameras[None])
    trace = Trace()
    network.run_stage2(model.backend, model.stage2, model.backend.asarray(images),
                       model.backend.asarray(golden["stage1_block3"][None]), tf, trace)
    return [model.backend.to_numpy(b) for b in trace.stage2_blocks]


@pytest.mark.parametrize("block", [1, 2])
def test_stage2_displacements(golden, stage2_from_golden, block):
    previous = golden["stage1_block3"] if block == 1 else golden["stage2_block1"]
    ours_previous = golden["stage1_block3"] if block == 1 else stage2_from_golden[0][0]
    ours = stage2_from_golden[block - 1][0] - ours_previous
    ref = golden[f"stage2_block{block}"] - previous
    err = np.linalg.norm(ours - ref, axis=1)
    keep = np.argsort(err)[: int(np.ceil(len(err) * (1 - OUTLIER_FRACTION)))]
    assert relative(ours[keep], ref[keep]) <= DISPLACEMENT_RTOL
    # most vertices move exactly as the original's: the same float32 operations in the same order
    assert np.mean(err == 0) > 0.5


def test_final_mesh_is_block_two(golden, run):
    np.testing.assert_array_equal(run[3], run[1].stage2_blocks[1][0])
    assert np.abs(run[3] - golden["stage2_block2"]).max() < 5e-3
