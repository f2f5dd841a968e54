"""Each training layer's backward against float64 central differences (tests/gradcheck.py), and each
training forward against the inference forward it stands beside."""

from __future__ import annotations

import numpy as np
import pytest

from gradcheck import check_gradients, namespace, namespaces
from test_train_drb import host
from xmesh.backends import get_backend
from xmesh.model import cnn

xp = get_backend("numpy").xp  # the inference comparisons run on NumPy


@pytest.fixture(params=namespaces())
def xpd(request):
    """The array library a pair's float64 check runs on: NumPy, and CuPy where CUDA is present."""
    return namespace(request.param)


def on(xpd, inputs: dict) -> dict:
    return {k: xpd.asarray(v) for k, v in inputs.items()}


def rand(rng, *shape, scale=1.0):
    return rng.standard_normal(shape) * scale


@pytest.mark.parametrize("stride,kernel,size", [(1, 3, 6), (2, 3, 7), (2, 5, 8), (2, 3, 8)])
def test_conv_pair(xpd, stride, kernel, size):
    rng = np.random.default_rng(stride * 10 + kernel + size)
    inputs = on(
        xpd,
        {
            "x": rand(rng, 2, size, size, 3),
            "weight": rand(rng, kernel, kernel, 3, 4, scale=0.3),
            "bias": rand(rng, 4, scale=0.1),
        },
    )

    def forward(x, weight, bias):
        return cnn.conv_forward(xpd, x, weight, bias, stride)[0]

    def backward(dy):
        _, cache = cnn.conv_forward(xpd, inputs["x"], inputs["weight"], inputs["bias"], stride)
        dx, dw, db = cnn.conv_backward(xpd, dy, cache)
        return {"x": dx, "weight": dw, "bias": db}

    check_gradients(forward, backward, inputs, xpd)


def test_conv_forward_is_the_backends_convolution():
    rng = np.random.default_rng(3)
    x = rng.random((2, 9, 9, 5), dtype=np.float32)
    w = (rng.standard_normal((3, 3, 5, 8)) * 0.2).astype(np.float32)
    b = (rng.standard_normal(8) * 0.1).astype(np.float32)
    for stride in (1, 2):
        ours = cnn.conv_forward(xp, x, w, b, stride)[0]
        theirs = get_backend("numpy").conv2d_same(x, w, b, stride)
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


def test_cnn_pair_with_taps(xpd):
    rng = np.random.default_rng(5)
    layers = [(3, 4, 1), (3, 4, 2), (3, 6, 1), (3, 6, 2)]
    inputs = {"images": rand(rng, 1, 8, 8, 2)}
    cin = 2
    for k, (ksize, cout, _) in enumerate(layers):
        inputs[f"W{k}"] = rand(rng, ksize, ksize, cin, cout, scale=0.4)
        inputs[f"b{k}"] = rand(rng, cout, scale=0.1)
        cin = cout
    inputs = on(xpd, inputs)
    taps = (2, 4)

    def convs(values):
        return [(values[f"W{k}"], values[f"b{k}"], stride) for k, (_, _, stride) in enumerate(layers)]

    def forward(**values):
        return tuple(cnn.cnn_forward(xpd, convs(values), values["images"], taps)[0])

    def backward(dmaps):
        _, caches = cnn.cnn_forward(xpd, convs(inputs), inputs["images"], taps)
        grads = cnn.cnn_backward(xpd, list(dmaps), caches, taps)
        out = {}
        for k, (dw, db) in enumerate(grads):
            out[f"W{k}"], out[f"b{k}"] = dw, db
        return out

    check_gradients(forward, backward, inputs, xpd)


def random_supports(rng, n):
    import scipy.sparse

    dense = np.where(rng.random((n, n)) < 0.3, rng.standard_normal((n, n)), 0.0)
    return scipy.sparse.identity(n, format="csr"), scipy.sparse.csr_matrix(dense), scipy.sparse.csr_matrix(dense.T)


