"""Stage 2's training layers: each backward against float64 central differences (tests/gradcheck.py),
and each training forward against the inference forward it stands beside."""

from __future__ import annotations

import numpy as np
import pytest

from gradcheck import check_gradients, namespace, namespaces
from xmesh.backends import get_backend
from xmesh.model import deformation, deformation_train, local_projection_train, projection, view_pool
from xmesh.model.camera import packed_transforms

xp = get_backend("numpy").xp  # the inference comparisons run on NumPy
# the demo's three cameras (golden/demo_seed1.npz)
CAMERAS = np.array(
    [
        [250.48103, 29.459713, 0.0, 0.6523131, 25.0],
        [8.366592, 26.475084, 0.0, 0.7132995, 25.0],
        [59.490444, 28.93065, 0.0, 0.80579793, 25.0],
    ]
)


@pytest.fixture(params=namespaces())
def xpd(request):
    """The array library a pair's float64 check runs on: NumPy, and CuPy where CUDA is present."""
    return namespace(request.param)


def on(xpd, inputs: dict) -> dict:
    return {k: xpd.asarray(v) for k, v in inputs.items()}


def host(array) -> np.ndarray:
    return array.get() if hasattr(array, "get") else np.asarray(array)


def transforms(batch: int, xpd=xp, dtype=np.float64):
    cameras = np.repeat(CAMERAS[None], batch, axis=0)
    return projection.DeviceTransforms.from_packed(
        xpd.asarray(packed_transforms(cameras).astype(dtype)), cameras.shape[1]
    )


def hypothesis_points(rng, batch: int, n: int, outside: int = 0):
    """Points around the demo object (camera-0 frame); the last ``outside`` of each sample project past the image."""
    points = rng.uniform([0.1, -0.25, -0.85], [0.3, -0.05, -0.72], size=(batch, n, 3))
    points[:, n - outside :, 0] += 0.6
    return points


def padded_maps(rng, batch: int, views: int, sizes_channels):
    return [rng.standard_normal((batch * views, s + 1, s + 1, c)) for s, c in sizes_channels]


def test_view_pool_pair_splits_the_max_among_ties(xpd):
    rng = np.random.default_rng(1)
    stacked = xpd.asarray(rng.standard_normal((3, 4, 5)))
    cache = view_pool.pool_views_forward(xpd, stacked)[1]
    check_gradients(
        lambda stacked: view_pool.pool_views_forward(xpd, stacked)[0],
        lambda d: {"stacked": view_pool.pool_views_backward(xpd, *d, cache)},
        {"stacked": stacked},
        xpd,
    )
    tied = xpd.asarray(np.array([0.0, 0.0, -1.0]).reshape(3, 1, 1))
    _, cache = view_pool.pool_views_forward(xpd, tied)
    grad = view_pool.pool_views_backward(xpd, xpd.ones((1, 1)), xpd.zeros((1, 1)), xpd.zeros((1, 1)), cache)
    np.testing.assert_array_equal(host(grad)[:, 0, 0], [0.5, 0.5, 0.0])


@pytest.mark.parametrize("outside", [0, 2])
def test_local_projection_pair(xpd, outside):
    rng = np.random.default_rng(2 + outside)
    batch, n = 2, 6
    tf = transforms(batch, xpd)
    inputs = {"points": hypothesis_points(rng, batch, n, outside), "map0": None, "map1": None}
    inputs["map0"], inputs["map1"] = padded_maps(rng, batch, 3, [(8, 3), (4, 2)])
    inputs = on(xpd, inputs)

    def forward(points, map0, map1):
        return local_projection_train.local_projection_forward(xpd, points, [map0, map1], tf)[0]

    def backward(dfeats):
        maps = [inputs["map0"], inputs["map1"]]
        _, cache = local_projection_train.local_projection_forward(xpd, inputs["points"], maps, tf)
        dpoints, (dmap0, dmap1) = local_projection_train.local_projection_backward(xpd, dfeats, cache)
        return {"points": dpoints, "map0": dmap0, "map1": dmap1}

    inside = [local_projection_train.view_projection(xpd, inputs["points"], tf, v).w_inside for v in range(3)]
    # the clamp's zero gradient is checked where it applies
    assert (not all(bool(xpd.all(i)) for i in inside)) == bool(outside)
    check_gradients(forward, backward, inputs, xpd, elements=40)


