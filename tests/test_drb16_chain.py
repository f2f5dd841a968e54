"""A deformation block's five wide layers in one kernel, in the 16-bit modes
(kernels/wgmma_drb16_chain.cu, HopperGemm.drb_chain16):

    x1 = lc1(X),  x2 = lc2(x1),  x3 = lc3(x2) + x1,  x4 = lc4(x3),  x5 = lc5(x4) + x3,

each layer computed as the one-layer reference kernel computes it, so x5 must equal five
reference_layer16 calls bit for bit (tests/drb16_reference.py; test_drb16_reference.py checks that
kernel against float64). The W stream's layout is
checked on the CPU; the rest needs a GPU of compute capability 9.0.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import requires_cuda
from drb16_reference import reference_block16
from test_cupy_backend import random_cameras
from test_tc_gemm import template_support_mask, to16
from tolerance import GPU_ATOL, GPU_MAX_FRACTION, assert_mostly_within


def test_w_stream_holds_each_weight_once_in_the_kernels_order():
    """chain_piece_index against the layout written out element by element: piece h of K slice ks holds
    W1 (h = 0) or W0 (h = 1) for accumulator column n (output column accumulator_columns()[n]), K rows
    32 ks + 8 c + e in 16-byte chunk c stored at position c ^ ((n >> 1) & 3); every element of the
    prepared 384 x 192 weight appears exactly once."""
    from xmesh.backends.cupy_backend.hopper import accumulator_columns, chain_piece_index

    ldb = 200  # a row pitch other than 192: the index must use it
    index = chain_piece_index(ldb)
    assert index.shape == (6, 2, 192, 4, 8)
    columns = accumulator_columns()
    assert sorted(columns) == list(range(192))
    # quad thread t's accumulator columns 8 j + 2 t, + 1 hold output columns 32 k + 8 t .. + 7
    for t in range(4):
        held = sorted(columns[8 * j + 2 * t + s] for j in range(24) for s in range(2))
        assert held == sorted(32 * k + 8 * t + c for k in range(6) for c in range(8))
    for ks in range(6):
        for h, w_base in ((0, 192), (1, 0)):
            for n in range(0, 192, 7):
                for c in range(4):
                    for e in range(8):
                        want = (w_base + columns[n]) * ldb + 32 * ks + 8 * c + e
                        assert index[ks, h, n, c ^ ((n >> 1) & 3), e] == want
    used = index.reshape(-1)
    assert len(np.unique(used)) == used.size == 384 * 192
    assert np.all(used % ldb < 192)


def test_first_layer_stream_covers_its_k_rows_in_whole_slices():
    """The first layer's part: eleven 32-row slices for cin 339 (prepared with K padded to 352), each
    of the 384 x 339 weights' elements once, and the padded rows 339..351 (zeros) read as well."""
    from xmesh.backends.cupy_backend.hopper import chain_piece_index

    index = chain_piece_index(352, 11)
    assert index.shape == (11, 2, 192, 4, 8)
    used = index.reshape(-1)
    assert len(np.unique(used)) == used.size == 384 * 352
    assert used.max() == 384 * 352 - 1


