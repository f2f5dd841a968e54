"""xmesh's tensor-core GEMM (kernels/tc_gemm.cu) against float64 products (GPU; skipped without CUDA).

3xTF32 ("fp32" mode) must be as accurate as a float32 product; one TF32 pass ("tf32") must be
within TF32's error and measurably less accurate (so the two kernels are not the same code path).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import requires_cuda

pytestmark = [requires_cuda, pytest.mark.gpu]

SHAPES = [  # (M, K, N): tile edges, odd K (single-float copies), narrow N, the model's shapes
    (1, 3, 1),
    (37, 27, 16),
    (128, 16, 64),
    (129, 17, 65),
    (300, 339, 384),
    (1000, 192, 2),
    (2466, 192, 384),
    (777, 1152, 256),
    (5000, 144, 32),
    (300, 100, 24),
    (129, 17, 9),  # 32/16-wide tiles
    (64, 4608, 512),
    (588, 6400, 256),
    (147, 4612, 512),  # few tiles, long K: split-K path
    (156, 192, 384),
    (156, 963, 384),  # under 24 tiles: K split into 32-wide parts
    (2466, 192, 256),  # fewer 128-wide tiles than SMs: 64-wide ones
]


def rel_error(got, ref):
    return float(np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref))


def operands(rng, m, k, n):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    return a, b


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_3xtf32_is_as_accurate_as_float32(cp, gb, m, k, n):
    rng = np.random.default_rng(m * 7 + k * 3 + n)
    a, b = operands(rng, m, k, n)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    out = cp.full((m, n), np.nan, dtype=cp.float32)  # poison: every element must be written
    gb.gemm(cp.asarray(a), cp.asarray(b), out=out, passes=3)
    got = out.get()
    assert np.isfinite(got).all()
    f32 = rel_error(a @ b, ref)  # NumPy's float32 product
    err = rel_error(got, ref)
    assert err <= 4 * f32 + 1e-7, (err, f32)


@pytest.mark.parametrize(
    "m,n,passes,bk", [(156, 384, 3, 32), (2466, 384, 3, 32), (40000, 384, 3, 16), (156, 384, 1, 16)]
)
def test_few_tile_products_take_wider_k_slices(cp, gb, monkeypatch, m, n, passes, bk):
    """A 3xTF32 product with fewer tiles than two a multiprocessor (stage 1's graph convolutions at
    small batch in fp32) runs the kernel built for 32-wide K slices; a larger one, or one TF32 pass, the
    16-wide build; as accurate as float32 in 3xTF32, within TF32's error in one pass (the Hopper kernel
    kept out, as on other GPUs)."""
    monkeypatch.setattr(gb, "hopper", None)
    rng = np.random.default_rng(m)
    a, b = operands(rng, m, 192, n)
    launched = []
    real = gb._gemm_kernel
    monkeypatch.setattr(gb, "_gemm_kernel", lambda name, bn, k=16: (launched.append((name, k)), real(name, bn, k))[1])
    out = gb.gemm(cp.asarray(a), cp.asarray(b), passes=passes).get()
    assert [k for _, k in launched] == [bk] and launched[0][0].startswith(f"gemm_{passes}x_")
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err, f32 = rel_error(out, ref), rel_error(a @ b, ref)
    assert err <= (4 * f32 + 1e-7 if passes == 3 else 3e-3), (err, f32)


@pytest.mark.parametrize("m,k,n", [(2466, 192, 384), (300, 339, 384), (129, 17, 65)])
def test_one_tf32_pass_has_tf32_error(cp, gb, m, k, n):
    rng = np.random.default_rng(k)
    a, b = operands(rng, m, k, n)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    got = gb.gemm(cp.asarray(a), cp.asarray(b), passes=1).get()
    err = rel_error(got, ref)
    assert 3e-5 < err < 3e-3, err


def check_strided_bias_relu(cp, product, m, k, n, relu, seed, a_offset, c_offset, lda):
    """product(a, b, out, bias, relu) on A and C as row-strided views (lda > K, ldc > N) with bias
    and ReLU: the product is right and C's other columns stay untouched."""
    rng = np.random.default_rng(seed)
    big_a = rng.standard_normal((m, lda)).astype(np.float32)
    b = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    c = cp.full((m, n + c_offset + 20), 7.0, dtype=cp.float32)
    product(
        cp.asarray(big_a)[:, a_offset : a_offset + k],
        cp.asarray(b),
        c[:, c_offset : c_offset + n],
        cp.asarray(bias),
        relu,
    )
    ref = big_a[:, a_offset : a_offset + k].astype(np.float64) @ b + bias
    if relu:
        ref = np.maximum(ref, 0.0)
    got = c.get()
    np.testing.assert_allclose(got[:, c_offset : c_offset + n], ref, rtol=1e-5, atol=1e-5)
    assert (got[:, :c_offset] == 7.0).all() and (got[:, c_offset + n :] == 7.0).all()