def test_the_projection_backward_adds_the_maps_gradients_it_is_given(xpd):
    """local_projection_backward's ``plus`` (the maps' gradients of the deformation block after this
    one): the maps' gradients it returns are its own plus those, the points' gradient unchanged."""
    rng = np.random.default_rng(9)
    batch, n = 2, 6
    tf = transforms(batch, xpd)
    points = xpd.asarray(hypothesis_points(rng, batch, n, outside=1))
    maps = [xpd.asarray(m) for m in padded_maps(rng, batch, 3, [(8, 3), (4, 2)])]
    _, cache = local_projection_train.local_projection_forward(xpd, points, maps, tf)
    dfeats = xpd.asarray(rng.standard_normal((batch, n, 3 + 3 * 5)))
    dpoints, dmaps = local_projection_train.local_projection_backward(xpd, dfeats, cache)
    plus = [xpd.asarray(rng.standard_normal(m.shape)) for m in maps]
    expected = [host(d) + host(p) for d, p in zip(dmaps, plus, strict=True)]
    again, summed = local_projection_train.local_projection_backward(xpd, dfeats, cache, plus=plus)
    np.testing.assert_allclose(host(again), host(dpoints), rtol=1e-12)
    for ours, exact in zip(summed, expected, strict=True):
        np.testing.assert_allclose(host(ours), exact, rtol=1e-12, atol=1e-12)


def test_local_projection_forward_is_the_inference_one(xpd):
    rng = np.random.default_rng(5)
    batch, n = 2, 300
    maps = [rng.random((batch * 3, s, s, c), dtype=np.float32) for s, c in [(224, 4), (112, 3), (56, 2)]]
    points = hypothesis_points(rng, batch, n, outside=10).astype(np.float32)
    backend = get_backend("numpy")
    tf = projection.DeviceTransforms.from_cameras(backend, np.repeat(CAMERAS[None], batch, axis=0))
    padded = projection.pad_maps(backend, maps)
    on_device = projection.DeviceTransforms.from_packed(xpd.asarray(tf.packed), tf.num_views)
    ours = local_projection_train.local_projection_forward(
        xpd, xpd.asarray(points), [xpd.asarray(m) for m in padded], on_device
    )[0]
    theirs = projection.local_projection(backend, points, padded, tf)
    np.testing.assert_allclose(host(ours), theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "sizes, views, taken",
    [
        ([(225, 16), (113, 32), (57, 64)], 3, True),  # the model's padded maps
        ([(225, 16), (113, 32), (57, 64)], 8, True),
        ([(225, 16), (113, 32), (8193, 12)], 3, False),  # a sample's views of one map past 2^31 floats
        ([(225, 16), (113, 30), (57, 64)], 3, False),  # channels not in fours
    ],
)
def test_the_one_pass_projection_takes_maps_its_offsets_reach(sizes, views, taken):
    """local_projection_cupy.takes: the one-pass kernels' corners are 32-bit offsets within a sample's
    views of a map, so they take maps whose sample's views hold fewer than 2^31 floats."""
    from types import SimpleNamespace

    from xmesh.model import local_projection_cupy

    def device_map(size, channels):  # the attributes takes() reads of a contiguous, aligned CuPy map
        flags = SimpleNamespace(c_contiguous=True)
        return SimpleNamespace(
            shape=(views, size, size, channels), dtype="float32", flags=flags, data=SimpleNamespace(ptr=0)
        )

    points = np.zeros((1, 10, 3), dtype=np.float32)
    assert local_projection_cupy.takes(points, [device_map(s, c) for s, c in sizes], views) == taken


