"""Model building blocks against independent references (float64 NumPy written here from MODEL.md)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from tolerance import assert_mostly_within
from xmesh.backends import get_backend
from xmesh.backends.numpy_backend import same_padding
from xmesh.model import deformation, graph, projection
from xmesh.model.params import GraphConv
from xmesh.model.projection import DeviceTransforms
from xmesh.ops import ReferenceOnly


@pytest.fixture(scope="module")
def be():
    return get_backend("numpy")


def conv_reference(x, w, b, stride):
    """Direct float64 'SAME' convolution with TF's padding rule, written from the definition."""
    n, h, wd, cin = x.shape
    kh, kw, _, cout = w.shape
    ho, top, _ = same_padding(h, kh, stride)
    wo, left, _ = same_padding(wd, kw, stride)
    out = np.zeros((n, ho, wo, cout))
    for i in range(ho):
        for j in range(wo):
            for di in range(kh):
                for dj in range(kw):
                    r, c = i * stride + di - top, j * stride + dj - left
                    if 0 <= r < h and 0 <= c < wd:
                        out[:, i, j, :] += x[:, r, c, :].astype(np.float64) @ w[di, dj].astype(np.float64)
    return np.maximum(out + b, 0.0)


@pytest.mark.parametrize("size,kernel,stride", [(9, 3, 1), (9, 3, 2), (10, 3, 2), (11, 5, 2), (7, 5, 1), (14, 5, 2)])
def test_conv2d_same_matches_direct_definition(be, size, kernel, stride):
    rng = np.random.default_rng(size * 100 + kernel * 10 + stride)
    x = rng.standard_normal((2, size, size, 4)).astype(np.float32)
    w = rng.standard_normal((kernel, kernel, 4, 6)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    got = be.conv2d_same(x, w, b, stride)
    ref = conv_reference(x, w, b, stride)
    assert got.shape == ref.shape == (2, -(-size // stride), -(-size // stride), 6)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_same_padding_puts_the_extra_row_after():
    assert same_padding(224, 3, 2) == (112, 0, 1)
    assert same_padding(28, 5, 2) == (14, 1, 2)
    assert same_padding(224, 3, 1) == (224, 1, 1)


def test_graph_conv_and_unpool_against_dense_reference(be):
    rng = np.random.default_rng(0)
    n, cin, cout = 30, 8, 5
    s1 = sp.random(n, n, density=0.2, random_state=1, dtype=np.float32)
    s1 = (s1 + s1.T).tocsr()
    x = rng.standard_normal((2, n, cin)).astype(np.float32)
    w0, w1 = rng.standard_normal((cin, cout)).astype(np.float32), rng.standard_normal((cin, cout)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    layer = GraphConv(np.concatenate([w0, w1], 1), bias, cout, relu=True)
    got = graph.graph_conv(be, layer, x, (None, be.sparse(s1)))
    dense = s1.toarray().astype(np.float64)
    ref = np.maximum(x @ w0.astype(np.float64) + dense @ (x.astype(np.float64) @ w1) + bias, 0)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    # the residual layers' step (h + a[-2]) / 2
    residual = rng.standard_normal((2, n, cout)).astype(np.float32)
    got_res = graph.graph_conv(be, layer, x, (None, be.sparse(s1)), residual)
    np.testing.assert_allclose(got_res, (ref + residual) / 2, rtol=1e-5, atol=1e-5)
    # a non-identity support 0 takes the unfused path
    s0 = sp.identity(n, format="csr", dtype=np.float32) * 2
    layer0 = GraphConv(w1, bias, cout, relu=False, weight0=w0)
    got0 = graph.graph_conv(be, layer0, x, (be.sparse(s0), be.sparse(s1)))
    np.testing.assert_allclose(got0, 2 * (x @ w0) + dense @ (x @ w1) + bias, rtol=1e-5, atol=1e-5)
    pool = np.array([[0, 3], [5, 7]])
    up = graph.unpool(be, x, pool)
    assert up.shape == (2, n + 2, cin)
    np.testing.assert_array_equal(up[:, n], (x[:, 0] + x[:, 3]) * 0.5)


def unpool_reference(x, pool):
    """float64 unpooling written from MODEL.md: x followed by the midpoints (x_u + x_v) / 2."""
    x = np.asarray(x, np.float64)
    return np.concatenate([x, (x[:, pool[:, 0]] + x[:, pool[:, 1]]) / 2], axis=1)


@pytest.mark.parametrize("fused", [True, False])
def test_graph_conv_after_a_deferred_unpooling_is_the_layer_on_the_unpooled_input(be, fused):
    """graph_conv(x, pool_idx) runs the product on x's rows and unpools its output; that must be
    the layer applied to unpool(x) (the original's order), here in float64."""
    rng = np.random.default_rng(3)
    n_old, cin, cout = 24, 11, 6
    pool = np.array(sorted({tuple(sorted(rng.choice(n_old, 2, replace=False))) for _ in range(40)}), dtype=np.int64)
    n = n_old + len(pool)
    s1 = sp.random(n, n, density=0.15, random_state=2, dtype=np.float32)
    s1 = (s1 + s1.T).tocsr()
    x = rng.standard_normal((2, n_old, cin)).astype(np.float32)
    w0, w1 = rng.standard_normal((cin, cout)).astype(np.float32), rng.standard_normal((cin, cout)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    up = unpool_reference(x, pool)
    dense = s1.toarray().astype(np.float64)
    if fused:
        layer, supports, s0 = (
            GraphConv(np.concatenate([w0, w1], 1), bias, cout, relu=True),
            (None, be.sparse(s1)),
            np.eye(n),
        )
    else:
        s0m = sp.random(n, n, density=0.1, random_state=4, dtype=np.float32).tocsr()
        layer, supports, s0 = (
            GraphConv(w1, bias, cout, relu=True, weight0=w0),
            (be.sparse(s0m), be.sparse(s1)),
            s0m.toarray(),
        )
    ref = np.maximum(s0 @ (up @ w0.astype(np.float64)) + dense @ (up @ w1.astype(np.float64)) + bias, 0)
    got = graph.graph_conv(be, layer, x, supports, pool_idx=be.asarray(pool, dtype=np.int64))
    assert got.shape == (2, n, cout)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    # and the original order (unpool first, then the layer) agrees with it to float32 rounding
    first = graph.graph_conv(be, layer, graph.unpool(be, x, be.asarray(pool, dtype=np.int64)), supports)
    np.testing.assert_allclose(got, first, rtol=1e-5, atol=1e-5)


def test_only_the_unpoolings_before_a_plain_graph_convolution_are_deferred():
    from xmesh.model import architecture as arch

    assert [i for i in range(arch.NUM_STAGE1_LAYERS) if arch.unpool_commutes_with_next(i)] == [16, 32]
    assert not arch.unpool_commutes_with_next(15) and not arch.unpool_commutes_with_next(17)


def random_cameras(rng, batch):
    rows = np.zeros((batch, 3, 5), np.float32)
    rows[..., 0] = rng.uniform(0, 360, (batch, 3))
    rows[..., 1] = rng.uniform(20, 35, (batch, 3))
    rows[..., 3] = rng.uniform(0.6, 0.9, (batch, 3))
    rows[..., 4] = 25
    return rows


def bilinear_reference(fmap, x, y):
    """MODEL.md's rule, float64: zero weights at integer coordinates, index == size reads 0."""
    s = fmap.shape[0]
    x1, x2, y1, y2 = np.floor(x), np.ceil(x), np.floor(y), np.ceil(y)

    def at(i, j):
        return fmap[int(i), int(j)] if i < s and j < s else np.zeros(fmap.shape[-1])

    return (
        at(x1, y1) * (x2 - x) * (y2 - y)
        + at(x2, y1) * (x - x1) * (y2 - y)
        + at(x1, y2) * (x2 - x) * (y - y1)
        + at(x2, y2) * (x - x1) * (y - y1)
    )


def test_local_projection_generic_fast_path_and_reference_agree(be):
    rng = np.random.default_rng(3)
    batch, n = 2, 60
    cams = random_cameras(rng, batch)
    tf = DeviceTransforms.from_cameras(be, cams)
    points = rng.uniform(-0.25, 0.25, (batch, n, 3)).astype(np.float32)
    points[..., 2] -= 0.8
    points[:, :3] = [0.0, 0.0, -0.8]  # the optical axis of view 0: integer pixel 112 there
    points[:, 3] = [5.0, 5.0, -0.8]  # far off-image: clamped to 223 / 0
    maps = [rng.random((batch * 3, s, s, c), dtype=np.float32) for s, c in ((224, 4), (112, 3), (56, 2))]
    padded = projection.pad_maps(be, maps)
    fast = be.op_local_projection(points, padded, tf)
    assert fast is not None
    # the array-API version, forced
    generic = projection.local_projection(get_backend("numpy", conv_chunk=1), points, padded, tf)
    # two code paths (compiled loop, array-API ops): the golden tolerance, per point's feature row
    assert_mostly_within(fast, generic)
    # an independent float64 reference of the sampling and pooling (pixels from the model's own camera code)
    for b in range(batch):
        per_view = []
        for v in range(3):
            h, w = projection._view_pixels(
                be.xp, points[b : b + 1], DeviceTransforms.from_cameras(be, cams[b : b + 1]), v
            )
            feats = []
            for fmap in maps:
                s = fmap.shape[1]
                feats.append(
                    np.stack(
                        [
                            bilinear_reference(
                                fmap[b * 3 + v].astype(np.float64), float(hh) * s / 224, float(ww) * s / 224
                            )
                            for hh, ww in zip(h[0], w[0])
                        ]
                    )
                )
            per_view.append(np.concatenate(feats, 1))
        st = np.stack(per_view)
        ref = np.concatenate([points[b], st.max(0), st.mean(0), np.sqrt(st.var(0) + 1e-6)], 1)
        np.testing.assert_allclose(fast[b], ref, rtol=2e-5, atol=2e-6)
    # the quirk: a sample exactly at an integer pixel reads 0 (view 0 axis point, all its map features)
    assert np.all(fast[:, 0, 3 : 3 + 9][:, :4] >= 0)


def test_integer_pixel_reads_zero(be):
    fmap = np.ones((1, 5, 5, 1), np.float32)
    padded = projection.pad_maps(be, [fmap])[0]
    assert padded.shape == (1, 6, 6, 1) and padded[0, 5, 5, 0] == 0
    assert bilinear_reference(np.ones((5, 5, 1)), 2.0, 3.0)[0] == 0.0
    assert bilinear_reference(np.ones((5, 5, 1)), 2.5, 3.0)[0] == 0.0
    assert bilinear_reference(np.ones((5, 5, 1)), 2.5, 3.25)[0] == pytest.approx(1.0)


def test_local_gconv_fast_path_equals_array_api_version(be):
    rng = np.random.default_rng(4)
    k, n, cin, cout = 43, 17, 12, 7
    x = rng.standard_normal((2, k, n, cin)).astype(np.float32)
    w = rng.standard_normal((cin, 2 * cout)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    cheb = rng.standard_normal((k, k)).astype(np.float32)
    layer = GraphConv(w, bias, cout, relu=True)
    fast = be.op_local_gconv(layer, x, cheb, None)
    generic = deformation.local_gconv(ReferenceOnly(be), layer, x, cheb)
    np.testing.assert_allclose(fast, generic, rtol=1e-5, atol=5e-5)  # values up to ~50: float32 rounding
    ref = np.maximum(
        x @ w[:, :cout].astype(np.float64)
        + np.einsum("ij,bjnc->binc", cheb, x @ w[:, cout:].astype(np.float64))
        + bias,
        0,
    )
    np.testing.assert_allclose(fast, ref, rtol=1e-4, atol=1e-4)


def test_graph_projection_view_quirk_switch(be):
    rng = np.random.default_rng(5)
    cams = random_cameras(rng, 1)
    tf = DeviceTransforms.from_cameras(be, cams)
    pts = np.array([[[0.02, -0.03, -0.8], [-0.05, 0.04, -0.75]]], np.float32)
    maps = []
    for s, c in ((56, 2), (28, 2), (14, 2), (7, 2)):
        m = np.zeros((3, s, s, c), np.float32)
        for v in range(3):
            m[v] = v + 1  # each view's maps hold its own index
        maps.append(m)
    quirk = projection.graph_projection(be, pts, maps, tf, view_quirk=True)
    own = projection.graph_projection(be, pts, maps, tf, view_quirk=False)
    width = 8
    assert quirk.shape == own.shape == (1, 2, 3 + 3 * width)
    np.testing.assert_array_equal(quirk[0, :, 3 : 3 + width], 1.0)  # max over views: all read view 0
    np.testing.assert_array_equal(own[0, :, 3 : 3 + width], 3.0)  # max over views 1,2,3
    np.testing.assert_allclose(own[0, :, 3 + width : 3 + 2 * width], 2.0)  # mean of 1,2,3
    np.testing.assert_allclose(own[0, :, 3 + 2 * width :], np.sqrt(2 / 3 + 1e-6), rtol=1e-6)
    np.testing.assert_array_equal(quirk[..., :3], pts)


def test_quirk_projection_reads_view0_maps_alone(be):
    """With the quirk every view samples view 0's maps, so maps of view 0 alone (B*1 images) give
    bit for bit what the maps of all views give; without the quirk all views are needed. Maps of
    any other count are refused with the counts named."""
    from xmesh.errors import InputError
    from xmesh.model import architecture as arch

    assert arch.stage1_views_read(3, True) == (0,) and arch.stage1_views_read(3, False) == (0, 1, 2)
    assert [arch.map_stride(t) for t in arch.STAGE1_TAPS] == [4, 8, 16, 32]
    assert arch.stage1_views_read(9, True) == (0, 1, 2)  # 9 views: view 8 // 4 = 2
    rng = np.random.default_rng(6)
    batch = 3
    cams = random_cameras(rng, batch)
    tf = DeviceTransforms.from_cameras(be, cams)
    pts = rng.uniform(-0.2, 0.2, (batch, 40, 3)).astype(np.float32)
    pts[..., 2] -= 0.8
    maps = [
        rng.standard_normal((batch * 3, s, s, c)).astype(np.float32) for s, c in ((56, 4), (28, 3), (14, 2), (7, 5))
    ]
    view0 = [m.reshape((batch, 3) + m.shape[1:])[:, 0] for m in maps]
    full = projection.graph_projection(be, pts, maps, tf, view_quirk=True)
    np.testing.assert_array_equal(projection.graph_projection(be, pts, view0, tf, view_quirk=True), full)
    with pytest.raises(InputError, match=r"maps of \[3\] images for 3 sample\(s\) of 3 views; expected 9$"):
        projection.graph_projection(be, pts, view0, tf, view_quirk=False)
    with pytest.raises(InputError, match="expected 9 or 3"):
        projection.graph_projection(be, pts, [m[:6] for m in maps], tf, view_quirk=True)


def test_stage1_runs_the_cnn_on_the_views_it_reads(be, monkeypatch):
    """Untraced, stage 1 sends only view 0 through its CNN (the quirk reads nothing else) and gives
    the coarse mesh the traced run gives with every view's maps; without the quirk all views go in."""
    from xmesh import Reconstructor
    from xmesh.io.weights import synthetic_weights
    from xmesh.model import network
    from xmesh.template_gen import generate_template

    rng = np.random.default_rng(8)
    images = rng.uniform(0, 1, (2, 3, 224, 224, 3)).astype(np.float32)
    cams = random_cameras(rng, 2)
    model = Reconstructor(synthetic_weights(3), template=generate_template(), backend=be)
    seen = []
    real_cnn = network.run_cnn
    monkeypatch.setattr(
        network, "run_cnn", lambda b, convs, x, taps: seen.append(x.shape[0]) or real_cnn(b, convs, x, taps)
    )
    flat = images.reshape(6, 224, 224, 3)
    tf = DeviceTransforms.from_cameras(be, cams)
    fast = network.run_stage1(be, model.stage1, flat, tf, view_quirk=True)
    traced = network.run_stage1(be, model.stage1, flat, tf, view_quirk=True, trace=network.Trace())
    assert seen == [2, 6]
    for a, b in zip(fast, traced):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(network.stage1_cnn_images(be, flat, 3, True), images[:, 0])
    assert network.stage1_cnn_images(be, flat, 3, False) is flat


def test_unknown_backend_is_rejected():
    from xmesh.errors import InputError

    with pytest.raises(InputError, match="numpy, cupy"):
        get_backend("torch")


def _frame_one_row(row):
    """MODEL.md's camera frame of one row, in numpy float32 scalars (the original's order)."""
    row = np.asarray(row, dtype=np.float32)
    pi = np.float32(np.pi)
    theta, phi, d = row[0] * pi / np.float32(180.0), row[1] * pi / np.float32(180.0), row[3]
    camy, lens = d * np.sin(phi), d * np.cos(phi)
    z = np.array([lens * np.cos(theta), camy, lens * np.sin(theta)], dtype=np.float32)
    y = np.array([camy * np.cos(theta + pi), lens, camy * np.sin(theta + pi)], dtype=np.float32)
    x = np.array([y[1] * z[2] - y[2] * z[1], y[2] * z[0] - y[0] * z[2], y[0] * z[1] - y[1] * z[0]], dtype=np.float32)
    axes = np.stack([v / np.sqrt(np.float32(v[0] * v[0] + v[1] * v[1]) + v[2] * v[2]) for v in (x, y, z)])
    return axes, z


def test_batched_camera_transforms_equal_the_row_by_row_float32_ones():
    """packed_transforms (all samples and views at once, as a graph replay uploads them) gives bit for
    bit the row-by-row float32 scalar arithmetic, over wide random ranges; DeviceTransforms' fields
    are views of its one packed array."""
    from xmesh.model.camera import packed_transforms

    rng = np.random.default_rng(11)
    cams = np.zeros((300, 3, 5), np.float32)
    cams[..., 0] = rng.uniform(-720, 720, cams.shape[:2])
    cams[..., 1] = rng.uniform(-89, 89, cams.shape[:2])
    cams[..., 3] = rng.uniform(0.1, 5, cams.shape[:2])
    got = packed_transforms(cams)
    for b in range(cams.shape[0]):
        frames = [_frame_one_row(row) for row in cams[b]]
        rot = np.stack([c.T for c, _ in frames])
        from0 = np.linalg.inv(rot[0].astype(np.float64)).astype(np.float32)
        want = np.concatenate([from0.ravel(), frames[0][1], rot.ravel(), np.stack([o for _, o in frames]).ravel()])
        np.testing.assert_array_equal(got[b].view(np.uint32), want.view(np.uint32))
    tf = DeviceTransforms.from_cameras(get_backend("numpy"), cams[:4])
    assert np.shares_memory(tf.rot, tf.packed) and np.shares_memory(tf.from0, tf.packed)
    np.testing.assert_array_equal(tf.rot[2, 1], got[2, 12 + 9 : 12 + 18].reshape(3, 3))
    np.testing.assert_array_equal(tf.origin[3], got[3, 39:48].reshape(3, 3))