@pytest.mark.parametrize("relu", [False, True])
def test_strided_views_bias_and_relu(cp, gb, relu):
    m, k = (200, 1000) if relu else (517, 50)  # relu: split-K, bias and ReLU applied by the reduction
    check_strided_bias_relu(
        cp,
        lambda a, b, out, bias, r: gb.gemm(a, b, out=out, bias=bias, relu=r),
        m,
        k,
        72,
        relu,
        seed=3 + relu,
        a_offset=3,
        c_offset=10,
        lda=k + 14,
    )


def test_fresh_inputs_each_call(cp, gb):
    """Two calls on new data give each its own product (no stale shared-memory or cached state)."""
    rng = np.random.default_rng(11)
    for _ in range(2):
        a, b = operands(rng, 700, 96, 128)
        got = gb.gemm(cp.asarray(a), cp.asarray(b)).get()
        np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def test_bad_operands_are_refused(cp, gb):
    from xmesh.errors import InputError

    with pytest.raises(InputError, match="do not multiply"):
        gb.gemm(cp.ones((4, 3), cp.float32), cp.ones((4, 3), cp.float32))
    with pytest.raises(InputError, match="float32"):
        gb.gemm(cp.ones((4, 3), cp.float64), cp.ones((3, 3), cp.float32))