def chain_case(cp, operands, b, n, seed, cin=339, ldx=344):
    """A1, X (b, 43, n, cin) as rows of ldx 16-bit values with NaN in the columns past cin (the
    kernels must not read them), the five layers' weights and biases."""
    rng = np.random.default_rng(seed)
    a1 = ((rng.standard_normal((43, 43)) / 3) * template_support_mask()).astype(np.float32)
    rows = np.full((b, 43, n, ldx), np.nan, dtype=np.float32)
    rows[..., :cin] = rng.uniform(0, 1, (b, 43, n, cin))
    x = to16(cp, rows, operands)[..., :cin]
    ws = [(rng.standard_normal((cin, 384)) / np.sqrt(2 * cin)).astype(np.float32)]
    ws += [(rng.standard_normal((192, 384)) / np.sqrt(2 * 192)).astype(np.float32) for _ in range(4)]
    biases = [(rng.standard_normal(192) * 0.1).astype(np.float32) for _ in range(5)]
    return a1, x, ws, biases


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize(
    "b,n,cin,ldx",
    [
        (1, 2466, 339, 344),  # the model's size: 617 tiles, persistent blocks take four or five
        (2, 10, 339, 344),  # partial vertex tiles, fewer tiles than multiprocessors
        (3, 301, 339, 352),  # 228 tiles: blocks take one or two, tiles cross samples
        (2, 77, 130, 136),  # five first-layer slices: fewer than the six X half-buffers
        (1, 50, 384, 392),  # twelve first-layer slices, the last one whole
    ],
)
@pytest.mark.parametrize("operands", ["fp16", "bf16"])
def test_chain_equals_five_single_layers_bit_for_bit(cp, hopper, operands, b, n, cin, ldx):
    from xmesh.backends.cupy_backend.hopper import mixing_source, widen16

    a1, x, ws, biases = chain_case(cp, operands, b, n, seed=n + b + len(operands), cin=cin, ldx=ldx)
    mixing = mixing_source(a1)
    weights = [hopper.prepare(cp.asarray(w), operands) for w in ws]
    bias = [cp.asarray(v) for v in biases]
    want = reference_block16(hopper, x, weights, bias, mixing)

    chain = hopper.prepare_chain16(weights[0], weights[1:], bias)
    poison = cp.full(b * 43 * n * 192, np.nan, dtype=cp.float32)  # the pool hands this memory out next
    del poison
    got = hopper.drb_chain16(x, chain, mixing)
    assert got.dtype == x.dtype and got.shape == (b, 43, n, 192)
    want16, got16 = want.view(cp.uint16).get(), got.view(cp.uint16).get()
    assert (want16 != 0).mean() > 0.3  # the layers did not die out: a real comparison
    assert bool(cp.isfinite(widen16(cp, got, operands)).all())  # the NaN past cin was not read
    mismatch = np.argwhere(want16 != got16)
    assert mismatch.size == 0, (len(mismatch), mismatch[:5])
    again = hopper.drb_chain16(x, chain, mixing)  # deterministic
    np.testing.assert_array_equal(again.view(cp.uint16).get(), got16)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("b,n,cin,ldx", [(1, 2466, 339, 344), (2, 10, 339, 344), (3, 301, 339, 352)])
