"""The TF32 modes' deformation layer with the mixing on its input side (kernels/wgmma_drb32.cu,
HopperGemm.drb_zlayer32) against float64 (GPU, compute capability 9.0; skipped elsewhere).

    out = relu(X W0 + Z W1 + b) (+ res),   Z = A1 X in float32,

which is the layer relu(X W0 + A1 (X W1) + b) (+ res) of MODEL.md with the mixing applied to the
product's input instead of its output: the same sums, rounded in another order.
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
    from xmesh.backends.hopper_gemm import mixing_source

    b, _, n, cin = x.shape
    poison = cp.full(b * 43 * n * 192, np.nan, dtype=cp.float32)   # the pool hands this memory out next
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
    bound = (2 * x.shape[-1] + 64) * 2.0 ** -23 * (magnitudes(x, w, a1, bias) + (0 if res is None else np.abs(res)))
    excess = np.abs(got - ref) / bound
    assert excess.max() <= 1.0, (excess.max(), np.unravel_index(excess.argmax(), excess.shape))


@pytest.mark.parametrize("b,n,cin,with_residual", [
    (2, 10, 192, True),     # partial vertex tile (10 = 2 x 4 + 2)
    (1, 7, 64, False),      # two 32-K buffers, no residual
    (2, 301, 128, True),    # 302 tiles x groups: persistent blocks run several, slices cross tiles
    (1, 2466, 192, True),   # the model's size: 617 vertex tiles
    (1, 2466, 339, False),  # a block's first layer: narrower column groups, rows padded to 340 (NaN), a partial slice
    (2, 37, 256, True),     # narrower groups, a residual, a partial vertex tile
    (1, 9, 100, False),     # cin 100: the last slice partly zero-filled
])
@pytest.mark.parametrize("operands", ["3xtf32", "tf32"])
def test_input_side_mixing_layer_against_float64(cp, hopper, operands, b, n, cin, with_residual):
    """3xTF32 as accurate as float32 arithmetic (within 4x its error over the whole output, and every
    element within a float32 accumulation bound of its terms' magnitudes, which a misplaced row or
    column breaks); one TF32 pass within TF32's error and measurably less accurate. Every output
    element written (the output's memory is poisoned first), on the template's A1 sparsity."""
    rng = np.random.default_rng(n + cin + len(operands))
    a1, x, w, bias, res = layer_case(rng, b, n, cin, with_residual)
    weight = hopper.prepare(cp.asarray(w), operands)
    got = run_on_poisoned_memory(cp, lambda xd, bd, rd, mixing: hopper.drb_zlayer32(xd, weight, bd, rd, mixing),
                                 a1, x, bias, res)
    if operands == "3xtf32":
        assert_float32_accurate(got, x, w, a1, bias, res)
    else:
        assert 3e-5 < rel_error(got, drb_reference(x, w, a1, bias, res)) < 3e-3


def test_input_side_mixing_layer_refuses_what_it_cannot_run(cp, hopper):
    """drb_zlayer32 names what is wrong: no mixing source, 16-bit X, a paired or 16-bit weight, cin
    above 384, rows not 16-byte aligned, a residual of the wrong type or not 8-byte aligned."""
    from xmesh.backends.hopper_gemm import mixing_source

    rng = np.random.default_rng(3)
    a1, x, w, bias, res = layer_case(rng, 1, 5, 192, True)
    x, res, bias, mixing = cp.asarray(x), cp.asarray(res), cp.asarray(bias), mixing_source(a1)
    weight = hopper.prepare(cp.asarray(w), "3xtf32")
    with pytest.raises(ValueError, match="no mixing source"):
        hopper.drb_zlayer32(x, weight, bias, res, "")
    with pytest.raises(ValueError, match="needs float32 X"):
        hopper.drb_zlayer32(x.astype(cp.float16), weight, bias, res, mixing)
    with pytest.raises(ValueError, match="paired=True"):
        hopper.drb_zlayer32(x, hopper.prepare(cp.asarray(w), "3xtf32", paired=True), bias, res, mixing)
    with pytest.raises(ValueError, match="fp16"):
        hopper.drb_zlayer32(x, hopper.prepare(cp.asarray(w), "fp16"), bias, res, mixing)
    wide = hopper.prepare(cp.asarray(np.concatenate([w, w, w[:4]])), "3xtf32")
    with pytest.raises(ValueError, match="cin up to 384"):
        hopper.drb_zlayer32(cp.concatenate([x, x, x[..., :4]], axis=-1), wide, bias, res, mixing)
    odd = cp.zeros(x.shape[:-1] + (194,), dtype=cp.float32)[..., 1:193]   # rows start 4 bytes in
    with pytest.raises(ValueError, match="16-byte aligned rows"):
        hopper.drb_zlayer32(odd, weight, bias, res, mixing)
    with pytest.raises(ValueError, match="residual must be"):
        hopper.drb_zlayer32(x, weight, bias, res.astype(cp.float16), mixing)
    shifted = cp.empty(res.size + 1, dtype=res.dtype)[1:].reshape(res.shape)   # 4 bytes off
    shifted[...] = res
    with pytest.raises(ValueError, match="8-byte aligned"):
        hopper.drb_zlayer32(x, weight, bias, shifted, mixing)