@pytest.mark.parametrize(
    "identity,relu,residual", [(True, True, False), (True, True, True), (False, False, True), (True, False, False)]
)
def test_graph_conv_pair(xpd, identity, relu, residual):
    from xmesh.model.graph import GraphSupports, graph_conv_backward, graph_conv_forward

    rng = np.random.default_rng(11)
    n, cin, cout = 9, 5, 4
    eye, s1, other = random_supports(rng, n)
    supports = GraphSupports.from_host(xpd, (eye if identity else other, s1), np.float64)
    inputs = {
        "x": rand(rng, 2, n, cin),
        "weight0": rand(rng, cin, cout),
        "weight1": rand(rng, cin, cout),
        "bias": rand(rng, cout, scale=0.3),
    }
    if residual:
        inputs["residual"] = rand(rng, 2, n, cout)
    inputs = on(xpd, inputs)

    def forward(**v):
        return graph_conv_forward(
            xpd, v["x"], v["weight0"], v["weight1"], v["bias"], supports, relu, v.get("residual")
        )[0]

    def backward(dout):
        _, cache = graph_conv_forward(
            xpd,
            inputs["x"],
            inputs["weight0"],
            inputs["weight1"],
            inputs["bias"],
            supports,
            relu,
            inputs.get("residual"),
        )
        dx, dw0, dw1, db, dres = graph_conv_backward(xpd, dout, cache)
        grads = {"x": dx, "weight0": dw0, "weight1": dw1, "bias": db}
        if residual:
            grads["residual"] = dres
        return grads

    check_gradients(forward, backward, inputs, xpd)


def test_unpool_pair(xpd):
    from xmesh.model.graph import unpool_backward, unpool_forward

    rng = np.random.default_rng(12)
    pairs = xpd.asarray(np.array([[0, 1], [1, 2], [0, 2], [3, 1], [0, 1]]))
    inputs = on(xpd, {"x": rand(rng, 2, 4, 3)})

    def backward(dout):
        return {"x": unpool_backward(xpd, dout, pairs, 4)}

    check_gradients(lambda x: unpool_forward(xpd, x, pairs), backward, inputs, xpd)


def test_graph_conv_forward_is_inference():
    """The training forward (products before the unpooling's midpoints, as the original) equals the
    inference graph convolution (midpoints of the products) within float32 rounding."""
    from xmesh.model.graph import GraphSupports, graph_conv, graph_conv_forward, unpool_forward
    from xmesh.model.params import GraphConv

    be = get_backend("numpy")
    rng = np.random.default_rng(13)
    n = 9
    eye, s1, _ = random_supports(rng, n + 3)
    pairs = np.array([[0, 1], [4, 2], [8, 7]])
    x = rng.standard_normal((2, n, 6)).astype(np.float32)
    w0, w1 = (rng.standard_normal((6, 5)).astype(np.float32) for _ in range(2))
    b = rng.standard_normal(5).astype(np.float32)
    layer = GraphConv(np.concatenate([w0, w1], axis=1), b, 5, True)
    ours = graph_conv_forward(
        xp, unpool_forward(xp, x, pairs), w0, w1, b, GraphSupports.from_host(xp, (eye, s1), np.float32), True
    )[0]
    theirs = graph_conv(be, layer, x, (None, be.sparse(s1)), pool_idx=pairs)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


CAMERAS = np.array(
    [
        [[20.0, 25.0, 0.0, 0.8, 25.0], [150.0, 30.0, 0.0, 0.9, 25.0], [250.0, 20.0, 0.0, 0.85, 25.0]],
        [[40.0, 15.0, 0.0, 0.8, 25.0], [100.0, 35.0, 0.0, 0.7, 25.0], [300.0, 28.0, 0.0, 0.8, 25.0]],
    ]
)


