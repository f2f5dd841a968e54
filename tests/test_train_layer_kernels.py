"""The float32 training layers on CuPy's own kernels against float64 NumPy: the deformation layer in
the lent Hopper kernel (forward, and backward without the ReLU through A1^T), the backward's one-pass
mask, mixing and bias sums, the narrow score layer's weights' gradient in one pass over X, the local
projection's float4 atomics, and its one-pass pair against the taps and the pooling apart. Each
within float32's accuracy, a bound one TF32 product (about 1e-4) would miss."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import requires_cuda
from gradcheck import namespace
from test_train_drb import CAMERAS, block_inputs, hypothesis_points, layers_of, padded_maps, transforms
from xmesh.model import bilinear_cupy, deformation_train, epilogues_cupy, local_projection_train, products

pytestmark = [requires_cuda, pytest.mark.gpu]

K = 43  # the template's hypotheses: the Hopper layer kernel's tile holds whole groups of them


def relative_error(ours, exact) -> float:
    ours = ours.get() if hasattr(ours, "get") else np.asarray(ours)
    return float(np.linalg.norm(ours.astype(np.float64) - exact) / np.linalg.norm(exact))


def sparse_support(rng) -> np.ndarray:
    """A (43, 43) support with about the template's share of nonzeros (367 of 1849)."""
    a1 = rng.standard_normal((K, K)) * 0.3
    a1[rng.random((K, K)) > 0.2] = 0.0
    return a1


@pytest.fixture
def lent_layers():
    """The CuPy backend's lent layer kernel, each call's output recorded (None: not taken)."""
    from xmesh.backends import get_backend

    get_backend("cupy")  # lends its kernels
    lent = products.lend_layer(None)
    calls = []

    def recording(*args, **options):
        out = lent(*args, **options)
        calls.append(out is not None)
        return out

    products.lend_layer(recording)
    yield calls
    products.lend_layer(lent)


