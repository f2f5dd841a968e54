"""A deformation block's four 192-wide layers in one kernel, in the 16-bit modes
(kernels/wgmma_drb16_chain.cu, HopperGemm.drb_chain16):

    x2 = lc2(x1),  x3 = lc3(x2) + x1,  x4 = lc4(x3),  x5 = lc5(x4) + x3,

each layer computed as the one-layer kernel drb_zlayer computes it, so x5 must equal four drb_zlayer
calls bit for bit (test_drb16_zlayer.py checks that kernel against float64). The W stream's layout is
checked on the CPU; the rest needs a GPU of compute capability 9.0.
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import requires_cuda
from test_cupy_backend import random_cameras
from test_tc_gemm import template_support_mask, to16


def test_w_stream_holds_each_weight_once_in_the_kernels_order():
    """chain_piece_index against the layout written out element by element: piece h of K slice ks holds
    W1 (h = 0) or W0 (h = 1) for accumulator column n (output column accumulator_columns()[n]), K rows
    32 ks + 8 c + e in 16-byte chunk c stored at position c ^ ((n >> 1) & 3); every element of the
    prepared 384 x 192 weight appears exactly once."""
    from xmesh.backends.hopper_gemm import accumulator_columns, chain_piece_index

    ldb = 200   # a row pitch other than 192: the index must use it
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


def chain_case(cp, operands, b, n, seed):
    rng = np.random.default_rng(seed)
    a1 = ((rng.standard_normal((43, 43)) / 3) * template_support_mask()).astype(np.float32)
    x1 = np.maximum(rng.standard_normal((b, 43, n, 192)), 0).astype(np.float32)
    ws = [(rng.standard_normal((192, 384)) / np.sqrt(2 * 192)).astype(np.float32) for _ in range(4)]
    biases = [(rng.standard_normal(192) * 0.1).astype(np.float32) for _ in range(4)]
    return a1, to16(cp, x1, operands), ws, biases


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("b,n", [
    (1, 2466),   # the model's size: 617 tiles, persistent blocks take four or five
    (2, 10),     # partial vertex tiles, fewer tiles than multiprocessors
    (3, 301),    # 228 tiles: blocks take one or two, tiles cross samples
])
@pytest.mark.parametrize("operands", ["fp16", "bf16"])
def test_chain_equals_four_single_layers_bit_for_bit(cp, hopper, operands, b, n):
    from xmesh.backends.hopper_gemm import mixing_source

    a1, x1, ws, biases = chain_case(cp, operands, b, n, seed=n + b + len(operands))
    mixing = mixing_source(a1)
    weights = [hopper.prepare(cp.asarray(w), operands) for w in ws]
    bias = [cp.asarray(v) for v in biases]
    x2 = hopper.drb_zlayer(x1, weights[0], bias[0], None, mixing)
    x3 = hopper.drb_zlayer(x2, weights[1], bias[1], x1, mixing)
    x4 = hopper.drb_zlayer(x3, weights[2], bias[2], None, mixing)
    want = hopper.drb_zlayer(x4, weights[3], bias[3], x3, mixing)

    chain = hopper.prepare_chain16(weights, bias)
    poison = cp.full(b * 43 * n * 192, np.nan, dtype=cp.float32)   # the pool hands this memory out next
    del poison
    got = hopper.drb_chain16(x1, chain, mixing)
    assert got.dtype == x1.dtype and got.shape == x1.shape
    want16, got16 = want.view(cp.uint16).get(), got.view(cp.uint16).get()
    assert (want16 != 0).mean() > 0.3   # the layers did not die out: a real comparison
    mismatch = np.argwhere(want16 != got16)
    assert mismatch.size == 0, (len(mismatch), mismatch[:5])
    again = hopper.drb_chain16(x1, chain, mixing)   # deterministic
    np.testing.assert_array_equal(again.view(cp.uint16).get(), got16)


@requires_cuda
@pytest.mark.gpu
def test_chain_refuses_what_it_cannot_run(cp, hopper):
    """drb_chain16 and prepare_chain16 name what is wrong: no mixing source, float32 or strided x1,
    x1 in the other 16-bit type, weights of a TF32 mode or the wrong count."""
    from xmesh.backends.hopper_gemm import mixing_source

    a1, x1, ws, biases = chain_case(cp, "fp16", 1, 9, seed=3)
    mixing = mixing_source(a1)
    weights = [hopper.prepare(cp.asarray(w), "fp16") for w in ws]
    chain = hopper.prepare_chain16(weights, [cp.asarray(v) for v in biases])
    with pytest.raises(ValueError, match="no mixing source"):
        hopper.drb_chain16(x1, chain, "")
    with pytest.raises(ValueError, match="contiguous 16-byte aligned"):
        hopper.drb_chain16(x1.astype(cp.float32), chain, mixing)
    with pytest.raises(ValueError, match="contiguous 16-byte aligned"):
        hopper.drb_chain16(cp.concatenate([x1, x1], axis=-1)[..., ::2], chain, mixing)
    with pytest.raises(ValueError, match="float16"):
        hopper.drb_chain16(x1.view(cp.uint16), chain, mixing)
    with pytest.raises(ValueError, match="4 unpaired 16-bit"):
        hopper.prepare_chain16(weights[:3], biases[:3])
    with pytest.raises(ValueError, match="4 unpaired 16-bit"):
        hopper.prepare_chain16([hopper.prepare(cp.asarray(w), "tf32") for w in ws], biases)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_model_with_the_chain_equals_the_model_without(cp, hopper, precision):
    """A whole reconstruction in a 16-bit mode with the four layers chained (the default on compute
    capability 9.0) equals the one that runs them one by one, bit for bit, at batch 2."""
    from xmesh import Reconstructor
    from xmesh.backends.cupy_backend import CupyBackend
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
    backend.hopper.drb_chain16 = lambda *a: calls.append(1) or original(*a)
    chained = [a.get() for a in model.run(images, cameras)]
    assert len(calls) == 2   # one call per deformation block
    backend.chain_drb_layers = False
    single = [a.get() for a in model.run(images, cameras)]
    assert len(calls) == 2
    for c, s in zip(chained, single):
        np.testing.assert_array_equal(c, s)
    assert np.isfinite(chained[-1]).all()