@pytest.mark.parametrize("general_a0", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_local_gconv_pair(xpd, general_a0, residual):
    rng = np.random.default_rng(int(general_a0) * 2 + int(residual))
    b, k, n, cin, cout = 2, 5, 3, 4, 6
    supports = (rng.standard_normal((k, k)) * 0.5 if general_a0 else None, rng.standard_normal((k, k)) * 0.5)
    inputs = {
        "x": rng.standard_normal((b, k, n, cin)),
        "w0": rng.standard_normal((cin, cout)),
        "w1": rng.standard_normal((cin, cout)),
        "bias": rng.standard_normal(cout) * 0.3,
    }
    if residual:
        inputs["res"] = rng.standard_normal((b, k, n, cout))
    inputs = on(xpd, inputs)
    supports = tuple(None if a is None else xpd.asarray(a) for a in supports)

    def forward(x, w0, w1, bias, res=None):
        return deformation_train.local_gconv_forward(xpd, (w0, w1, bias), x, supports, res)[0]

    def backward(dout):
        _, cache = deformation_train.local_gconv_forward(
            xpd, (inputs["w0"], inputs["w1"], inputs["bias"]), inputs["x"], supports, inputs.get("res")
        )
        dx, (dw0, dw1, db) = deformation_train.local_gconv_backward(xpd, dout, cache)
        grads = {"x": dx, "w0": dw0, "w1": dw1, "bias": db}
        if residual:
            grads["res"] = dout
        return grads

    check_gradients(forward, backward, inputs, xpd)


def test_hypothesis_update_pair(xpd):
    rng = np.random.default_rng(7)
    offsets = xpd.asarray(rng.standard_normal((5, 3)) * 0.01)
    inputs = {"centers": rng.standard_normal((2, 4, 3)), "score": rng.standard_normal((2, 5, 4))}
    inputs = on(xpd, inputs)

    def forward(centers, score):
        return deformation_train.hypothesis_update_forward(xpd, centers, score, offsets)[0]

    def backward(dnew):
        _, cache = deformation_train.hypothesis_update_forward(xpd, inputs["centers"], inputs["score"], offsets)
        dcenters, dscore = deformation_train.hypothesis_update_backward(xpd, dnew, cache)
        return {"centers": dcenters, "score": dscore}

    check_gradients(forward, backward, inputs, xpd)


def block_inputs(rng, batch: int, n: int, k: int, sizes_channels, hidden: int):
    inputs = {"centers": hypothesis_points(rng, batch, n)}
    for i, fmap in enumerate(padded_maps(rng, batch, 3, sizes_channels)):
        inputs[f"map{i}"] = np.abs(fmap)
    widths = [3 + 3 * sum(c for _, c in sizes_channels)] + [hidden] * 5 + [1]
    for i in range(6):
        scale = 1.0 / np.sqrt(widths[i])
        inputs[f"w0_{i}"] = rng.standard_normal((widths[i], widths[i + 1])) * scale
        inputs[f"w1_{i}"] = rng.standard_normal((widths[i], widths[i + 1])) * scale
        inputs[f"b_{i}"] = rng.uniform(0.0, 0.5, widths[i + 1])
    return inputs


def layers_of(values):
    return [(values[f"w0_{i}"], values[f"w1_{i}"], values[f"b_{i}"]) for i in range(6)]


def test_deformation_block_pair(xpd):
    rng = np.random.default_rng(8)
    k, sizes = 5, [(8, 2), (4, 2)]
    inputs = on(xpd, block_inputs(rng, 2, 3, k, sizes, hidden=6))
    offsets = rng.standard_normal((k, 3)) * 0.02
    offsets[0] = 0.0
    offsets = xpd.asarray(offsets)
    supports = (None, xpd.asarray(rng.standard_normal((k, k)) * 0.3))
    tf = transforms(2, xpd)

    def forward(**values):
        maps = [values["map0"], values["map1"]]
        return deformation_train.deformation_block_forward(
            xpd, layers_of(values), supports, offsets, values["centers"], maps, tf
        )[0]

    def backward(dnew):
        maps = [inputs["map0"], inputs["map1"]]
        _, cache = deformation_train.deformation_block_forward(
            xpd, layers_of(inputs), supports, offsets, inputs["centers"], maps, tf
        )
        dcenters, dmaps, grads = deformation_train.deformation_block_backward(xpd, dnew, cache)
        out = {"centers": dcenters, "map0": dmaps[0], "map1": dmaps[1]}
        for i, (dw0, dw1, db) in enumerate(grads):
            out[f"w0_{i}"], out[f"w1_{i}"], out[f"b_{i}"] = dw0, dw1, db
        return out

    check_gradients(forward, backward, inputs, xpd, elements=12, directions=2)


def test_deformation_block_forward_is_the_inference_one():
    rng = np.random.default_rng(9)
    k, sizes = 7, [(224, 2), (112, 2), (56, 2)]
    inputs = block_inputs(rng, 2, 20, k, sizes, hidden=8)
    values = {key: value.astype(np.float32) for key, value in inputs.items()}
    offsets = (rng.standard_normal((k, 3)) * 0.02).astype(np.float32)
    cheb1 = (rng.standard_normal((k, k)) * 0.3).astype(np.float32)
    backend = get_backend("numpy")
    tf = projection.DeviceTransforms.from_cameras(backend, np.repeat(CAMERAS[None], 2, axis=0))
    maps = [values[f"map{i}"] for i in range(3)]
    ours = deformation_train.deformation_block_forward(
        xp, layers_of(values), (None, cheb1), offsets, values["centers"], maps, tf
    )[0]

    class Params:
        sample_coord, sample_cheb1, sample_cheb0 = offsets, cheb1, None

    class Layer:
        def __init__(self, w0, w1, b):
            self.weight, self.bias, self.cout, self.weight0 = np.concatenate([w0, w1], axis=1), b, w0.shape[1], None

    layers = [Layer(*triple) for triple in layers_of(values)]
    theirs = deformation.deformation_block(backend, layers, Params, values["centers"], maps, tf)
    np.testing.assert_allclose(ours - values["centers"], theirs - values["centers"], rtol=1e-4, atol=1e-7)


def test_deformation_block_batch_is_its_samples():
    """A batch of two samples with their own cameras, maps and meshes: each sample's output and
    gradients are those of the sample alone (the layers sum the batch's parameter gradients)."""
    rng = np.random.default_rng(10)
    k, sizes = 5, [(8, 2), (4, 3)]
    inputs = block_inputs(rng, 2, 4, k, sizes, hidden=6)
    offsets = rng.standard_normal((k, 3)) * 0.02
    supports = (None, rng.standard_normal((k, k)) * 0.3)
    cameras = np.stack([CAMERAS, CAMERAS[[2, 0, 1]]])
    packed = packed_transforms(cameras).astype(np.float64)
    dnew = rng.standard_normal((2, 4, 3))

    def run(samples):
        tf = projection.DeviceTransforms.from_packed(packed[samples], 3)
        maps = [np.concatenate([inputs[f"map{i}"][3 * s : 3 * s + 3] for s in samples]) for i in range(2)]
        out, cache = deformation_train.deformation_block_forward(
            xp, layers_of(inputs), supports, offsets, inputs["centers"][samples], maps, tf
        )
        return out, deformation_train.deformation_block_backward(xp, dnew[samples], cache)

    both, (dcenters, dmaps, grads) = run([0, 1])
    singles = [run([s]) for s in (0, 1)]
    for s, (out, (dc, dm, _)) in enumerate(singles):
        np.testing.assert_allclose(both[s], out[0], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(dcenters[s], dc[0], rtol=1e-10, atol=1e-14)
        for whole, alone in zip(dmaps, dm, strict=True):
            np.testing.assert_allclose(whole[3 * s : 3 * s + 3], alone, rtol=1e-10, atol=1e-14)
    for i in range(6):
        for part in range(3):
            total = singles[0][1][2][i][part] + singles[1][1][2][i][part]
            np.testing.assert_allclose(grads[i][part], total, rtol=1e-10, atol=1e-13)