# ---------------------------------------------------------------- implicit-GEMM convolution
def conv_same(x, w, b, stride, dtype):
    """TF-style 'SAME' convolution + bias + ReLU of NHWC x, summed tap by tap in ``dtype``."""
    n, h, wd, _ = x.shape
    kh, kw, _, cout = w.shape
    ho, wo = -(-h // stride), -(-wd // stride)
    pad_h, pad_w = max((ho - 1) * stride + kh - h, 0), max((wo - 1) * stride + kw - wd, 0)
    xp = np.pad(x.astype(dtype), ((0, 0), (pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
    out = np.zeros((n, ho, wo, cout), dtype)
    for dy in range(kh):
        for dx in range(kw):
            patch = xp[:, dy : dy + stride * (ho - 1) + 1 : stride, dx : dx + stride * (wo - 1) + 1 : stride]
            out += patch @ w[dy, dx].astype(dtype)
    return np.maximum(out + b.astype(dtype), 0)


CONV_CASES = [  # (images, size, cin, cout, kernel, stride): the CNN's layer kinds, row and column tails
    (2, 17, 16, 16, 3, 1),
    (3, 56, 32, 64, 3, 2),
    (2, 9, 48, 24, 3, 1),
    (4, 28, 64, 128, 3, 1),
    (1, 14, 128, 256, 5, 2),
    (1, 7, 512, 512, 3, 1),  # few tiles, long K: split K
]


@pytest.mark.parametrize("images,size,cin,cout,kernel,stride", CONV_CASES)
def test_implicit_gemm_conv_is_as_accurate_as_float32(cp, gb, images, size, cin, cout, kernel, stride):
    """Convolutions with 16k input channels read the input directly (conv_* kernels, no im2col
    buffer) and match a float64 convolution as closely as a float32 one does."""
    from xmesh.backends.cupy_backend.gemm import _tile_width

    rng = np.random.default_rng(size * cin + cout)
    x = rng.standard_normal((images, size, size, cin)).astype(np.float32)
    w = (rng.standard_normal((kernel, kernel, cin, cout)) / np.sqrt(kernel * kernel * cin)).astype(np.float32)
    b = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    ref = conv_same(x, w, b, stride, np.float64)
    got = gb.conv2d_same(cp.asarray(x), cp.asarray(w), cp.asarray(b), stride).get()
    assert got.shape == ref.shape
    f32 = rel_error(conv_same(x, w, b, stride, np.float32), ref)
    err = rel_error(got, ref)
    assert err <= 4 * f32 + 1e-7, (err, f32)
    assert (f"conv_3x_n{_tile_width(cout)}", 16) in gb._gemm_kernels  # the implicit kernel ran, not im2col + GEMM


def test_implicit_gemm_conv_tf32_mode_has_tf32_error(cp):
    from xmesh.backends import get_backend

    tf32 = get_backend("cupy", precision="tf32")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 28, 28, 64)).astype(np.float32)
    w = (rng.standard_normal((3, 3, 64, 128)) / 24.0).astype(np.float32)
    b = np.zeros(128, np.float32)
    got = tf32.conv2d_same(cp.asarray(x), cp.asarray(w), cp.asarray(b), 1).get()
    assert ("conv_1x_n128", 16) in tf32._gemm_kernels
    assert 3e-5 < rel_error(got, conv_same(x, w, b, 1, np.float64)) < 3e-3


# ---------------------------------------------------------------- the Hopper (wgmma) kernel
HOPPER_SHAPES = [  # (M, K, N): row, K and column tails; odd K; long K (many slice flushes); the DRB's
    (1, 3, 1),
    (129, 17, 130),
    (300, 339, 384),
    (1000, 33, 128),
    (2466, 192, 384),
    (5000, 1152, 256),
    (64, 4608, 512),
]


@pytest.mark.parametrize("m,k,n", HOPPER_SHAPES)
@pytest.mark.parametrize("aligned", [True, False])
def test_hopper_3xtf32_is_as_accurate_as_float32(cp, hopper, m, k, n, aligned):
    """16-byte copies of A (aligned rows) and single-float copies (A starting one float in)."""
    rng = np.random.default_rng(m * 5 + k * 3 + n + aligned)
    a, b = operands(rng, m, k, n)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    if aligned:
        a_dev = cp.asarray(a)
    else:
        a_dev = cp.asarray(np.pad(a, ((0, 0), (1, 0))))[:, 1:]
        assert a_dev.data.ptr % 16 != 0
    out = cp.full((m, n), np.nan, dtype=cp.float32)
    hopper(a_dev, hopper.prepare(cp.asarray(b), "3xtf32"), out)
    got = out.get()
    assert np.isfinite(got).all()
    err, f32 = rel_error(got, ref), rel_error(a @ b, ref)
    assert err <= 4 * f32 + 1e-7, (err, f32)


@pytest.mark.parametrize("m,k,n", [(2466, 192, 384), (300, 339, 384), (129, 17, 130)])
def test_hopper_one_tf32_pass_has_tf32_error(cp, hopper, m, k, n):
    rng = np.random.default_rng(k + 1)
    a, b = operands(rng, m, k, n)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    out = cp.full((m, n), np.nan, dtype=cp.float32)
    got = hopper(cp.asarray(a), hopper.prepare(cp.asarray(b), "tf32"), out).get()
    err = rel_error(got, ref)
    assert 3e-5 < err < 3e-3, err


@pytest.mark.parametrize("relu", [False, True])
def test_hopper_strided_views_bias_and_relu(cp, hopper, relu):
    check_strided_bias_relu(
        cp,
        lambda a, b, out, bias, r: hopper(a, hopper.prepare(b, "3xtf32"), out, bias=bias, relu=r),
        700,
        200,
        130,
        relu,
        seed=7 + relu,
        a_offset=4,
        c_offset=9,
        lda=212,
    )  # 16-byte copies of the strided rows


def test_large_products_route_to_hopper_and_weights_are_prepared_once(cp, gb, hopper, monkeypatch):
    """A product with enough output tiles goes to the wgmma kernel; with a cache_key the weight's
    prepared form is built once; a small product stays on the mma.sync kernel."""
    prepared = []
    original = hopper.prepare
    monkeypatch.setattr(
        hopper, "prepare", lambda b, operands, paired=False: prepared.append(operands) or original(b, operands, paired)
    )
    rng = np.random.default_rng(21)
    a, b = operands(rng, 40000, 192, 384)
    weight = cp.asarray(b)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    for _ in range(2):
        out = cp.full((40000, 384), np.nan, dtype=cp.float32)
        got = gb.gemm(cp.asarray(a), weight, out=out, cache_key=weight).get()
        assert rel_error(got, ref) <= 4 * rel_error(a @ b, ref) + 1e-7
    assert prepared == ["3xtf32"]
    gb.gemm(cp.asarray(a[:300]), weight)
    assert prepared == ["3xtf32"]


def drb_reference(x, w, a1, bias, residual):
    """relu(X W0 + A1 (X W1) + bias) (+ residual) in float64; X (B, 43, N, cin), w = [W0 | W1]."""
    cout = w.shape[1] // 2
    y = x.astype(np.float64) @ w.astype(np.float64)
    mixed = np.einsum("ij,bjnc->binc", a1.astype(np.float64), y[..., cout:])
    out = np.maximum(y[..., :cout] + mixed + bias, 0.0)
    return out if residual is None else out + residual


def round16(x, operands):
    """float32 x rounded to nearest even float16 ("fp16") or bfloat16 ("bf16"), back in float32."""
    x = np.asarray(x, dtype=np.float32)
    if operands == "fp16":
        return x.astype(np.float16).astype(np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


@pytest.mark.parametrize(
    "cin,cout,n,with_residual", [(192, 192, 10, True), (339, 64, 7, False), (33, 32, 4, True), (192, 192, 101, True)]
)  # 306 tiles: blocks take several
@pytest.mark.parametrize("operands", ["3xtf32", "tf32", "fp16", "bf16"])
def test_hopper_deformation_layer(cp, hopper, cin, cout, n, with_residual, operands):
    """The fused layer (product, 43 x 43 mixing, bias, ReLU, residual) against float64: float32
    accuracy with 3xTF32, TF32 error with one pass; in the 16-bit modes exactly the float64 layer of
    X and W rounded to float16 / bfloat16, to float32 accumulation accuracy. Vertex counts that
    leave a partial tile, single float copies (cin = 339, 33), every output written (the output's
    memory is poisoned first), more tiles than multiprocessors (n = 101: a persistent block runs several)."""
    rng = np.random.default_rng(cin + cout + n + len(operands))
    b = 2
    x = rng.standard_normal((b, 43, n, cin)).astype(np.float32)
    w = (rng.standard_normal((cin, 2 * cout)) / np.sqrt(cin)).astype(np.float32)
    a1 = (rng.standard_normal((43, 43)) / 6).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32) * 0.1
    residual = rng.standard_normal((b, 43, n, cout)).astype(np.float32) if with_residual else None
    ref = drb_reference(x, w, a1, bias, residual)
    poison = cp.full(b * 43 * n * cout, np.nan, dtype=cp.float32)  # the pool hands this memory out next
    del poison
    got = hopper.drb_layer(
        cp.asarray(x),
        hopper.prepare(cp.asarray(w), operands, paired=True),
        cp.asarray(a1),
        cp.asarray(bias),
        None if residual is None else cp.asarray(residual),
    ).get()
    assert np.isfinite(got).all()
    err = rel_error(got, ref)

    def float32_error(x, w):
        """The layer in float32 arithmetic (NumPy) against float64, on the same operands."""
        y32 = x @ w
        out32 = np.maximum(y32[..., :cout] + np.einsum("ij,bjnc->binc", a1, y32[..., cout:]) + bias, 0)
        exact = drb_reference(x, w, a1, bias, residual)
        return rel_error(out32 if residual is None else out32 + residual, exact), exact

    if operands == "3xtf32":
        f32, _ = float32_error(x, w)
        assert err <= 4 * f32 + 1e-7, (err, f32)
    elif operands == "tf32":
        assert 3e-5 < err < 3e-3, err
    else:
        f32, rounded_ref = float32_error(round16(x, operands), round16(w, operands))
        err_rounded = rel_error(got, rounded_ref)
        assert err_rounded <= 4 * f32 + 1e-7, (err_rounded, f32)
        low, high = (1e-5, 2e-3) if operands == "fp16" else (1e-4, 1e-2)  # unit roundoff 2^-11, 2^-8
        assert low < err < high, err


def to16(cp, x, operands):
    """float32 NumPy x rounded to nearest even in the mode's 16 bits, as the activations' CuPy array
    (float16, or uint16 holding bfloat16 bits)."""
    rounded = round16(x, operands)
    if operands == "fp16":
        return cp.asarray(rounded.astype(np.float16))
    return cp.asarray((rounded.view(np.uint32) >> 16).astype(np.uint16))


@pytest.mark.parametrize("cin,cout,n", [(192, 192, 10), (40, 64, 7), (192, 192, 101)])
@pytest.mark.parametrize("operands", ["fp16", "bf16"])
def test_16bit_activations_in_and_out(cp, hopper, cin, cout, n, operands):
    """The 16-bit modes' layers with 16-bit activations: the output (out16) is the float32 kernel's
    output rounded once to nearest even, bit for bit, when the float32 kernel gets the same residual
    widened; X given in 16 bits (wgmma reads it from shared memory) gives exactly what the float32 X
    of the same values gives (the float32 path rounds X to the same 16-bit values in registers).
    Partial vertex tiles (n = 10, 7), a K tail (cin = 40), persistent blocks running several tiles."""
    from xmesh.backends.cupy_backend.hopper import activation_dtype, widen16

    rng = np.random.default_rng(cin + n + len(operands))
    b = 2
    x = rng.standard_normal((b, 43, n, cin)).astype(np.float32)
    w = cp.asarray((rng.standard_normal((cin, 2 * cout)) / np.sqrt(cin)).astype(np.float32))
    a1 = cp.asarray((rng.standard_normal((43, 43)) / 6).astype(np.float32))
    bias = cp.asarray(rng.standard_normal(cout).astype(np.float32) * 0.1)
    weight = hopper.prepare(w, operands, paired=True)
    res16 = to16(cp, rng.standard_normal((b, 43, n, cout)).astype(np.float32), operands)
    x16 = to16(cp, x, operands)

    out32 = hopper.drb_layer(cp.asarray(x), weight, a1, bias, widen16(cp, res16, operands)).get()
    out16 = hopper.drb_layer(cp.asarray(x), weight, a1, bias, res16, out16=True)
    assert out16.dtype == activation_dtype(cp, operands) and out16.shape == (b, 43, n, cout)
    got = widen16(cp, out16, operands).get()
    assert np.isfinite(got).all() and (got != 0).mean() > 0.4
    np.testing.assert_array_equal(got, round16(out32, operands))

    from_x16 = hopper.drb_layer(x16, weight, a1, bias, res16, out16=True)
    assert ("wg_drb_layer_" + ("f16" if operands == "fp16" else "bf16") + "_h16", "") in hopper._kernels
    np.testing.assert_array_equal(widen16(cp, from_x16, operands).get(), got)
    ref = drb_reference(
        round16(x, operands), round16(w.get(), operands), a1.get(), bias.get(), widen16(cp, res16, operands).get()
    )
    unit = 2.0 ** (-11 if operands == "fp16" else -8)  # the output's own rounding
    assert rel_error(got, ref) < 2 * unit


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_narrow_layer_reads_16bit_activations(cp, hopper, precision):
    """The narrow last layer of a block (cout = 1) in a 16-bit mode takes the 16-bit output of the
    layer before it as it is (skinny_gemm16: float32 sums, no widened copy) and computes the layer of
    those values to float32 accuracy; the X W product equals float64's to float32 rounding."""
    from types import SimpleNamespace

    from xmesh.backends import get_backend
    from xmesh.backends.cupy_backend.hopper import widen16

    be = get_backend("cupy", precision=precision)
    rng = np.random.default_rng(11)
    x16 = to16(cp, rng.standard_normal((2, 43, 37, 192)).astype(np.float32), precision)
    xw = widen16(cp, x16, precision).get().astype(np.float64)
    w = (rng.standard_normal((192, 2)) / 14).astype(np.float32)
    layer = SimpleNamespace(
        weight=cp.asarray(w), bias=cp.asarray(np.array([0.05], np.float32)), cout=1, weight0=None, relu=True
    )
    a1 = (rng.standard_normal((43, 43)) / 6).astype(np.float32)
    y = be._skinny16(x16, layer.weight)
    assert y is not None and y.shape == (2 * 43 * 37, 2)
    exact = xw.reshape(-1, 192) @ w.astype(np.float64)
    assert rel_error(y.get(), exact) < 1e-6
    got = be.op_local_gconv(layer, x16, cp.asarray(a1)).get()
    assert got.dtype == np.float32 and got.shape == (2, 43, 37, 1)
    ref = drb_reference(xw, w, a1, layer.bias.get(), None)
    assert rel_error(got, ref) < 1e-5


def test_16bit_activations_are_checked(cp, hopper):
    """16-bit X or output belong to the 16-bit modes, the residual must then be 16-bit too, and a
    16-bit X needs 16-byte aligned rows: each refused with a message saying what was wrong."""
    rng = np.random.default_rng(2)
    b, n, cin, cout = 1, 5, 48, 32
    x = cp.asarray(rng.standard_normal((b, 43, n, cin)).astype(np.float32))
    w = cp.asarray((rng.standard_normal((cin, 2 * cout)) / 7).astype(np.float32))
    a1 = cp.asarray(np.eye(43, dtype=np.float32))
    bias = cp.zeros(cout, dtype=cp.float32)
    tf32, fp16 = hopper.prepare(w, "tf32", paired=True), hopper.prepare(w, "fp16", paired=True)
    with pytest.raises(ValueError, match="needs a 16-bit mode"):
        hopper.drb_layer(x, tf32, a1, bias, out16=True)
    with pytest.raises(ValueError, match="needs a 16-bit mode"):
        hopper.drb_layer(x.astype(cp.float16), fp16, a1, bias)
    with pytest.raises(ValueError, match="residual must be float16"):
        hopper.drb_layer(x, fp16, a1, bias, cp.zeros((b, 43, n, cout), dtype=cp.float32), out16=True)
    with pytest.raises(ValueError, match="activations are float16"):
        hopper.drb_layer(x.astype(cp.uint16), fp16, a1, bias, out16=True)
    padded = cp.zeros((b, 43, n, cin + 4), dtype=cp.float16)[..., :cin]  # rows of 52 elements: not 16-byte aligned
    with pytest.raises(ValueError, match="16-byte aligned rows"):
        hopper.drb_layer(padded, fp16, a1, bias, out16=True)


@pytest.mark.parametrize("operands", ["fp16", "bf16"])
def test_16bit_weights_round_to_nearest_even(cp, hopper, operands):
    """prepare(w, "fp16" / "bf16") holds w's transpose rounded to nearest, ties to even (what NumPy's
    float16 and the bfloat16 bit rule give), zero-padded to whole tiles."""
    rng = np.random.default_rng(3)
    k, n = 40, 130
    w = rng.standard_normal((k, n)).astype(np.float32)
    step = 2.0 ** (-10 if operands == "fp16" else -7)  # spacing of the 16-bit values in [1, 2)
    w[0, :4] = [1 + step / 2, 1 + 3 * step / 2, -(1 + step / 2), 1 + step / 2 + step / 64]  # ties, and a near-tie
    prepared = hopper.prepare(cp.asarray(w), operands)
    assert prepared.big.dtype == cp.uint16 and prepared.big.shape == (256, 64) and prepared.small is None
    bits = prepared.big.get()
    want = round16(w.T, operands)
    if operands == "fp16":
        got = bits[:n, :k].view(np.float16).astype(np.float32)
    else:
        got = (bits[:n, :k].astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[:4, 0], [1.0, 1 + 2 * step, -1.0, 1 + step])
    assert not bits[n:].any() and not bits[:, k:].any()


@pytest.mark.parametrize("pattern", ["template", "dense", "one_row"])
@pytest.mark.parametrize("operands", ["3xtf32", "tf32", "bf16"])
def test_sparse_mixing_kernel_is_bit_identical_to_the_dense_one(cp, hopper, pattern, operands):
    """The layer kernel built for one A1 (zeros skipped, values as immediates) gives exactly the
    dense-A1 kernel's output: on the template's support (20% nonzero), on a dense A1, and on an A1
    with a single nonzero row (the other rows' sums are zero)."""
    from xmesh.backends.cupy_backend.hopper import mixing_source

    rng = np.random.default_rng(len(pattern) + len(operands))
    a1 = (rng.standard_normal((43, 43)) / 6).astype(np.float32)
    if pattern == "template":
        a1 *= template_support_mask()
    elif pattern == "one_row":
        a1[np.arange(43) != 5] = 0.0
    b, n, cin, cout = 2, 150, 192, 64  # 152 tiles: the persistent kernel's blocks take one or two
    x = cp.asarray(rng.standard_normal((b, 43, n, cin)).astype(np.float32))
    weight = hopper.prepare(
        cp.asarray((rng.standard_normal((cin, 2 * cout)) / 14).astype(np.float32)), operands, paired=True
    )
    bias = cp.asarray(rng.standard_normal(cout).astype(np.float32) * 0.1)
    residual = cp.asarray(rng.standard_normal((b, 43, n, cout)).astype(np.float32))
    dense = hopper.drb_layer(x, weight, cp.asarray(a1), bias, residual).get()
    sparse = hopper.drb_layer(x, weight, cp.asarray(a1), bias, residual, mixing=mixing_source(a1)).get()
    assert np.isfinite(dense).all()
    np.testing.assert_array_equal(sparse, dense)


def test_deformation_layer_reads_padded_rows(cp, hopper):
    """X with rows padded to 340 floats (how the local projection hands the 339 features over) runs
    the 16-byte-copy kernel and gives exactly what the contiguous X gives through the single-float one."""
    from xmesh.backends.cupy_backend.hopper import hypothesis_rows

    rng = np.random.default_rng(17)
    b, n, cin, cout = 1, 30, 339, 64
    padded = cp.asarray(rng.standard_normal((b, 43, n, 340)).astype(np.float32))
    x = padded[..., :cin]
    assert hypothesis_rows(cp, x) is x and not x.flags.c_contiguous
    dense = cp.ascontiguousarray(x)
    weight = hopper.prepare(
        cp.asarray((rng.standard_normal((cin, 2 * cout)) / 18).astype(np.float32)), "3xtf32", paired=True
    )
    a1 = cp.asarray((rng.standard_normal((43, 43)) / 6).astype(np.float32))
    bias = cp.asarray(rng.standard_normal(cout).astype(np.float32) * 0.1)
    got = hopper.drb_layer(x, weight, a1, bias).get()
    assert ("wg_drb_layer_3x_v", "") in hopper._kernels
    np.testing.assert_array_equal(got, hopper.drb_layer(dense, weight, a1, bias).get())
    assert ("wg_drb_layer_3x_s", "") in hopper._kernels
    with pytest.raises(ValueError, match="evenly spaced rows"):
        hopper.drb_layer(
            cp.asarray(rng.standard_normal((b, 43, n, 2 * cin)).astype(np.float32))[..., ::2], weight, a1, bias
        )


def template_support_mask():
    """Where the golden template's deformation-block support A1 is nonzero (else a mask of the same
    density: a dense first row, 7-8 entries in the others)."""
    from xmesh.benchmarking import default_template

    template, source = default_template()
    mask = np.asarray(template.sample_cheb[1]) != 0
    if mask.sum() < 43 * 43 // 2:
        return mask
    rng = np.random.default_rng(0)
    mask = rng.random((43, 43)) < 0.17
    mask[0] = True
    return mask


def test_backend_deformation_layer_uses_the_fused_kernel(cp, gb, hopper, monkeypatch):
    """CupyBackend.op_local_gconv on a 192-wide layer runs a fused Hopper kernel built for its A1 (the
    fp32 mode's three-float16-products layer, drb_layer_3xf16, or with fp32_halves off the 3xTF32
    output-side one, drb_layer), each agreeing with the GEMM + mixing-kernel path of other GPUs to
    float32 rounding."""
    from types import SimpleNamespace

    from xmesh.backends.cupy_backend.hopper import mixing_source

    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 43, 50, 192)).astype(np.float32)
    layer = SimpleNamespace(
        weight=cp.asarray((rng.standard_normal((192, 384)) / 14).astype(np.float32)),
        bias=cp.asarray(rng.standard_normal(192).astype(np.float32) * 0.1),
        cout=192,
        weight0=None,
        relu=True,
    )
    a1 = cp.asarray((rng.standard_normal((43, 43)) / 6).astype(np.float32))
    calls = []
    halves_layer, tf32_layer = hopper.drb_layer_3xf16, hopper.drb_layer
    monkeypatch.setattr(
        hopper, "drb_layer_3xf16", lambda *args: calls.append(("halves", args[4])) or halves_layer(*args)
    )
    monkeypatch.setattr(
        hopper, "drb_layer", lambda *args, **kw: calls.append(("3xtf32", kw["mixing"])) or tf32_layer(*args, **kw)
    )
    fused = gb.op_local_gconv(layer, cp.asarray(x), a1).get()
    monkeypatch.setattr(gb, "fp32_halves", False)
    fused_3x = gb.op_local_gconv(layer, cp.asarray(x), a1).get()
    monkeypatch.setattr(gb, "hopper", None)
    unfused = gb.op_local_gconv(layer, cp.asarray(x), a1).get()
    source = mixing_source(a1.get())  # the kernels built for this A1
    assert calls == [("halves", source), ("3xtf32", source)]
    ref = drb_reference(x, layer.weight.get(), a1.get(), layer.bias.get(), None)
    for got in (fused, fused_3x, unfused):
        assert rel_error(got, ref) < 1e-6
        np.testing.assert_allclose(got, unfused, rtol=1e-5, atol=1e-5)


def test_hopper_kernels_can_be_switched_off(cp, hopper, monkeypatch):
    """XMESH_HOPPER_GEMM=0 (docs/gpu.md): a new backend keeps every product on the mma.sync kernel."""
    from xmesh.backends.cupy_backend import CupyBackend

    monkeypatch.setenv("XMESH_HOPPER_GEMM", "0")
    plain = CupyBackend()
    assert plain.hopper is None
    rng = np.random.default_rng(31)
    a, b = operands(rng, 40000, 192, 384)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert rel_error(plain.gemm(cp.asarray(a), cp.asarray(b)).get(), ref) <= 4 * rel_error(a @ b, ref) + 1e-7
