"""The fp32 mode's deformation layer as three float16 products (kernels/wgmma_drb32h.cu,
HopperGemm.drb_layer_3xf16) against float64 (GPU, compute capability 9.0; skipped elsewhere), and its
weight preparation (HopperGemm.prepare_halves).

    out = relu(X W0 + Z W1 + b) (+ res),   Z = A1 X in float32,

each float32 product a w taken as big big + big small + small big of float16 parts (22 bits of each
operand, as 3xTF32), W's columns scaled by powers of two.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import requires_cuda
from test_tc_gemm import drb_reference, rel_error, template_support_mask

pytestmark = [requires_cuda, pytest.mark.gpu]


def padded_rows(cp, x):
    """x (B, 43, N, cin) as a view of rows padded to a multiple of 4 floats (16 bytes), the padding NaN:
    as the local projection hands a block's first layer its 339 features in rows of 340."""
    cin = x.shape[-1]
    full = cp.full(x.shape[:-1] + (-(-cin // 4) * 4,), np.nan, dtype=cp.float32)
    full[..., :cin] = cp.asarray(x)
    return full[..., :cin]


def layer_case(rng, b, n, cin, with_residual):
    a1 = ((rng.standard_normal((43, 43)) / 3) * template_support_mask()).astype(np.float32)
    x = rng.standard_normal((b, 43, n, cin)).astype(np.float32)
    w = (rng.standard_normal((cin, 384)) / np.sqrt(2 * cin)).astype(np.float32)
    bias = (rng.standard_normal(192) * 0.1).astype(np.float32)
    res = rng.standard_normal((b, 43, n, 192)).astype(np.float32) if with_residual else None
    return a1, x, w, bias, res


def float32_layer(x, w, a1, bias, res):
    """The layer in float32 arithmetic (NumPy, output-side mixing), for the accuracy float32 itself has."""
    y = x @ w
    out = np.maximum(y[..., :192] + np.einsum("ij,bjnc->binc", a1, y[..., 192:]) + bias, 0)
    return out if res is None else out + res


def magnitudes(x, w, a1, bias):
    """sum |terms| of each output element: |X| |W0| + (|A1| |X|) |W1| + |b| (float64)."""
    ax = np.abs(x.astype(np.float64))
    mixed = np.einsum("ij,bjnc->binc", np.abs(a1.astype(np.float64)), ax)
    aw = np.abs(w.astype(np.float64))
    return ax @ aw[:, :192] + mixed @ aw[:, 192:] + np.abs(bias)


def run_on_poisoned_memory(cp, layer, a1, x, bias, res):
    """``layer(X, bias, residual, mixing_source(a1))`` with X on the device (rows padded to 16 bytes
    where cin % 4) and the output's memory poisoned (NaN) first; checks that the output is float32
    (B, 43, N, 192), finite (every element written) and mostly nonzero; returns it on the host."""
    from xmesh.backends.cupy_backend.hopper import mixing_source

    b, _, n, cin = x.shape
    poison = cp.full(b * 43 * n * 192, np.nan, dtype=cp.float32)  # the pool hands this memory out next
    del poison
    x_dev = padded_rows(cp, x) if cin % 4 else cp.asarray(x)
    out = layer(x_dev, cp.asarray(bias), None if res is None else cp.asarray(res), mixing_source(a1))
    assert out.dtype == cp.float32 and out.shape == (b, 43, n, 192)
    got = out.get()
    assert np.isfinite(got).all() and (got != 0).mean() > 0.4
    return got


def assert_float32_accurate(got, x, w, a1, bias, res):
    """A float32-accurate layer: within 4x float32 arithmetic's error against float64 over the whole
    output, and every element within a float32 accumulation bound of its terms' magnitudes (which a
    misplaced row or column breaks)."""
    ref = drb_reference(x, w, a1, bias, res)
    err, f32 = rel_error(got, ref), rel_error(float32_layer(x, w, a1, bias, res), ref)
    assert err <= 4 * f32 + 1e-7, (err, f32)
    bound = (2 * x.shape[-1] + 64) * 2.0**-23 * (magnitudes(x, w, a1, bias) + (0 if res is None else np.abs(res)))
    excess = np.abs(got - ref) / bound
    assert excess.max() <= 1.0, (excess.max(), np.unravel_index(excess.argmax(), excess.shape))


@pytest.mark.parametrize(
    "b,n,cin,with_residual",
    [
        (2, 10, 192, True),  # partial vertex tile (10 = 2 x 4 + 2)
        (1, 7, 64, False),  # two K slices, no residual
        (2, 301, 128, True),  # 151 tiles: persistent blocks run two, the slices cross tiles
        (1, 2466, 192, True),  # the model's size: 617 vertex tiles
        (1, 2466, 339, False),  # a block's first layer: rows padded to 340 (NaN), a partial last slice
        (3, 37, 256, True),  # several samples, a partial vertex tile
        (1, 9, 100, False),  # cin 100: the last slice partly zero-filled
    ],
)
def test_three_half_products_layer_against_float64(cp, hopper, b, n, cin, with_residual):
    """As accurate as float32 arithmetic (within 4x its error over the whole output, and every element
    within a float32 accumulation bound of its terms' magnitudes, which a misplaced row or column or a
    lost small part breaks); every output element written (the output's memory is poisoned first)."""
    rng = np.random.default_rng(n + cin + 11)
    a1, x, w, bias, res = layer_case(rng, b, n, cin, with_residual)
    halves = hopper.prepare_halves(cp.asarray(w))
    got = run_on_poisoned_memory(
        cp, lambda xd, bd, rd, mixing: hopper.drb_layer_3xf16(xd, halves, bd, rd, mixing), a1, x, bias, res
    )
    assert_float32_accurate(got, x, w, a1, bias, res)


@pytest.mark.parametrize("x_scale,w_scale", [(1000.0, 1.0), (1.0, 1e-4), (1.0, 300.0)])
def test_three_half_products_keep_float32_accuracy_across_magnitudes(cp, hopper, x_scale, w_scale):
    """Activations in the thousands (float16's range holds them) and weights far from 1 either way
    (their columns' power-of-two scales bring them to float16's best range): still within the float32
    accumulation bound, elementwise, and within 4x float32's own error."""
    from xmesh.backends.cupy_backend.hopper import mixing_source

    rng = np.random.default_rng(5)
    a1, x, w, bias, res = layer_case(rng, 1, 50, 192, True)
    x, w = (x * x_scale).astype(np.float32), (w * w_scale).astype(np.float32)
    bias, res = (bias * x_scale * w_scale).astype(np.float32), (res * x_scale * w_scale).astype(np.float32)
    out = hopper.drb_layer_3xf16(
        cp.asarray(x), hopper.prepare_halves(cp.asarray(w)), cp.asarray(bias), cp.asarray(res), mixing_source(a1)
    ).get()
    assert_float32_accurate(out, x, w, a1, bias, res)


def test_prepare_halves_parts_and_scales(cp, hopper):
    """prepare_halves: each column's scale is a power of two putting its largest entry (over W0's and
    W1's column) in [2^7, 2^8); big + small reproduce the scaled weight to float16's 22 bits; the stream
    holds, for slice 0 and the second column group, W1's big and small parts of that group's accumulator
    column 5 at K rows 16..23 where the 64-byte swizzle puts them; K rows past k are zero."""
    from xmesh.backends.cupy_backend.hopper import accumulator_columns

    rng = np.random.default_rng(2)
    w = (rng.standard_normal((70, 384)) * np.exp(rng.uniform(-8, 8, 384))).astype(np.float32)
    halves = hopper.prepare_halves(cp.asarray(w))
    scale = halves.scale.get()
    shift = -np.log2(scale)
    assert np.array_equal(shift, np.round(shift))
    largest = np.maximum(np.abs(w[:, :192]).max(0), np.abs(w[:, 192:]).max(0)) / scale
    assert ((largest >= 128) & (largest < 256)).all()
    # 70 rows: three slices, each the two column groups' W1 and W0 pieces, big and small, of 96 rows
    stream = halves.stream.get().view(np.float16).reshape(3, 2, 2, 2, 96, 4, 8)
    col = 96 + accumulator_columns(96)[5]  # the second group's row 5
    big, small = stream[0, 1, 0, 0, 5, 0], stream[0, 1, 0, 1, 5, 0]  # W1; chunk 2 at position 2 ^ ((5 >> 1) & 3) = 0
    target = w[16:24, 192 + col].astype(np.float64) / scale[col]
    assert np.array_equal(big.astype(np.float64), target.astype(np.float16).astype(np.float64))
    assert np.abs(big.astype(np.float64) + small - target).max() <= 2.0**-21 * np.abs(target).max()
    n, pos = np.meshgrid(np.arange(96), np.arange(4), indexing="ij")
    k_row = 64 + 8 * (pos ^ ((n >> 1) & 3))[..., None] + np.arange(8)  # slice 2's K rows, (n, pos, e)
    assert not stream[2][..., k_row >= 70].any() and stream[2][..., k_row < 70].all(axis=-1).any()  # zeros past k


def test_three_half_products_refuse_what_they_cannot_run(cp, hopper):
    """drb_layer_3xf16 and prepare_halves name what is wrong: no mixing source, 16-bit X, X of another
    width than the weight, rows not 16-byte aligned, a residual of the wrong type, a weight of the
    wrong shape or with non-finite entries."""
    from xmesh.backends.cupy_backend.hopper import mixing_source

    rng = np.random.default_rng(3)
    a1, x, w, bias, res = layer_case(rng, 1, 5, 192, True)
    x, res, bias, mixing = cp.asarray(x), cp.asarray(res), cp.asarray(bias), mixing_source(a1)
    halves = hopper.prepare_halves(cp.asarray(w))
    with pytest.raises(ValueError, match="no mixing source"):
        hopper.drb_layer_3xf16(x, halves, bias, res, "")
    with pytest.raises(ValueError, match="float32"):
        hopper.drb_layer_3xf16(x.astype(cp.float16), halves, bias, res, mixing)
    with pytest.raises(ValueError, match="192"):
        hopper.drb_layer_3xf16(x[..., :128], halves, bias, res, mixing)
    odd = cp.zeros(x.shape[:-1] + (194,), dtype=cp.float32)[..., 1:193]  # rows start 4 bytes in
    with pytest.raises(ValueError, match="16-byte aligned"):
        hopper.drb_layer_3xf16(odd, halves, bias, res, mixing)
    with pytest.raises(ValueError, match="residual must be"):
        hopper.drb_layer_3xf16(x, halves, bias, res.astype(cp.float16), mixing)
    with pytest.raises(ValueError, match=r"\(k, 384\)"):
        hopper.prepare_halves(cp.asarray(w[:, :192]))
    bad = w.copy()
    bad[3, 5] = np.inf
    with pytest.raises(ValueError, match="non-finite"):
        hopper.prepare_halves(cp.asarray(bad))


@pytest.mark.parametrize("cin,with_residual", [(192, True), (339, False)])
def test_fp32_mode_runs_its_deformation_layers_as_three_half_products(cp, gb, hopper, monkeypatch, cin, with_residual):
    """The fp32 backend sends a deformation layer whose X rows are 16-byte aligned (the model's: the
    local projection pads its 339 features to rows of 340) to drb_layer_3xf16, and its result is as
    accurate as the 3xTF32 layer it replaces (fp32_halves = False) against float64."""
    from xmesh.model.deformation import local_gconv
    from xmesh.model.params import GraphConv

    rng = np.random.default_rng(cin)
    a1, x, w, bias, res = layer_case(rng, 2, 61, cin, with_residual)
    layer = GraphConv(cp.asarray(w), cp.asarray(bias), 192, True)
    x_dev, res_dev = padded_rows(cp, x) if cin % 4 else cp.asarray(x), None if res is None else cp.asarray(res)
    calls = []
    real = hopper.drb_layer_3xf16
    monkeypatch.setattr(hopper, "drb_layer_3xf16", lambda *a, **k: (calls.append(a[0].shape), real(*a, **k))[1])
    got = local_gconv(gb, layer, x_dev, cp.asarray(a1), None, res_dev).get()
    assert calls == [x.shape]
    monkeypatch.setattr(gb, "fp32_halves", False)
    old = local_gconv(gb, layer, x_dev, cp.asarray(a1), None, res_dev).get()
    assert len(calls) == 1
    assert_float32_accurate(got, x, w, a1, bias, res)
    assert_float32_accurate(old, x, w, a1, bias, res)


@pytest.mark.parametrize("b,n,cin", [(2, 10, 192), (1, 2466, 192), (3, 37, 128)])
def test_last_layer_score_products_against_float64(cp, hopper, b, n, cin):
    """drb_layer_3xf16 with a score layer's weight: x5 is not written; each 96-column group's products of
    x5 (the same layer's float32 output, computed without the score weight) with W come back, each
    within a float32 accumulation bound of float64's, every valid row's written (poisoned memory first)."""
    from xmesh.backends.cupy_backend.hopper import mixing_source

    rng = np.random.default_rng(b * n + cin)
    a1, x, w, bias, res = layer_case(rng, b, n, cin, True)
    score_w = (rng.standard_normal((192, 2)) / 8).astype(np.float32)
    halves, mixing = hopper.prepare_halves(cp.asarray(w)), mixing_source(a1)
    x_dev, bias_dev, res_dev = cp.asarray(x), cp.asarray(bias), cp.asarray(res)
    x5 = hopper.drb_layer_3xf16(x_dev, halves, bias_dev, res_dev, mixing).get().astype(np.float64)
    poison = cp.full(2 * b * 43 * n * 2, np.nan, dtype=cp.float32)
    del poison
    parts = hopper.drb_layer_3xf16(x_dev, halves, bias_dev, res_dev, mixing, score_weight=cp.asarray(score_w))
    assert parts.dtype == cp.float32 and parts.shape == (2, b, 43, n, 2)
    got = parts.get()
    assert np.isfinite(got).all()
    for g in range(2):
        cols = slice(96 * g, 96 * (g + 1))
        want = x5[..., cols] @ score_w[cols].astype(np.float64)
        bound = 100 * 2.0**-24 * (np.abs(x5[..., cols]) @ np.abs(score_w[cols].astype(np.float64)))
        assert (np.abs(got[g] - want) <= bound).all(), np.abs(got[g] - want).max()
    with pytest.raises(ValueError, match=r"\(192, 2\)"):
        hopper.drb_layer_3xf16(x_dev, halves, bias_dev, res_dev, mixing, score_weight=cp.asarray(score_w[:, :1]))


def test_block_tail_with_the_score_in_the_last_layer(cp, gb, hopper, monkeypatch):
    """The fp32 backend's op_drb_last_layer_score (x5 never written, the score layer's products from the
    last wide layer's epilogue, then drb_score_finish) moves a block's vertices as x5 through the
    separate score kernel (op_score_update) does, to float32 summation order: 1e-6 with offsets of
    0.05; the model's block_tail takes it; fuse_drb_score = False turns it off."""
    from xmesh.model.deformation import block_tail
    from xmesh.model.params import GraphConv

    b, n = 2, 301
    rng = np.random.default_rng(21)
    a1, x4, w, bias, x3 = layer_case(rng, b, n, 192, True)
    layer = GraphConv(cp.asarray(w), cp.asarray(bias), 192, True)
    score = GraphConv(
        cp.asarray((rng.standard_normal((192, 2)) / 8).astype(np.float32)), cp.asarray(np.float32([0.1])), 1, True
    )
    cheb1 = cp.asarray(a1)
    offsets = cp.asarray((rng.standard_normal((43, 3)) * 0.05).astype(np.float32))
    centers = cp.asarray(rng.standard_normal((b, n, 3)).astype(np.float32))
    x4, x3 = cp.asarray(x4), cp.asarray(x3)
    fused = gb.op_drb_last_layer_score(layer, score, x4, x3, cheb1, None, centers, offsets)
    x5 = gb.op_local_gconv(layer, x4, cheb1, None, x3)
    separate = gb.op_score_update(score, x5, cheb1, None, centers, offsets)
    assert fused is not None and separate is not None
    assert float(cp.abs(separate - centers).max()) > 1e-2  # the scores matter at this tolerance
    np.testing.assert_allclose(fused.get(), separate.get(), rtol=0, atol=1e-6)

    # the model's block tail: its first four layers, then this fast path
    params = type("P", (), {"sample_cheb1": cheb1, "sample_cheb0": None, "sample_coord": offsets})()
    x = cp.asarray(rng.standard_normal((b, 43, n, 192)).astype(np.float32) * 0.5)
    layers = [
        GraphConv(cp.asarray((rng.standard_normal((192, 384)) / 20).astype(np.float32)), cp.asarray(bias), 192, True)
        for _ in range(4)
    ] + [layer, score]
    calls = []
    real = gb.op_drb_last_layer_score
    monkeypatch.setattr(gb, "op_drb_last_layer_score", lambda *a: (calls.append(1), real(*a))[1])
    tail = block_tail(gb, layers, x, params, centers)
    assert calls == [1]
    monkeypatch.setattr(gb, "fuse_drb_score", False)
    unfused = block_tail(gb, layers, x, params, centers)
    np.testing.assert_allclose(tail.get(), unfused.get(), rtol=0, atol=1e-6)
    assert gb.op_drb_last_layer_score(layer, score, x4, x3, cheb1, None, centers, offsets) is None