def projection_inputs(rng, quirk, channels=(2, 3), xp_=xp):
    from xmesh.model.camera import packed_transforms
    from xmesh.model.projection import DeviceTransforms

    tf = DeviceTransforms.from_packed(xp_.asarray(packed_transforms(CAMERAS)), 3)
    views = 1 if quirk else 3
    coords = rng.standard_normal((2, 7, 3)) * 0.15 + np.array([0.0, 0.0, -0.8])
    maps = [rng.standard_normal((2 * views, s, s, c)) for s, c in zip((56, 28), channels, strict=True)]
    return tf, coords, maps


@pytest.mark.parametrize("quirk", [True, False])
def test_graph_projection_pair(xpd, quirk):
    from xmesh.model.projection import graph_projection_backward, graph_projection_forward

    rng = np.random.default_rng(21)
    tf, coords, maps = projection_inputs(rng, quirk, xp_=xpd)
    inputs = on(xpd, {"coords": coords, "map0": maps[0], "map1": maps[1], "carried": rng.standard_normal((2, 7, 4))})

    def forward(coords, map0, map1, carried):
        return graph_projection_forward(xpd, coords, [map0, map1], tf, quirk, carried)[0]

    def backward(dout):
        _, cache = graph_projection_forward(
            xpd, inputs["coords"], [inputs["map0"], inputs["map1"]], tf, quirk, inputs["carried"]
        )
        dcoords, dmaps, dcarried = graph_projection_backward(xpd, dout, cache)
        return {"coords": dcoords, "map0": dmaps[0], "map1": dmaps[1], "carried": dcarried}

    check_gradients(forward, backward, inputs, xpd)


def test_graph_projection_max_splits_ties():
    """Where views tie for the max (ReLU's zeros, or the quirk's views reading one cell), each of the
    tied views gets an equal share of the max's gradient, as TensorFlow's reduce_max gradient."""
    from xmesh.model.projection import graph_projection_backward, graph_projection_forward

    rng = np.random.default_rng(22)
    tf, coords, maps = projection_inputs(rng, True, channels=(1, 1))
    maps = [np.zeros_like(m) for m in maps]
    out, cache = graph_projection_forward(xp, coords, maps, tf, True)
    width = 2
    dout = np.zeros_like(out)
    dout[..., 3 : 3 + width] = 1.0  # the gradient of the max alone
    _, dmaps, _ = graph_projection_backward(xp, dout, cache)
    # every view ties at 0: each view's cell gets a third of each vertex's gradient
    for m, dmap in enumerate(dmaps):
        expected = np.zeros(dmap.size)
        for view in range(3):
            np.add.at(expected, cache.indices[view][m], 1.0 / 3.0)
        np.testing.assert_allclose(dmap.reshape(-1), expected, rtol=1e-12)
        assert len(np.unique(np.concatenate([cache.indices[v][m] for v in range(3)]))) > 7  # views read apart


def test_graph_projection_forward_is_inference():
    from xmesh.model.projection import graph_projection, graph_projection_forward

    rng = np.random.default_rng(23)
    tf, coords, maps = projection_inputs(rng, True)
    coords, maps = coords.astype(np.float32), [m.astype(np.float32) for m in maps]
    ours = graph_projection_forward(xp, coords, maps, tf, True)[0]
    theirs = graph_projection(get_backend("numpy"), coords, maps, tf, True)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)


def test_a_padded_map_is_the_map_with_a_zero_row_and_column(xpd):
    """stage 2's pad_map: the map copied as it is, and the appended row and column zero (only they are
    zeroed; a freed array's leftover values beforehand must not show)."""
    from xmesh.train import stage2

    rng = np.random.default_rng(8)
    fmap = xpd.asarray(rng.standard_normal((2, 5, 5, 3)))
    leftover = xpd.full((2, 6, 6, 3), 7.0, dtype=fmap.dtype)
    del leftover
    out = host(stage2.pad_map(xpd, fmap))
    assert out.shape == (2, 6, 6, 3)
    assert np.array_equal(out[:, :5, :5, :], host(fmap))
    assert not out[:, 5, :, :].any() and not out[:, :, 5, :].any()
