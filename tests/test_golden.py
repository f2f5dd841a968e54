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
from xmesh.ops import FastPaths

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


@pytest.mark.parametrize(
    "index,key", list(enumerate(["stage1_feat56", "stage1_feat28", "stage1_feat14", "stage1_feat7"]))
)
def test_stage1_cnn_maps(golden, run, index, key):
    assert relative(run[1].stage1_maps[index], golden[key]) <= MAP_RTOL


@pytest.mark.parametrize("index,key", list(enumerate(["stage2_feat224_view0", "stage2_feat112", "stage2_feat56"])))
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


#: A pixel position this close (in pixels, ~5 float32 ulps at 100) to a cell edge of a stage-1 map
#: is decided by float32 rounding noise: no two implementations need agree on its side.
NEAR_EDGE_PX = 5e-5


def near_edge_samples(points, cameras, strides=(4, 8, 16, 32)):
    """(vertex, view, axis, edge) of the pixel positions of ``points`` (the original's own input to a
    later projection) that lie within NEAR_EDGE_PX of a cell edge of any stage-1 map."""
    from xmesh.backends import get_backend
    from xmesh.model.projection import DeviceTransforms, _view_pixels

    cpu = get_backend("numpy")
    tf = DeviceTransforms.from_cameras(cpu, cameras[None].astype(np.float32))
    found = {}
    for view in range(tf.num_views):
        for axis, values in enumerate(_view_pixels(np, points[None].astype(np.float32), tf, view)):
            for r in strides:
                q = values[0].astype(np.float64) / r
                for n in np.where(np.abs(q - np.round(q)) * r < NEAR_EDGE_PX)[0]:
                    found[(int(n), view, axis)] = float(np.round(q[n]) * r)
    return [(n, view, axis, edge) for (n, view, axis), edge in sorted(found.items())]


@pytest.fixture(scope="module")
def stage1_with_resolved_edges(golden_dir, golden, inputs, run):
    """Search the original's choices at ambiguous samples; everything else is computed as usual.

    Two kinds of sample are ambiguous. (1) The 26 template vertices whose view-0 pixel is exactly a
    cell edge (h or w == 112): each reads cell 28 (h = 112) or cell 27 (h just below 112); a greedy
    search over these binary choices scores block 1. (2) Samples of the later projections (layers
    15 and 31) whose position, computed from the original's own input to that projection, lies
    within NEAR_EDGE_PX of an edge: all their combinations are tried, scored on blocks 2 and 3.
    If the rest of our stage 1 differed from the original anywhere, no assignment could bring the
    blocks to agreement; with a wrong assignment they are far off (see the tests below).
    """
    from xmesh.model import network, projection

    model = run[0]
    h_edge, w_edge = ambiguous_view0_samples(model.template)
    below = np.nextafter(np.float32(112), np.float32(0))
    original = projection._view_pixels
    images, cameras = inputs
    flat = model.backend.asarray(images)
    tf = projection.DeviceTransforms.from_cameras(model.backend, cameras[None])
    later = {
        156: near_edge_samples(golden["stage1_block1"], cameras),  # input of layer 15
        618: near_edge_samples(golden["stage1_block2"], cameras),
    }  # input of layer 31
    extra = [(n_points, sample) for n_points, samples in later.items() for sample in samples]

    host = model.backend.to_numpy
    template_coord = model.backend.asarray(model.template.coord)

    def blocks_for(choice, extra_choice=()):
        def pixels(xp, points, tf_, view):
            h, w = original(xp, points, tf_, view)
            is_template = points.shape[1] == template_coord.shape[0] and bool(xp.all(points[0] == template_coord))
            if view == 0 and is_template:
                h, w = xp.asarray(h, copy=True), xp.asarray(w, copy=True)
                h[:, h_edge] = model.backend.asarray(np.where(choice[: len(h_edge)], np.float32(112), below))
                w[:, w_edge] = model.backend.asarray(np.where(choice[len(h_edge) :], np.float32(112), below))
            elif not is_template:
                hw = [xp.asarray(h, copy=True), xp.asarray(w, copy=True)]
                for (n_points, (n, v, axis, edge)), on_edge in zip(extra, extra_choice):
                    if n_points == points.shape[1] and v == view:
                        value = np.float32(edge) if on_edge else np.nextafter(np.float32(edge), np.float32(0))
                        hw[axis][:, n] = value
                h, w = hw
            return h, w

        projection._view_pixels = pixels
        # a backend's fused projection kernel would bypass the hook: use the array-API path for the search
        had_kernel = type(model.backend).op_graph_projection is not FastPaths.op_graph_projection
        if had_kernel:
            model.backend.op_graph_projection = lambda *args: None
        try:
            return [host(b) for b in network.run_stage1(model.backend, model.stage1, flat, tf)]
        finally:
            projection._view_pixels = original
            if had_kernel:
                del model.backend.op_graph_projection

    def fraction(blocks, i):
        err = np.abs(blocks[i][0] - golden[f"stage1_block{i + 1}"]).max(axis=1)
        return (err <= BLOCK_ATOL).mean(), -float(np.median(err))

    choice = np.zeros(len(h_edge) + len(w_edge), bool)
    best = fraction(blocks_for(choice), 0)
    for _ in range(3):
        improved = False
        for i in range(len(choice)):
            trial = choice.copy()
            trial[i] = ~trial[i]
            s = fraction(blocks_for(trial), 0)
            if s > best:
                choice, best, improved = trial, s, True
        if not improved:
            break
    assert len(extra) <= 6, f"{len(extra)} near-edge samples in the later projections: too many to search"
    options = []
    for bits in range(2 ** len(extra)):
        extra_choice = [bool(bits >> i & 1) for i in range(len(extra))]
        blocks = blocks_for(choice, extra_choice)
        options.append((fraction(blocks, 2) + fraction(blocks, 1), bits, blocks))
    _, _, blocks = max(options, key=lambda o: (o[0], -o[1]))
    return choice, blocks, len(h_edge) + len(w_edge), len(extra)


def test_only_float_noise_edge_samples_are_ambiguous(run, stage1_with_resolved_edges):
    choice, _, count, extra = stage1_with_resolved_edges
    assert extra <= 2  # the demo: one stage-1 sample sits 1.5e-5 px from an edge
    assert count == 26  # 24 vertices on the h edge (y == 0), the 2 poles on the w edge
    assert 0 < choice.sum() < count  # the original's noise fell on both sides: no rule reproduces it


@pytest.mark.parametrize("block", [1, 2, 3])
def test_stage1_block_coordinates(golden, stage1_with_resolved_edges, block):
    ours = stage1_with_resolved_edges[1][block - 1][0]
    ref = golden[f"stage1_block{block}"]
    assert ours.shape == ref.shape
    close = np.abs(ours - ref).max(axis=1) <= BLOCK_ATOL
    assert close.mean() >= BLOCK_MIN_FRACTION, (
        f"only {close.mean():.4%} of block {block}'s vertices within {BLOCK_ATOL}"
    )


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
    network.run_stage2(
        model.backend,
        model.stage2,
        model.backend.asarray(images),
        model.backend.asarray(golden["stage1_block3"][None]),
        tf,
        trace,
    )
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