@pytest.mark.parametrize("operands", ["fp16", "bf16"])
def test_chain_with_the_score_layer_leaves_its_products(cp, hopper, operands, b, n, cin, ldx):
    """Given the score layer's W (192 x 2), the chain writes no x5 but each row's x5 W (B, 43, N, 2)
    float32: the float64 products of the x5 it writes otherwise, within float32 summation's bound
    (192 u sum |x5| |W|). The model's size, partial vertex tiles, tiles across samples."""
    from xmesh.backends.cupy_backend.hopper import mixing_source, widen16

    a1, x, ws, biases = chain_case(cp, operands, b, n, seed=2 * n + b, cin=cin, ldx=ldx)
    mixing = mixing_source(a1)
    weights = [hopper.prepare(cp.asarray(w), operands) for w in ws]
    chain = hopper.prepare_chain16(weights[0], weights[1:], [cp.asarray(v) for v in biases])
    x5 = widen16(cp, hopper.drb_chain16(x, chain, mixing), operands).get().astype(np.float64)
    w = (np.random.default_rng(n).standard_normal((192, 2)) / np.sqrt(192)).astype(np.float32)
    got = hopper.drb_chain16(x, chain, mixing, score_weight=cp.asarray(w)).get()
    assert got.shape == (b, 43, n, 2) and got.dtype == np.float32
    want = x5 @ w.astype(np.float64)
    bound = 192 * 2.0**-24 * (np.abs(x5) @ np.abs(w.astype(np.float64)))
    assert (np.abs(want) > 1e-3).mean() > 0.9  # real products, not a dead block
    excess = np.abs(got - want) - bound
    assert excess.max() <= 0, (int((excess > 0).sum()), float(excess.max()))
    with pytest.raises(ValueError, match="192, 2"):
        hopper.drb_chain16(x, chain, mixing, score_weight=cp.asarray(w[:, :1]))


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("parts", [1, 2])
def test_score_finish_against_float64(cp, parts):
    """drb_score_finish (the block's end after a kernel with the score layer's products in its
    epilogue): from each row's (y0, y1), summed over ``parts`` planes (the fp32 mode's last layer
    leaves one per 96-column group), the scores relu(y0 + A1 y1 + b), the softmax over the 43
    hypotheses and the moved vertices, against float64; a vertex count that leaves the last block
    partial."""
    from xmesh.backends.cupy_backend import CupyBackend
    from xmesh.backends.kernel_constants import SCORE_FINISH_THREADS, SCORE_FINISH_VERTICES

    rng = np.random.default_rng(11)
    b, n = 2, 1001
    planes = rng.standard_normal((parts, b, 43, n, 2)).astype(np.float32)
    a1 = (rng.standard_normal((43, 43)) / 6).astype(np.float32)
    bias = np.float32([0.3])
    offsets = (rng.standard_normal((43, 3)) * 0.01).astype(np.float32)
    centers = rng.standard_normal((b, n, 3)).astype(np.float32)
    backend = CupyBackend(precision="fp16")
    out = cp.full((b, n, 3), np.nan, dtype=cp.float32)
    backend._kernel("drb_score_finish")(
        (-(-(b * n) // SCORE_FINISH_VERTICES),),
        (SCORE_FINISH_THREADS,),
        (cp.asarray(planes), np.int32(parts), np.int64(b * 43 * n))
        + tuple(cp.asarray(a) for a in (a1, bias, offsets, centers))
        + (out, np.int32(b), np.int32(n)),
    )
    r = planes.astype(np.float64).sum(axis=0)
    score = np.maximum(r[..., 0] + np.einsum("kj,bjn->bkn", a1.astype(np.float64), r[..., 1]) + bias[0], 0)
    weight = np.exp(score - score.max(axis=1, keepdims=True))
    weight /= weight.sum(axis=1, keepdims=True)
    want = centers + np.einsum("bkn,kc->bnc", weight, offsets.astype(np.float64))
    np.testing.assert_allclose(out.get(), want, rtol=0, atol=2e-6)
    moved = np.abs(want - centers).max()
    assert moved > 1e-3  # the offsets matter at this tolerance


@requires_cuda
@pytest.mark.gpu
def test_chain_refuses_what_it_cannot_run(cp, hopper):
    """drb_chain16 and prepare_chain16 name what is wrong: no mixing source, float32 or strided X,
    X in the other 16-bit type or of another width, weights of a TF32 mode or the wrong count."""
    from xmesh.backends.cupy_backend.hopper import mixing_source

    a1, x, ws, biases = chain_case(cp, "fp16", 1, 9, seed=3)
    mixing = mixing_source(a1)
    weights = [hopper.prepare(cp.asarray(w), "fp16") for w in ws]
    chain = hopper.prepare_chain16(weights[0], weights[1:], [cp.asarray(v) for v in biases])
    with pytest.raises(ValueError, match="no mixing source"):
        hopper.drb_chain16(x, chain, "")
    with pytest.raises(ValueError, match="16-byte aligned"):
        hopper.drb_chain16(x.astype(cp.float32), chain, mixing)
    with pytest.raises(ValueError, match="rows a multiple of 8"):
        hopper.drb_chain16(cp.concatenate([x, x], axis=-1)[..., ::2], chain, mixing)
    with pytest.raises(ValueError, match="339"):
        hopper.drb_chain16(x[..., :300], chain, mixing)
    with pytest.raises(ValueError, match="float16"):
        hopper.drb_chain16(x.view(cp.uint16), chain, mixing)
    with pytest.raises(ValueError, match="4 unpaired"):
        hopper.prepare_chain16(weights[0], weights[1:4], biases[:4])
    with pytest.raises(ValueError, match="4 unpaired"):
        hopper.prepare_chain16(weights[0], [hopper.prepare(cp.asarray(w), "tf32") for w in ws[1:]], biases)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_model_with_the_chain_equals_the_model_without(cp, hopper, precision):
    """A whole reconstruction in a 16-bit mode with the five layers chained equals the one whose blocks
    run them one by one through the reference layer (tests/drb16_reference.py), bit for bit, at
    batch 2. With the score layer's products in the chain as well (the default on compute capability
    9.0) the first block's vertices move by float32 summation order
    (test_block_tail_with_the_score_in_the_chain), which may move the second block's samples to
    neighbouring pixels: the end-to-end allowance of test_cupy_backend.py."""
    from xmesh import Reconstructor
    from xmesh.backends.cupy_backend import CupyBackend
    from xmesh.backends.cupy_backend.hopper import mixing_source
    from xmesh.io.weights import synthetic_weights
    from xmesh.template_gen import generate_template

    weights, template = synthetic_weights(6), generate_template()
    rng = np.random.default_rng(6)
    images = rng.uniform(0, 1, (2, 3, 224, 224, 3)).astype(np.float32)
    cameras = random_cameras(rng, 2)
    backend = CupyBackend(precision=precision)
    model = Reconstructor(weights, template=template, backend=backend, graphs=False)
    calls = []
    original = backend.hopper.drb_chain16
    backend.hopper.drb_chain16 = lambda *a, **kw: calls.append("score_weight" in kw) or original(*a, **kw)
    fused = [a.get() for a in model.run(images, cameras)]
    assert calls == [True, True]  # one call per deformation block, the score layer inside
    backend.fuse_drb_score = False
    chained = [a.get() for a in model.run(images, cameras)]
    assert calls[2:] == [False, False]

    def one_by_one(layers, x, cheb1, cheb0=None):
        prepared = [backend.hopper.prepare(layer.weight, precision) for layer in layers]
        return reference_block16(
            backend.hopper, x, prepared, [layer.bias for layer in layers], mixing_source(cheb1.get())
        )

    backend.op_drb_block_layers = one_by_one
    single = [a.get() for a in model.run(images, cameras)]
    assert len(calls) == 4
    for c, s in zip(chained, single):
        np.testing.assert_array_equal(c, s)
    np.testing.assert_array_equal(fused[0], chained[0])  # the coarse mesh: stage 1 alone
    assert_mostly_within(fused[1], chained[1], GPU_ATOL, GPU_MAX_FRACTION)
    assert np.isfinite(fused[1]).all() and not np.array_equal(fused[1], fused[0])


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("operands", ["fp16", "bf16"])
def test_block_tail_with_the_score_in_the_chain(cp, hopper, operands):
    """op_drb_block_tail (the chain with the score layer's products, then drb_score_finish) moves a
    block's vertices as the chain's x5 through the separate score kernel (op_score_update) does, to
    float32 summation order: 1e-6 with offsets of 0.05."""
    from xmesh.backends.cupy_backend import CupyBackend
    from xmesh.model.params import GraphConv

    b, n = 2, 301
    a1, x, ws, biases = chain_case(cp, operands, b, n, seed=21)
    rng = np.random.default_rng(21)
    layers = [GraphConv(cp.asarray(w), cp.asarray(v), 192, True) for w, v in zip(ws, biases)]
    layers.append(
        GraphConv(
            cp.asarray((rng.standard_normal((192, 2)) / 8).astype(np.float32)), cp.asarray(np.float32([0.1])), 1, True
        )
    )
    cheb1 = cp.asarray(a1)
    offsets = cp.asarray((rng.standard_normal((43, 3)) * 0.05).astype(np.float32))
    centers = cp.asarray(rng.standard_normal((b, n, 3)).astype(np.float32))
    backend = CupyBackend(precision=operands)
    fused = backend.op_drb_block_tail(layers, x, cheb1, None, centers, offsets)
    x5 = backend.op_drb_block_layers(layers[:5], x, cheb1)
    separate = backend.op_score_update(layers[5], x5, cheb1, None, centers, offsets)
    assert fused is not None and separate is not None
    moved = cp.abs(separate - centers).max()
    assert float(moved) > 1e-2  # the scores matter at this tolerance
    np.testing.assert_allclose(fused.get(), separate.get(), rtol=0, atol=1e-6)
    backend.fuse_drb_score = False
    assert backend.op_drb_block_tail(layers, x, cheb1, None, centers, offsets) is None