@pytest.mark.parametrize("cin, cout", [(339, 192), (192, 192), (192, 339)])
@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("residual", [False, True])
def test_the_lent_deformation_layer_keeps_float32_accuracy(lent_layers, cin, cout, relu, residual):
    """The forward's form (the ReLU, A1) and the input gradient's (no ReLU, A1^T), with a residual added
    last where given (a skip connection's gradient, in the backward); X's rows padded to a multiple of 4
    floats as the projection's. A residual of a width that is not a multiple of 32 is declined."""
    import cupy

    rng = np.random.default_rng(cin + cout + relu + 2 * residual)
    b, n = 2, 37
    x = rng.standard_normal((b, K, n, cin))
    w0, w1 = (rng.standard_normal((cin, cout)) / np.sqrt(cin) for _ in range(2))
    bias = rng.standard_normal(cout) * 0.3
    a1 = sparse_support(rng)
    res = rng.standard_normal((b, K, n, cout)) if residual else None
    z = x @ w0 + np.einsum("ij,bjnc->binc", a1.T if not relu else a1, x @ w1) + bias
    exact = (np.maximum(z, 0.0) if relu else z) + (0.0 if res is None else res)
    rows = cupy.zeros((b, K, n, -(-cin // 4) * 4), dtype=cupy.float32)
    rows[..., :cin] = cupy.asarray(x.astype(np.float32))
    f32 = [rows[..., :cin]] + [cupy.asarray(v.astype(np.float32)) for v in (w0, w1, bias)]
    support = cupy.asarray(a1.astype(np.float32))
    plus = None if res is None else cupy.asarray(res.astype(np.float32))
    ours = products.deformation_layer(*f32, support, relu=relu, support_transposed=not relu, residual=plus)
    if residual and cout % 32:
        assert lent_layers == [False] and ours is None
        return
    assert lent_layers == [True] and ours.shape == (b, K, n, cout)
    error = relative_error(ours, exact)
    print(f"cin {cin} cout {cout} relu {relu} residual {residual}: relative error {error:.2e}")
    assert error < 1e-5


@pytest.mark.parametrize("cin", [339, 192])
def test_the_lent_layer_keeps_the_relu_output_beside_the_skip_connection_s_sum(lent_layers, cin):
    """The training forward's skip connection in the kernel's one pass: relu(...) + residual for the next
    layer and relu(...) itself for the backward's mask, both against float64."""
    import cupy

    rng = np.random.default_rng(cin)
    b, n, cout = 2, 37, 192
    x = rng.standard_normal((b, K, n, cin))
    w0, w1 = (rng.standard_normal((cin, cout)) / np.sqrt(cin) for _ in range(2))
    bias = rng.standard_normal(cout) * 0.3
    a1 = sparse_support(rng)
    res = rng.standard_normal((b, K, n, cout))
    relu = np.maximum(x @ w0 + np.einsum("ij,bjnc->binc", a1, x @ w1) + bias, 0.0)
    f32 = [cupy.asarray(v.astype(np.float32)) for v in (x, w0, w1, bias, a1, res)]
    out, activation = products.deformation_layer(*f32[:5], residual=f32[5], keep_activation=True)
    assert lent_layers == [True]
    errors = relative_error(out, relu + res), relative_error(activation, relu)
    print(f"cin {cin}: relative errors {errors[0]:.2e} (the sum), {errors[1]:.2e} (the ReLU output)")
    assert max(errors) < 1e-5


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("cin, cout", [(339, 192), (192, 192), (192, 1)])
def test_the_local_gconv_pair_on_cupy_float32_is_the_float64_one(lent_layers, residual, cin, cout):
    """Forward and backward of one layer: float32 on CuPy (the lent kernel for the wide layers, the
    one-pass mask and mixing) against the array-API code in float64 on NumPy."""
    rng = np.random.default_rng(7 * cin + cout + residual)
    b, n = 2, 29
    values = {
        "x": np.maximum(rng.standard_normal((b, K, n, cin)), 0.0),
        "w0": rng.standard_normal((cin, cout)) / np.sqrt(cin),
        "w1": rng.standard_normal((cin, cout)) / np.sqrt(cin),
        "bias": rng.standard_normal(cout) * 0.1,
        "dout": rng.standard_normal((b, K, n, cout)),
    }
    if residual:  # a skip connection: its output's residual forward, its input's gradient's ``plus`` backward
        values["res"] = rng.standard_normal((b, K, n, cout))
        values["plus"] = rng.standard_normal((b, K, n, cin))
    a1 = sparse_support(rng)
    # where the pre-activation is within float32's rounding of 0 the two precisions' masks may differ:
    # no gradient comes from there (one flipped element moves dx by ~1e-3 of its norm)
    z = values["x"] @ values["w0"] + np.einsum("ij,bjnc->binc", a1, values["x"] @ values["w1"]) + values["bias"]
    values["dout"][np.abs(z) < 1e-4] = 0.0

    def run(xp, dtype):
        v = {key: xp.asarray(value.astype(dtype)) for key, value in values.items()}
        supports = (None, xp.asarray(a1.astype(dtype)))
        layer = (v["w0"], v["w1"], v["bias"])
        out, cache = deformation_train.local_gconv_forward(xp, layer, v["x"], supports, v.get("res"))
        dx, grads = deformation_train.local_gconv_backward(xp, v["dout"], cache, plus=v.get("plus"))
        return {"out": out, "dx": dx, "dw0": grads[0], "dw1": grads[1], "db": grads[2]}

    exact = run(namespace("numpy"), np.float64)
    ours = run(namespace("cupy"), np.float32)
    wide = cout % 32 == 0
    # the forward (with a residual: the kernel asked to add it and keep the ReLU output, then, where it
    # declines, to run without it), then the input's gradient (a plus of a width not a multiple of 32 declined)
    forward = [wide] if wide or not residual else [False, False]
    assert lent_layers == forward + [wide and not (residual and cin % 32)]
    for key, value in exact.items():
        error = relative_error(ours[key], value)
        print(f"{key}: {error:.2e}")
        assert error < 1e-5, key


def test_the_float4_backward_is_the_warp_per_row_one(monkeypatch):
    """The local projection's backward on CuPy in float32 with 16-byte atomics over the 16-, 32- and
    64-channel maps against the warp-per-row kernel (float64-checked in test_train_drb.py) on the same
    float32 taps: only the order of the sums differs."""
    import array_api_compat.cupy as xp

    rng = np.random.default_rng(5)
    b, n = 2, 600
    sizes = [(224, 16), (112, 32), (56, 64)]
    points = xp.asarray(hypothesis_points(rng, b, n, outside=3).astype(np.float32))
    maps = [xp.asarray(np.abs(m).astype(np.float32)) for m in padded_maps(rng, b, len(CAMERAS), sizes)]
    width = 3 + 3 * sum(c for _, c in sizes)
    dfeats = xp.asarray(rng.standard_normal((b, n, width)).astype(np.float32))
    tf = transforms(b, xp, np.float32)
    monkeypatch.setattr(local_projection_train, "ONE_PASS_ON_CUPY", False)  # the taps and the pooling apart

    def run(float4: bool):
        monkeypatch.setattr(bilinear_cupy, "FLOAT4_BACKWARD", float4)
        _, cache = local_projection_train.local_projection_forward(xp, points, maps, tf)
        dpoints, dmaps = local_projection_train.local_projection_backward(xp, dfeats, cache)
        return [dpoints.astype(np.float64).get()] + [m.astype(np.float64).get() for m in dmaps]

    for i, (ours, theirs) in enumerate(zip(run(True), run(False), strict=True)):
        error = relative_error(ours, theirs)
        print(f"{'points' if i == 0 else f'map {i - 1}'}: {error:.2e}")
        assert error < 1e-6


@pytest.mark.parametrize("window", [1024, 8192])
def test_the_grouped_backward_is_the_float4_one(monkeypatch, window):
    """The grouped kernel (each vertex's 43 hypotheses' shares summed in shared memory before the maps)
    against the float4 kernel on the same float32 taps, over all three maps; a window of 1024 floats
    sends most groups to the global atomics, one of 8192 keeps the 56-cell map's in shared memory."""
    import array_api_compat.cupy as xp

    from xmesh.benchmarking import default_template

    rng = np.random.default_rng(7)
    b, vertices = 2, 300
    offsets = np.asarray(default_template()[0].sample_coord, dtype=np.float64)  # (43, 3), radius 0.05
    centers = hypothesis_points(rng, b, vertices, outside=2)
    points = (centers[:, None] + offsets[None, :, None]).reshape(b, -1, 3)  # hypothesis-major rows
    sizes = [(224, 16), (112, 32), (56, 64)]
    maps = [xp.asarray(m.astype(np.float32)) for m in padded_maps(rng, b, len(CAMERAS), sizes)]
    width = 3 + 3 * sum(c for _, c in sizes)
    dfeats = xp.asarray(rng.standard_normal((b, points.shape[1], width)).astype(np.float32))
    tf = transforms(b, xp, np.float32)
    monkeypatch.setattr(bilinear_cupy, "GROUP_WINDOW_FLOATS", window)
    monkeypatch.setattr(bilinear_cupy, "GROUP_MIN_CHANNELS", 16)
    monkeypatch.setattr(local_projection_train, "ONE_PASS_ON_CUPY", False)

    def run(grouped: bool):
        monkeypatch.setattr(bilinear_cupy, "GROUPED_BACKWARD", grouped)
        _, cache = local_projection_train.local_projection_forward(xp, xp.asarray(points.astype(np.float32)), maps, tf)
        dpoints, dmaps = local_projection_train.local_projection_backward(xp, dfeats, cache, groups=vertices)
        return [dpoints.astype(np.float64).get()] + [m.astype(np.float64).get() for m in dmaps]

    for i, (ours, theirs) in enumerate(zip(run(True), run(False), strict=True)):
        error = relative_error(ours, theirs)
        print(f"window {window}, {'points' if i == 0 else f'map {i - 1}'}: {error:.2e}")
        assert error < 1e-6


def test_the_one_pass_backward_adds_its_shares_into_the_given_gradients():
    """The one-pass backward given the maps' gradients of the block after (``plus``) adds its shares into
    those arrays and returns them: their values before plus its own gradients, within float32's
    rounding of the sums (the atomics' order), and the points' gradient as without them."""
    import array_api_compat.cupy as xp

    from xmesh.benchmarking import default_template

    rng = np.random.default_rng(13)
    b, vertices = 2, 300
    offsets = np.asarray(default_template()[0].sample_coord, dtype=np.float64)
    centers = hypothesis_points(rng, b, vertices, outside=2)
    points = xp.asarray((centers[:, None] + offsets[None, :, None]).reshape(b, -1, 3).astype(np.float32))
    sizes = [(224, 16), (112, 32), (56, 64)]
    maps = [xp.asarray(np.maximum(m, 0.0).astype(np.float32)) for m in padded_maps(rng, b, len(CAMERAS), sizes)]
    width = 3 + 3 * sum(c for _, c in sizes)
    dfeats = xp.asarray(rng.standard_normal((b, points.shape[1], width)).astype(np.float32))
    _, cache = local_projection_train.local_projection_forward(
        xp, points, maps, transforms(b, xp, np.float32), groups=vertices
    )
    assert cache.features is not None
    dpoints, dmaps = local_projection_train.local_projection_backward(xp, dfeats, cache, groups=vertices)
    plus = [xp.asarray(rng.standard_normal(m.shape).astype(np.float32)) for m in maps]
    expected = [d.astype(np.float64).get() + p.astype(np.float64).get() for d, p in zip(dmaps, plus, strict=True)]
    again, summed = local_projection_train.local_projection_backward(xp, dfeats, cache, groups=vertices, plus=plus)
    assert all(ours is given for ours, given in zip(summed, plus, strict=True))
    assert relative_error(again, dpoints.astype(np.float64).get()) < 1e-6
    for ours, exact in zip(summed, expected, strict=True):
        assert relative_error(ours, exact) < 1e-6


@pytest.mark.parametrize("dfeats_row", [339, 352])
def test_the_one_pass_projection_pair_is_the_taps_and_the_pooling(monkeypatch, dfeats_row):
    """local_projection_cupy's two kernels against the taps and the pooling each in its own launches on
    the same float32 inputs (the training step's 43 hypotheses a vertex, points past the image's edge,
    ReLU maps whose zeros tie across views), and against NumPy's float32 array-API code for the
    features. The features' gradient comes in rows of 339 floats (the backward reads them a float at a
    time) or of 352 (16-byte aligned, as the first layer's input gradient gives them: 16-byte loads)."""
    import array_api_compat.cupy as xp
    import array_api_compat.numpy as xnp

    from xmesh.benchmarking import default_template

    rng = np.random.default_rng(11)
    b, vertices = 2, 300
    offsets = np.asarray(default_template()[0].sample_coord, dtype=np.float64)
    centers = hypothesis_points(rng, b, vertices, outside=3)
    host_points = (centers[:, None] + offsets[None, :, None]).reshape(b, -1, 3).astype(np.float32)
    sizes = [(224, 16), (112, 32), (56, 64)]
    host_maps = [np.maximum(m, 0.0).astype(np.float32) for m in padded_maps(rng, b, len(CAMERAS), sizes)]
    maps = [xp.asarray(m) for m in host_maps]
    points = xp.asarray(host_points)
    width = 3 + 3 * sum(c for _, c in sizes)
    dfeats = xp.zeros((b, host_points.shape[1], dfeats_row), dtype=xp.float32)[..., :width]
    dfeats[...] = xp.asarray(rng.standard_normal((b, host_points.shape[1], width)).astype(np.float32))
    tf = transforms(b, xp, np.float32)

    def run(one_pass: bool):
        monkeypatch.setattr(local_projection_train, "ONE_PASS_ON_CUPY", one_pass)
        feats, cache = local_projection_train.local_projection_forward(xp, points, maps, tf, groups=vertices)
        assert (cache.features is not None) == one_pass
        dpoints, dmaps = local_projection_train.local_projection_backward(xp, dfeats, cache, groups=vertices)
        return [x.astype(np.float64).get() for x in [feats, dpoints, *dmaps]]

    ours, theirs = run(True), run(False)
    numpy_feats = local_projection_train.local_projection_forward(
        xnp, host_points, host_maps, transforms(b, xnp, np.float32)
    )[0]
    for name, a, c in zip(["features", "points", "map 0", "map 1", "map 2"], ours, theirs, strict=True):
        error = relative_error(a, c)
        print(f"{name}: {error:.2e}")
        assert error < 1e-6, name
    assert relative_error(ours[0], numpy_feats.astype(np.float64)) < 1e-6
    assert np.abs(ours[1]).max() > 0 and all(np.abs(m).max() > 0 for m in ours[2:])


@pytest.mark.parametrize("bn", [128, 96, 64])
@pytest.mark.parametrize(
    "k, m, n, row",
    [
        (43 * 29 * 2, 339, 384, 340),  # a block's first layer: X's rows padded to 340 floats, 2 splits
        (43 * 2466, 192, 384, 192),  # a 192-wide layer at batch 1: many splits, K not a multiple of 32
        (77, 20, 128, 24),  # one split, tails in every direction
    ],
)
def test_the_hopper_weight_gradient_keeps_float32_accuracy(bn, k, m, n, row):
    """wgmma_wgrad.cu's at^T b, both operands K-outermost, against float64 and tc_gemm.cu's kernel."""
    import cupy

    from xmesh.backends import get_backend

    backend = get_backend("cupy")
    if backend.hopper is None:
        pytest.skip("the wgmma kernels need compute capability 9.0")
    rng = np.random.default_rng(k + m)
    x = np.maximum(rng.standard_normal((k, m)), 0.0)
    g = rng.standard_normal((k, n)) * 1e-3
    rows = cupy.zeros((k, row), dtype=cupy.float32)
    rows[:, :m] = cupy.asarray(x.astype(np.float32))
    at, b = rows[:, :m], cupy.asarray(g.astype(np.float32))
    assert backend.hopper.takes_transposed(at, b)
    exact = x.astype(np.float32).astype(np.float64).T @ g.astype(np.float32).astype(np.float64)
    ours = backend.hopper.transposed_product(at, b, bn)
    error = relative_error(ours, exact)
    mma_sync = relative_error(backend.gemm_transposed_a(at, b, wgmma=False), exact)
    print(f"K {k}, {m} x {n}, tiles {bn} wide: relative error {error:.2e} (tc_gemm {mma_sync:.2e})")
    assert ours.shape == (m, n) and error < 2e-6 and error < 3 * mma_sync + 1e-7


@pytest.mark.parametrize(
    "cin, row, cout, n, residual",
    [
        (192, 192, 192, 400, True),  # many tiles a block: the next tile's first slice loaded during this one's last
        (192, 196, 192, 150, False),  # whole K slices loaded unchecked, with vertices past N in the last tile
        (70, 72, 339, 90, True),  # a K tail, and 11 column tiles (the blocks a multiple of them)
        (70, 70, 64, 90, True),  # rows not 16-byte aligned: single-float loads
        (70, 70, 64, 90, False),  # the same without a residual: lean, not streamed (its tensor map)
        (339, 340, 192, 150, False),  # the block's first layer: held beside the lean staging
    ],
)
def test_the_layer_kernel_holding_the_weight_is_the_one_streaming_it(cin, row, cout, n, residual):
    """The training's layer kernel with an interleaved weight (B held in shared memory, A read straight
    into registers) against the same kernel streaming both through its ring, and both against float64:
    the forward with its ReLU output kept (a 339-wide weight, held only without a residual, beside the
    lean staging), and the input gradient carried through the ReLU before."""
    import cupy

    from xmesh.backends import get_backend
    from xmesh.backends.cupy_backend.hopper import mixing_source

    hopper = get_backend("cupy").hopper
    if hopper is None:
        pytest.skip("the wgmma kernels need compute capability 9.0")
    rng = np.random.default_rng(cin + cout + n)
    x = np.maximum(rng.standard_normal((1, K, n, cin)), 0.0)
    w0, w1 = (rng.standard_normal((cin, cout)) / np.sqrt(cin) for _ in range(2))
    bias = rng.standard_normal(cout) * 0.3
    a1 = sparse_support(rng)
    width = -(-cout // 32) * 32
    res = rng.standard_normal((1, K, n, width)) if residual else np.zeros((1, K, n, width))
    relu = np.maximum(x @ w0 + np.einsum("ij,bjnc->binc", a1, x @ w1) + bias, 0.0)
    rows = cupy.zeros((1, K, n, row), dtype=cupy.float32)
    rows[..., :cin] = cupy.asarray(x.astype(np.float32))
    f32 = [cupy.asarray(v.astype(np.float32)) for v in (w0, w1, a1, res)]
    full_bias = cupy.zeros(width, dtype=cupy.float32)
    full_bias[:cout] = cupy.asarray(bias.astype(np.float32))
    assert hopper.holds_weight(cin, width, residual=residual)
    assert hopper.holds_weight(cin, width) == (cin < 339)
    outs = []
    for interleaved in (True, False):
        weight = hopper.prepare_pair(f32[0], f32[1], interleaved=interleaved)
        outs.append(
            hopper.drb_layer(
                rows[..., :cin],
                weight,
                f32[2],
                full_bias,
                f32[3] if residual else None,
                mixing_source(a1.astype(np.float32)),
                keep_activation=True,
            )
        )
    (held, held_relu), (streamed, streamed_relu) = outs
    errors = relative_error(held_relu[..., :cout], relu), relative_error(held[..., :cout], relu + res[..., :cout])
    apart = relative_error(held, streamed.get().astype(np.float64)), relative_error(held_relu, streamed_relu.get())
    print(f"cin {cin} cout {cout}: float64 {errors[0]:.2e} {errors[1]:.2e}, streamed {apart[0]:.2e} {apart[1]:.2e}")
    assert max(errors) < 1e-5 and max(apart) < 1e-6

    if cout % 32 or cin % 32 or row % 4:
        return  # the carried input gradient takes whole column tiles (cout in, cin out) and 16-byte aligned rows
    dz = rng.standard_normal((1, K, n, cout))
    mask = cupy.asarray(np.maximum(rng.standard_normal((1, K, n, cin)), 0.0).astype(np.float32))
    dx = dz @ w0.T + np.einsum("ji,bjnc->binc", a1, dz @ w1.T)
    exact = np.where(mask.get() > 0, dx, 0.0)
    grads = []
    for interleaved in (True, False):
        weight = hopper.prepare_pair(f32[0].T, f32[1].T, interleaved=interleaved)
        rows_dz = cupy.asarray(dz.astype(np.float32))
        grads.append(hopper.drb_layer_gradient(rows_dz, weight, mask, None, mixing_source(a1.T.astype(np.float32))))
    error = relative_error(grads[0][0][..., :cin], exact)
    apart = relative_error(grads[0][0], grads[1][0].get().astype(np.float64))
    print(f"input gradient: float64 {error:.2e}, streamed {apart:.2e}")
    assert error < 1e-5 and apart < 1e-6


@pytest.mark.parametrize("keep", [False, True])
def test_the_streamed_forward_is_the_float64_one(keep):
    """A 192-wide forward without a residual holds its weight and takes X's K slices through three slots
    that a producer warpgroup fills (WG_DRB_STREAMED): each block runs about nine tiles here, so the slots
    wrap many times; with and without the ReLU output kept."""
    import cupy

    from xmesh.backends import get_backend
    from xmesh.backends.cupy_backend.hopper import mixing_source
    from xmesh.backends.cupy_backend.hopper.families import BLOCK_SMEM_LIMIT, DRB_LAYER

    hopper = get_backend("cupy").hopper
    if hopper is None:
        pytest.skip("the wgmma kernels need compute capability 9.0")
    assert DRB_LAYER.held_smem(192, streamed=True) <= BLOCK_SMEM_LIMIT  # the forward takes the streamed module
    rng = np.random.default_rng(19 + keep)
    b, n, c = 2, 401, 192
    x = np.maximum(rng.standard_normal((b, K, n, c)), 0.0)
    w0, w1 = (rng.standard_normal((c, c)) / np.sqrt(c) for _ in range(2))
    bias = rng.standard_normal(c) * 0.3
    a1 = sparse_support(rng)
    relu = np.maximum(x @ w0 + np.einsum("ij,bjnc->binc", a1, x @ w1) + bias, 0.0)
    f32 = [cupy.asarray(v.astype(np.float32)) for v in (x, w0, w1, a1, bias)]
    weight = hopper.prepare_pair(f32[1], f32[2], interleaved=True)
    mixing = mixing_source(a1.astype(np.float32))
    out = hopper.drb_layer(f32[0], weight, f32[3], f32[4], None, mixing, keep_activation=keep)
    if keep:
        out, activation = out
        assert activation is out
    error = relative_error(out, relu)
    print(f"streamed forward, keep {keep}: relative error {error:.2e}")
    assert out.shape == relu.shape and error < 1e-5


def test_the_lent_kernels_leave_numpy_arrays_to_numpy():
    """Once the CuPy backend lends its kernels, a NumPy training step in the same process still runs on
    NumPy: every lent product and the layer kernel decline arrays that are not CuPy's."""
    from xmesh.backends import get_backend

    get_backend("cupy")
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((256, 192)).astype(np.float32), rng.standard_normal((192, 384)).astype(np.float32)
    product = products.matmul(a, b)
    assert isinstance(product, np.ndarray) and np.allclose(product, a @ b, rtol=1e-5, atol=1e-5)
    transposed = products.matmul(a.T, rng.standard_normal((256, 128)).astype(np.float32))
    assert isinstance(transposed, np.ndarray)
    x = rng.standard_normal((1, K, 5, 192)).astype(np.float32)
    w = rng.standard_normal((192, 192)).astype(np.float32)
    assert products.deformation_layer(x, w, w, np.zeros(192, np.float32), np.eye(K, dtype=np.float32)) is None


@pytest.mark.parametrize("cin", [192, 339])
@pytest.mark.parametrize("residual, keep", [(False, False), (True, False), (True, True)])
def test_the_input_gradient_carried_through_the_relu_before_is_the_float64_one(lent_layers, cin, residual, keep):
    """products.layer_input_gradient: dX = dZ W0^T + A1^T (dZ W1^T) (+ a skip connection's gradient), then
    dX' = dX where the layer before's ReLU output is positive, [dX' | A1^T dX'] and dX''s sums over the
    hypotheses, in the layer kernel's pass; dX itself only when kept. An input width that is not a
    multiple of 32 is declined."""
    import cupy

    rng = np.random.default_rng(cin + 2 * residual + keep)
    b, n, cout = 2, 23, 192
    dz = rng.standard_normal((b, K, n, cout))
    w0, w1 = (rng.standard_normal((cin, cout)) / np.sqrt(cout) for _ in range(2))
    a1 = sparse_support(rng)
    mask = np.maximum(rng.standard_normal((b, K, n, cin)), 0.0).astype(np.float32)
    res = rng.standard_normal((b, K, n, cin)) if residual else None
    dx = dz @ w0.T + np.einsum("ji,bjnc->binc", a1, dz @ w1.T) + (0.0 if res is None else res)
    masked = np.where(mask > 0, dx, 0.0)
    exact = {"dz": masked, "mixed": np.einsum("ji,bjnc->binc", a1, masked), "sums": masked.sum(axis=1), "dx": dx}
    rows = cupy.zeros((b, K, n, 2 * cout), dtype=cupy.float32)  # dZ as the backward holds it: dy's first half
    rows[..., :cout] = cupy.asarray(dz.astype(np.float32))
    f32 = [cupy.asarray(v.astype(np.float32)) for v in (w0, w1, a1, mask)]
    plus = None if res is None else cupy.asarray(res.astype(np.float32))
    got = products.layer_input_gradient(rows[..., :cout], *f32, residual=plus, keep=keep)
    if cin % 32:
        assert lent_layers == [False] and got is None
        return
    assert lent_layers == [True]
    dy, sums, kept = got
    ours = {"dz": dy[..., :cin], "mixed": dy[..., cin:], "sums": sums, "dx": kept}
    if not keep:
        assert kept is None
        del ours["dx"], exact["dx"]
    for key, value in exact.items():
        error = relative_error(ours[key], value)
        print(f"{key}: {error:.2e}")
        assert error < 1e-5, key


def test_a_block_backward_with_the_carried_gradients_is_the_one_without(monkeypatch):
    """deformation_block_backward on CuPy in float32 with K = 43 and 64-wide layers: of the input
    gradients that follow a ReLU, the score layer's is made in the mixing pass of the layer before
    (relu_gradient_mixed_of_product) and the other four are carried through it in the layer kernel (two
    keep dX for the skip connections); every gradient is the one the separate product and one-pass
    backward give, same forward."""
    import cupy

    rng = np.random.default_rng(12)
    inputs = block_inputs(rng, 2, 6, K, [(8, 6), (4, 6)], hidden=64)  # 39 inputs: the first layer in the kernel
    values = {key: cupy.asarray(value.astype(np.float32)) for key, value in inputs.items()}
    offsets = cupy.asarray((rng.standard_normal((K, 3)) * 0.02).astype(np.float32))
    supports = (None, cupy.asarray(sparse_support(rng).astype(np.float32)))
    xp = namespace("cupy")
    maps = [values["map0"], values["map1"]]
    _, cache = deformation_train.deformation_block_forward(
        xp, layers_of(values), supports, offsets, values["centers"], maps, transforms(2, xp, np.float32)
    )
    dnew = cupy.asarray(rng.standard_normal((2, 6, 3)).astype(np.float32))
    carried = []
    lent = deformation_train.layer_input_gradient

    def recording(*args, **options):
        out = lent(*args, **options)
        carried.append(None if out is None else out[2] is not None)
        return out

    monkeypatch.setattr(deformation_train, "layer_input_gradient", recording)
    with_carried = deformation_train.deformation_block_backward(xp, dnew, cache)
    assert carried == [False, True, False, False]
    monkeypatch.setattr(deformation_train, "layer_input_gradient", lambda *args, **options: None)
    monkeypatch.setattr(epilogues_cupy, "NARROW_MAX", 0)
    without = deformation_train.deformation_block_backward(xp, dnew, cache)
    pairs = [(with_carried[0], without[0])] + list(zip(with_carried[1], without[1], strict=True))
    pairs += [(ours, theirs) for a, b in zip(with_carried[2], without[2], strict=True) for ours, theirs in zip(a, b)]
    for ours, theirs in pairs:
        assert relative_error(ours, theirs.get().astype(np.float64)) < 1e-6


@pytest.mark.parametrize("width", [2, 3])
def test_the_one_pass_backward_of_a_narrow_product_is_the_float64_one(width):
    """epilogues_cupy.relu_gradient_mixed_of_product: dout = rows W^T for narrow rows (the score layer's
    input gradient), written out, and the one-pass backward of it, against float64 from the same
    float32 inputs."""
    import cupy

    rng = np.random.default_rng(13 + width)
    b, n, c = 2, 11, 40
    rows = rng.standard_normal((b, K, n, width)).astype(np.float32)
    weights = rng.standard_normal((c, width)).astype(np.float32)
    out = np.maximum(rng.standard_normal((b, K, n, c)), 0.0).astype(np.float32)
    a1 = sparse_support(rng).astype(np.float32)
    dy, sums, dout = epilogues_cupy.relu_gradient_mixed_of_product(
        cupy.asarray(rows), cupy.asarray(weights), cupy.asarray(out), cupy.asarray(a1)
    )
    exact = rows.astype(np.float64) @ weights.T.astype(np.float64)
    dz = np.where(out > 0, exact, 0.0)
    assert dout.shape == (b, K, n, c) and relative_error(dout, exact) < 1e-6
    assert relative_error(dy[..., :c], dz) < 1e-6
    assert relative_error(dy[..., c:], np.einsum("ji,bjnc->binc", a1.astype(np.float64), dz)) < 1e-6
    assert relative_error(sums, dz.sum(axis=1)) < 1e-6
    with pytest.raises(ValueError, match="do not fit"):
        epilogues_cupy.relu_gradient_mixed_of_product(cupy.asarray(rows), cupy.asarray(weights[:, :1]), out, a1)


@pytest.mark.parametrize(
    "rows, channels, row, columns",
    [
        (43 * 29 * 2 + 7, 192, 192, 2),  # the score layer's X and dY, a tail of rows past the unrolled four
        (43 * 500, 192, 196, 2),  # X a view of wider rows: its row stride read as it is
        (1000, 4, 4, 1),  # one column quad: a team a thread
        (37, 20, 24, 8),  # fewer rows than teams, the widest dY
    ],
)
def test_the_narrow_weight_gradient_is_the_float64_one(rows, channels, row, columns):
    """narrow_gradient_cupy.weight_gradient: X^T dY for a narrow dY in one pass over X, against float64
    from the same float32 inputs and within a bound cuBLAS's SGEMM meets too; what it cannot read it
    refuses."""
    import cupy

    from xmesh.model import narrow_gradient_cupy

    rng = np.random.default_rng(rows + columns)
    buf = cupy.zeros((rows, row), dtype=cupy.float32)
    x = np.maximum(rng.standard_normal((rows, channels)), 0.0).astype(np.float32)
    buf[:, :channels] = cupy.asarray(x)
    dy = (rng.standard_normal((rows, columns)) * 1e-3).astype(np.float32)
    exact = x.astype(np.float64).T @ dy.astype(np.float64)
    at = buf[:, :channels]
    assert narrow_gradient_cupy.takes(at, cupy.asarray(dy))
    ours = narrow_gradient_cupy.weight_gradient(at, cupy.asarray(dy))
    cublas = relative_error(at.T @ cupy.asarray(dy), exact)
    error = relative_error(ours, exact)
    print(f"{rows} rows, {channels} x {columns}: relative error {error:.2e} (cuBLAS {cublas:.2e})")
    assert ours.shape == (channels, columns) and error < 1e-6 and error < 3 * cublas + 1e-7
    assert not narrow_gradient_cupy.takes(buf[:, 1 : channels + 1], cupy.asarray(dy))  # rows off 16 bytes
    with pytest.raises(ValueError, match="do not fit"):
        narrow_gradient_cupy.weight_gradient(at, cupy.zeros((rows, 9), dtype=cupy.float32))


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_the_one_pass_backward_is_the_float64_one(mask_kind):
    """epilogues_cupy.relu_gradient_mixed: dZ (dout where the ReLU passed) as it is, A1^T dZ over the
    hypotheses and the sums over them, against float64 from the same float32 inputs."""
    import cupy

    from xmesh.model import epilogues_cupy

    rng = np.random.default_rng(11)
    b, n, c = 2, 13, 24
    dout = rng.standard_normal((b, K, n, c)).astype(np.float32)
    out = np.maximum(rng.standard_normal((b, K, n, c)), 0.0).astype(np.float32)
    a1 = sparse_support(rng).astype(np.float32)
    mask = out > 0 if mask_kind == "bool" else out
    dy, sums = epilogues_cupy.relu_gradient_mixed(cupy.asarray(dout), cupy.asarray(mask), cupy.asarray(a1))
    dz = np.where(out > 0, dout, 0.0).astype(np.float64)
    mixed = np.einsum("ji,bjnc->binc", a1.astype(np.float64), dz)
    assert np.array_equal(dy[..., :c].get(), dz.astype(np.float32))
    assert relative_error(dy[..., c:], mixed) < 1e-6
    assert relative_error(sums, dz.sum(axis=1)) < 1e-6


@pytest.mark.parametrize("shape, kh, stride", [((2, 9, 11, 5), 3, 1), ((2, 9, 11, 5), 3, 2), ((1, 8, 8, 4), 5, 2)])
def test_the_lent_patches_are_the_array_api_ones(shape, kh, stride):
    """The CuPy backend's im2col (one launch: the patches, a copy) and col2im (each input element's taps
    summed in the array-API code's order) against xmesh.model.cnn's own on NumPy."""
    import cupy

    from xmesh.backends import get_backend
    from xmesh.model import cnn

    get_backend("cupy")
    rng = np.random.default_rng(sum(shape) + kh + stride)
    x = rng.standard_normal(shape).astype(np.float32)
    xp_np = namespace("numpy")
    cols, size = cnn.im2col(xp_np, x, kh, kh, stride)
    lent_cols, lent_size = cnn.im2col(namespace("cupy"), cupy.asarray(x), kh, kh, stride)
    assert isinstance(lent_cols, cupy.ndarray) and lent_size == size
    assert np.array_equal(lent_cols.get(), cols)  # a copy: the same floats
    dcols = rng.standard_normal(cols.shape).astype(np.float32)
    dx = cnn.col2im(xp_np, dcols, shape, kh, kh, stride)
    lent_dx = cnn.col2im(namespace("cupy"), cupy.asarray(dcols), shape, kh, kh, stride)
    assert isinstance(lent_dx, cupy.ndarray) and lent_dx.shape == shape
    np.testing.assert_allclose(lent_dx.get(), dx, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "shape, kh, cout, stride, taken",
    [
        ((12, 28, 28, 16), 3, 16, 1, True),
        ((12, 14, 14, 32), 3, 64, 1, True),
        ((12, 14, 14, 16), 3, 32, 2, False),
        ((3, 28, 28, 16), 3, 16, 1, False),
    ],
)
def test_the_lent_convolution_is_the_float64_one(shape, kh, cout, stride, taken):
    """A training convolution's pair on CuPy in float32, where the backend lends cuDNN's (stride 1 over
    12 images or more: the forward, the input's and the weights' gradients in float32 multiply-adds, the
    input kept instead of its patches), against the array-API pair in float64 on NumPy; stride 2 and
    batch 1's three images keep the patches."""
    import cupy

    from xmesh.backends import get_backend
    from xmesh.backends.cudnn_conv import load_library
    from xmesh.model import cnn

    if load_library() is None:
        pytest.skip("cuDNN is not installed")
    get_backend("cupy")  # lends its convolution
    rng = np.random.default_rng(sum(shape) + cout + stride)
    x = np.maximum(rng.standard_normal(shape), 0.0)
    weight = rng.standard_normal((kh, kh, shape[3], cout)) / np.sqrt(kh * kh * shape[3])
    bias = rng.standard_normal(cout) * 0.1
    xp_np, xp_cp = namespace("numpy"), namespace("cupy")
    y, cache = cnn.conv_forward(xp_np, x, weight, bias, stride)
    dy = rng.standard_normal(y.shape)
    exact = (y, *cnn.conv_backward(xp_np, dy, cache))
    f32 = [cupy.asarray(v.astype(np.float32)) for v in (x, weight, bias, dy)]
    y32, cache32 = cnn.conv_forward(xp_cp, f32[0], f32[1], f32[2], stride)
    assert (cache32.cols is None) == taken
    ours = (y32, *cnn.conv_backward(xp_cp, f32[3], cache32))
    for name, a, b in zip(("y", "dx", "dW", "db"), ours, exact, strict=True):
        error = relative_error(a, b)
        print(f"{shape} k{kh} -> {cout}, stride {stride}, {name}: {error:.2e}")
        assert a.shape == b.shape and error < 1e-5, name


def test_the_convolutions_one_pass_ends_are_the_array_api_ones():
    """epilogues_cupy.plus_bias_relu is maximum(y + bias, 0), a NaN kept (the step's NaN stop sees
    it); relu_gradient of the output is where(out > 0, dout, 0), of a bool mask where(mask, dout, 0)."""
    import cupy

    from xmesh.model import epilogues_cupy

    rng = np.random.default_rng(13)
    y = rng.standard_normal((2, 5, 6, 8)).astype(np.float32)
    y[0, 0, 0, 0] = np.nan
    bias = rng.standard_normal(8).astype(np.float32)
    out = epilogues_cupy.plus_bias_relu(cupy.asarray(y), cupy.asarray(bias)).get()
    np.testing.assert_array_equal(out, np.maximum(y + bias, np.float32(0)))
    assert np.isnan(out[0, 0, 0, 0])
    dout = rng.standard_normal(y.shape).astype(np.float32)
    dz = epilogues_cupy.relu_gradient(cupy.asarray(dout), cupy.asarray(out)).get()
    np.testing.assert_array_equal(dz, np.where(out > 0, dout, np.float32(0)))
    active = rng.random(y.shape) < 0.5
    dz = epilogues_cupy.relu_gradient(cupy.asarray(dout), cupy.asarray(active)).get()
    np.testing.assert_array_equal(dz, np.where(active, dout, np.float32(0)))
