"""The 16-bit chain's one-layer reference (tests/drb16_reference.py, kernels/wgmma_drb16.cu): the
deformation layer with the mixing on its input side, against float64 (GPU, compute capability 9.0;
skipped elsewhere).

    out = relu(X W0 + Z W1 + b) (+ res),   Z = A1 X rounded to the mode's 16 bits,

which is the layer relu(X W0 + A1 (X W1) + b) (+ res) of MODEL.md with one more 16-bit rounding (Z's).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import requires_cuda
from drb16_reference import reference_layer16
from test_tc_gemm import drb_reference, rel_error, round16, template_support_mask, to16

pytestmark = [requires_cuda, pytest.mark.gpu]


def unit_in_last_place(y, operands):
    """The spacing of the mode's 16-bit values at |y| (float16: 11 significant bits, bfloat16: 8)."""
    bits = 11 if operands == "fp16" else 8
    _, exponent = np.frexp(np.maximum(np.abs(y), 2.0**-14))
    return np.ldexp(1.0, exponent - bits)


def mixed_as_the_kernel_sums(a1, x):
    """A1 X over axis 1 of x (B, 43, N, C) in float32, each sum an fmaf chain over row i's nonzeros in
    increasing j (as wg_mix_sparse): a float32 product is exact in float64, so float64 (a x + m)
    rounded to float32 is the fused multiply-add's single rounding (but for double-rounding ties,
    about one in 2^29)."""
    x = np.asarray(x, dtype=np.float32).astype(np.float64)
    out = np.zeros(x.shape, dtype=np.float32)
    for i in range(a1.shape[0]):
        m = np.zeros(x[:, 0].shape, dtype=np.float32)
        for j in np.flatnonzero(a1[i]):
            m = (np.float64(a1[i, j]) * x[:, j] + m).astype(np.float32)
        out[:, i] = m
    return out


def float64_layer16(x16, w, a1, bias, res16, operands):
    """The layer in float64 from the kernel's own operands (X and the residual as given, W rounded to
    16 bits, Z = A1 X rounded to 16 bits), and a bound on what float32 accumulation of its 2 cin
    products may add (K u sum |terms|, u = 2^-24)."""
    cout = w.shape[1] // 2
    x = x16.astype(np.float64)
    z = round16(mixed_as_the_kernel_sums(a1, x16), operands)
    w16 = round16(w, operands).astype(np.float64)
    z = z.astype(np.float64)
    out = np.maximum(x @ w16[:, :cout] + z @ w16[:, cout:] + bias, 0.0)
    terms = np.abs(x) @ np.abs(w16[:, :cout]) + np.abs(z) @ np.abs(w16[:, cout:]) + np.abs(bias)
    bound = (2 * x.shape[-1] + 2) * 2.0**-24 * terms
    return (out if res16 is None else out + res16), bound


def padded_rows(cp, x16, operands):
    """x16 (B, 43, N, cin) as a view of rows padded to a multiple of 8 elements (16 bytes), the padding
    NaN: as the local projection hands a block's first layer its 339 features in rows of 344."""
    cin = x16.shape[-1]
    nan = 0x7E00 if operands == "fp16" else 0x7FC0
    full = cp.full(x16.shape[:-1] + (-(-cin // 8) * 8,), nan, dtype=cp.uint16).view(x16.dtype)
    full[..., :cin] = x16
    return full[..., :cin]


def layer_case(cp, operands, b, n, cin, with_residual, seed):
    rng = np.random.default_rng(seed)
    a1 = ((rng.standard_normal((43, 43)) / 3) * template_support_mask()).astype(np.float32)
    x = rng.standard_normal((b, 43, n, cin)).astype(np.float32)
    w = (rng.standard_normal((cin, 384)) / np.sqrt(2 * cin)).astype(np.float32)
    bias = (rng.standard_normal(192) * 0.1).astype(np.float32)
    res = rng.standard_normal((b, 43, n, 192)).astype(np.float32) if with_residual else None
    x16 = to16(cp, x, operands)
    if cin % 8:
        x16 = padded_rows(cp, x16, operands)
    res16 = None if res is None else to16(cp, res, operands)
    return a1, x16, w, bias, res16


@pytest.mark.parametrize(
    "b,n,cin,with_residual",
    [
        (2, 10, 192, True),  # partial vertex tile (10 = 2 x 4 + 2)
        (1, 7, 64, False),  # one 64-wide weight buffer, no residual
        (2, 301, 128, True),  # 152 tiles: persistent blocks run one or two, slices cross tiles
        (1, 2466, 192, True),  # the model's size: 617 tiles
        (1, 2466, 339, False),  # a block's first layer: 96-column tiles, rows padded to 344 (NaN), a zero-filled slice
        (2, 37, 256, True),  # 96-column tiles, cin a multiple of 64, a residual, partial vertex tile
        (1, 9, 100, False),  # cin 100: 4 slices, the last partly zero-filled, all 192 columns per tile
    ],
)
@pytest.mark.parametrize("operands", ["fp16", "bf16"])
def test_input_side_mixing_layer_against_float64(cp, hopper, operands, b, n, cin, with_residual):
    """Every output element within one unit in the last place of the 16-bit output (half a unit is
    its own rounding), plus the float32 accumulation bound, of the float64 layer of the same
    operands, on the template's A1 sparsity (the kernel keeps W's columns in another order in shared
    memory, so a column written to the wrong place fails here); and within the 16-bit rounding of
    the output-side mixing kernel (wg_drb_layer, the layer without Z's rounding) on the same inputs."""
    from xmesh.backends.cupy_backend.hopper import activation_dtype, mixing_source, widen16

    a1, x16, w, bias, res16 = layer_case(cp, operands, b, n, cin, with_residual, seed=n + cin + len(operands))
    stacked = hopper.prepare(cp.asarray(w), operands)
    mixing = mixing_source(a1)
    poison = cp.full(b * 43 * n * 192, np.nan, dtype=cp.float32)  # the pool hands this memory out next
    del poison
    out = reference_layer16(hopper, x16, stacked, cp.asarray(bias), res16, mixing)
    assert out.dtype == activation_dtype(cp, operands) and out.shape == (b, 43, n, 192)
    got = widen16(cp, out, operands).get().astype(np.float64)
    assert np.isfinite(got).all() and (got != 0).mean() > 0.4

    x = widen16(cp, x16, operands).get()
    res = None if res16 is None else widen16(cp, res16, operands).get()
    ref, bound = float64_layer16(x, w, a1, bias, res, operands)
    excess = np.abs(got - ref) / (unit_in_last_place(ref, operands) + bound)
    assert excess.max() <= 1.0, (excess.max(), np.unravel_index(excess.argmax(), excess.shape))

    unit = 2.0 ** (-11 if operands == "fp16" else -8)
    exact = drb_reference(x, round16(w, operands), a1, bias, res)  # no rounding of Z
    assert rel_error(got, exact) < 2 * unit
    output_side = hopper.drb_layer(
        x16,
        hopper.prepare(cp.asarray(w), operands, paired=True),
        cp.asarray(a1),
        cp.asarray(bias),
        res16,
        mixing=mixing,
        out16=True,
    )
    assert rel_error(got, widen16(cp, output_side, operands).get()) < 2 * unit


def test_input_side_mixing_layer_refuses_what_it_cannot_run(cp, hopper):
    """reference_layer16 names what is wrong: no mixing source, a float32 X, a paired weight, cin above 384,
    a residual of the wrong type or not 16-byte aligned."""
    from xmesh.backends.cupy_backend.hopper import mixing_source

    a1, x16, w, bias, res16 = layer_case(cp, "fp16", 1, 5, 192, True, seed=1)
    mixing = mixing_source(a1)
    stacked = hopper.prepare(cp.asarray(w), "fp16")
    bias = cp.asarray(bias)
    with pytest.raises(ValueError, match="no mixing source"):
        reference_layer16(hopper, x16, stacked, bias, res16, "")
    with pytest.raises(ValueError, match="needs 16-bit X"):
        reference_layer16(hopper, x16.astype(cp.float32), stacked, bias, res16, mixing)
    with pytest.raises(ValueError, match="paired=True"):
        reference_layer16(hopper, x16, hopper.prepare(cp.asarray(w), "fp16", paired=True), bias, res16, mixing)
    wide = hopper.prepare(cp.asarray(np.concatenate([w, w, w[:8]])), "fp16")
    with pytest.raises(ValueError, match="cin up to 384"):
        reference_layer16(hopper, cp.concatenate([x16, x16, x16[..., :8]], axis=-1), wide, bias, res16, mixing)
    with pytest.raises(ValueError, match="residual must be"):
        reference_layer16(hopper, x16, stacked, bias, res16.astype(cp.float32), mixing)
    shifted = cp.empty(res16.size + 1, dtype=res16.dtype)[1:].reshape(res16.shape)  # 2 bytes off
    shifted[...] = res16
    with pytest.raises(ValueError, match="16-byte aligned"):
        reference_layer16(hopper, x16, stacked, bias, shifted, mixing)
    with pytest.raises(ValueError, match="activations"):
        reference_layer16(hopper, x16.view(cp.uint16), stacked, bias, None, mixing)
