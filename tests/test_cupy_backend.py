"""The CuPy backend against the NumPy backend and the model's own array-API code (GPU; skipped without CUDA).

Pixel choices are discontinuous (stage 1 truncates pixel positions, stage 2 takes floor/ceil), so a
last-bit difference in a GEMM upstream can move one sample to a neighbouring pixel. The end-to-end
checks therefore allow a small fraction of vertices (GPU_MAX_FRACTION) to differ by more than
GPU_ATOL (tests/tolerance.py); two runs on the GPU (a batch and lone samples, a CUDA graph and
eager kernels) by more than VERTEX_ATOL; the projection kernels themselves must match their references exactly in
pixel choice (checked on random points with identical inputs).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from conftest import requires_cuda
from tolerance import GPU_ATOL, GPU_MAX_FRACTION, VERTEX_ATOL, assert_mostly_within
from xmesh.errors import BackendUnavailableError, InputError

gpu = [requires_cuda, pytest.mark.gpu]


def test_missing_cupy_names_what_to_install(monkeypatch):
    from xmesh.backends.cupy_backend import CupyBackend

    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` now raises ImportError
    with pytest.raises(BackendUnavailableError) as info:
        CupyBackend()
    message = str(info.value)
    assert "pip install cupy-cuda12x" in message and "xmesh-p2mpp[cupy]" in message


def test_unknown_precision_is_rejected():
    from xmesh.backends.cupy_backend import CupyBackend
    from xmesh.errors import InputError

    with pytest.raises(InputError, match="precision"):
        CupyBackend(precision="bf8")


# --------------------------------------------------------------------------- fixtures (GPU)
@pytest.fixture(scope="module")
def ref_gb():
    """A second CuPy backend whose fast paths are switched off: the model's array-API code on the GPU."""
    from xmesh.backends.cupy_backend import CupyBackend
    from xmesh.ops import ReferenceOnly

    return ReferenceOnly(CupyBackend())


def random_cameras(rng, batch, views=3):
    rows = np.zeros((batch, views, 5), np.float32)
    rows[..., 0] = rng.uniform(0, 360, (batch, views))
    rows[..., 1] = rng.uniform(15, 35, (batch, views))
    rows[..., 3] = rng.uniform(0.7, 0.9, (batch, views))
    rows[..., 4] = 25.0
    return rows


def random_points(rng, batch, n):
    pts = rng.uniform(-0.25, 0.25, (batch, n, 3)).astype(np.float32)
    pts[..., 2] -= 0.8
    return pts


# --------------------------------------------------------------------------- fast paths
@pytest.mark.parametrize("quirk", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_graph_projection_kernel_equals_reference(cp, gb, ref_gb, quirk, seed):
    from xmesh.backends import get_backend
    from xmesh.model.projection import DeviceTransforms, graph_projection

    rng = np.random.default_rng(seed)
    batch, n = 2, 618
    cams = random_cameras(rng, batch)
    coords = random_points(rng, batch, n)
    maps = [
        rng.standard_normal((batch * 3, s, s, c)).astype(np.float32)
        for s, c in ((56, 64), (28, 128), (14, 256), (7, 512))
    ]
    out = gb.to_numpy(
        graph_projection(
            gb, cp.asarray(coords), [cp.asarray(m) for m in maps], DeviceTransforms.from_cameras(gb, cams), quirk
        )
    )
    ref = ref_gb.to_numpy(
        graph_projection(
            ref_gb,
            cp.asarray(coords),
            [cp.asarray(m) for m in maps],
            DeviceTransforms.from_cameras(ref_gb, cams),
            quirk,
        )
    )
    assert out.shape == (batch, n, 2883) and np.isfinite(out).all()
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    cpu = get_backend("numpy")
    host = graph_projection(cpu, coords, maps, DeviceTransforms.from_cameras(cpu, cams), quirk)
    np.testing.assert_allclose(out, host, rtol=1e-6, atol=1e-6)
    if quirk:  # view 0's maps alone (what stage 1 computes with the quirk): the same values
        view0 = [cp.asarray(m.reshape((batch, 3) + m.shape[1:])[:, 0]) for m in maps]
        alone = gb.to_numpy(
            graph_projection(gb, cp.asarray(coords), view0, DeviceTransforms.from_cameras(gb, cams), quirk)
        )
        np.testing.assert_array_equal(alone, out)
    # the tiled kernel (taken above: channel counts a multiple of 4) against a thread per channel, bit for bit
    gb.tiled_graph_projection = False
    try:
        per_channel = gb.to_numpy(
            graph_projection(
                gb, cp.asarray(coords), [cp.asarray(m) for m in maps], DeviceTransforms.from_cameras(gb, cams), quirk
            )
        )
    finally:
        gb.tiled_graph_projection = True
    np.testing.assert_array_equal(out, per_channel)


@pytest.mark.parametrize("seed,channels", [(0, (16, 32, 64)), (1, (16, 32, 64)), (2, (3, 8, 5))])
def test_local_projection_kernel_equals_reference(cp, gb, ref_gb, seed, channels):
    """The model's channel counts take the tiled kernel (a block per 32 points: with 5031 points a
    sample, one block straddles the two samples and the last is partial), others the 1-channel one."""
    from xmesh.backends import get_backend
    from xmesh.model.projection import DeviceTransforms, local_projection, pad_maps

    rng = np.random.default_rng(10 + seed)
    batch, n = 2, 5031
    cams = random_cameras(rng, batch)
    pts = random_points(rng, batch, n)
    pts[0, :8] = [[0, 0, -0.8]] * 8  # on-axis points: h = w = 112 exactly (integer: zero-weight quirk)
    maps = [rng.standard_normal((batch * 3, s, s, c)).astype(np.float32) for s, c in zip((224, 112, 56), channels)]
    dmaps = pad_maps(gb, [cp.asarray(m) for m in maps])
    out = gb.to_numpy(local_projection(gb, cp.asarray(pts), dmaps, DeviceTransforms.from_cameras(gb, cams)))
    ref = ref_gb.to_numpy(local_projection(ref_gb, cp.asarray(pts), dmaps, DeviceTransforms.from_cameras(ref_gb, cams)))
    assert out.shape == (batch, n, 3 + 3 * sum(channels)) and np.isfinite(out).all()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    cpu = get_backend("numpy")
    host = local_projection(cpu, pts, pad_maps(cpu, maps), DeviceTransforms.from_cameras(cpu, cams))
    np.testing.assert_allclose(out, host, rtol=1e-5, atol=1e-6)


def step16(x, precision):
    """The spacing of the mode's 16-bit numbers (float16 or bfloat16) at float32 x, as float64."""
    x = np.abs(np.asarray(x, dtype=np.float32))
    if precision == "fp16":
        return np.spacing(x.astype(np.float16)).astype(np.float64)
    return np.spacing(x).astype(np.float64) * 2.0**16  # bfloat16 keeps float32's exponent, 8 bits of significand


def assert_rounded16(got16, want32, precision, scale, max_fraction=0.01):
    """got16 (a 16-bit projection's output, widened to float32) is the float32 projection want32 rounded
    to the mode's 16 bits, within the 16-bit kernel's own float32 arithmetic (xm_pool16): each value
    at most half a 16-bit step from want32, plus 2^-20 of the maps' largest magnitude ``scale``; the
    values rounded the other way (near a boundary) a small fraction."""
    from test_tc_gemm import round16

    err = np.abs(got16.astype(np.float64) - want32)
    excess = err - 0.5 * step16(want32, precision)
    other = got16 != round16(want32, precision)
    assert excess.max() <= 2.0**-20 * scale, (
        f"{int((excess > 2.0**-20 * scale).sum())} values beyond half a 16-bit step: up to {excess.max():.3g} over"
    )
    assert other.mean() <= max_fraction, f"{other.mean():.2e} of the values rounded the other way"


@pytest.mark.parametrize(
    "views,channels", [(3, (16, 32, 64)), (2, (16, 32, 64)), (5, (16, 32, 64)), (3, (16, 32, 1024))]
)
def test_tiled_local_projection_equals_the_per_channel_kernel_bit_for_bit(cp, gb, views, channels):
    """The tiled kernel (three views built in, or any count up to 8; up to 224 four-channel groups a
    thread each, or more groups than threads) gives the bits of the one-thread-per-channel kernel.
    1072 channels: float32 rows of 32 points no longer fit in shared memory, so the float32 output
    takes the per-channel kernel, while the 16-bit rows (bf16 mode) still take the tiled one, which
    there gives the per-channel values rounded to 16 bits (assert_rounded16)."""
    from xmesh.backends import get_backend
    from xmesh.backends.cupy_backend.device import THREADS
    from xmesh.backends.cupy_backend.hopper import widen16
    from xmesh.model.projection import DeviceTransforms, local_projection, pad_maps

    rng = np.random.default_rng(50 + views)
    batch, n = 2, 1001  # 1001 points a sample: a block straddles the samples, the last is partial
    cams = random_cameras(rng, batch, views)
    pts = random_points(rng, batch, n)
    pts[1, :5] = [[0, 0, -0.8]] * 5  # on-axis points: the zero-weight quirk
    maps = pad_maps(
        gb,
        [
            cp.asarray(rng.standard_normal((batch * views, s, s, c)).astype(np.float32))
            for s, c in zip((224, 112, 56), channels)
        ],
    )
    tf = DeviceTransforms.from_cameras(gb, cams)
    tiled = cp.ascontiguousarray(local_projection(gb, cp.asarray(pts), maps, tf))
    width = 3 + 3 * sum(channels)
    per_channel = cp.empty((batch, n, width), dtype=cp.float32)
    gb._kernel("local_projection")(
        ((batch * n * sum(channels) + THREADS - 1) // THREADS,),
        (THREADS,),
        (
            cp.asarray(pts),
            tf.packed,
            *maps,
            *[np.int32(m.shape[1] - 1) for m in maps],
            *[np.int32(c) for c in channels],
            np.int32(batch),
            np.int32(n),
            np.int32(views),
            per_channel,
            np.int64(width),
        ),
    )
    assert tiled.shape == (batch, n, width) and float(cp.abs(tiled).max()) > 0
    np.testing.assert_array_equal(tiled.get(), per_channel.get())
    if gb.hopper is not None:  # bf16 keeps float32 maps and writes 16-bit rows
        be = get_backend("cupy", precision="bf16")
        got = cp.ascontiguousarray(local_projection(be, cp.asarray(pts), maps, tf))
        assert_rounded16(
            widen16(cp, got, "bf16").get(), per_channel.get(), "bf16", max(float(cp.abs(m).max()) for m in maps)
        )


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_local_projection_in_16bit_modes_is_the_rounded_float32_one(cp, gb, precision):
    """On an H100/H200 the 16-bit modes' local projection writes its features in the mode's 16 bits
    (rows padded to 344 elements, 16-byte aligned): the float32 kernel's values rounded once to
    nearest even (what the block's first layer rounds its X to anyway), but for values within a few
    float32 ulps of a rounding boundary (assert_rounded16); the coordinates exactly so."""
    from test_tc_gemm import round16
    from xmesh.backends import get_backend
    from xmesh.backends.cupy_backend.hopper import activation_dtype, widen16
    from xmesh.model.projection import DeviceTransforms, local_projection, pad_maps

    if gb.hopper is None:
        pytest.skip("16-bit activations need the Hopper kernels (compute capability 9.0)")
    be = get_backend("cupy", precision=precision)
    rng = np.random.default_rng(40)
    batch, n = 2, 3001
    cams = random_cameras(rng, batch)
    pts = random_points(rng, batch, n)
    maps = [
        cp.asarray(rng.standard_normal((batch * 3, s, s, c)).astype(np.float32))
        for s, c in zip((224, 112, 56), (16, 32, 64))
    ]
    want = gb.to_numpy(
        local_projection(gb, cp.asarray(pts), pad_maps(gb, maps), DeviceTransforms.from_cameras(gb, cams))
    )
    got = local_projection(be, cp.asarray(pts), pad_maps(be, maps), DeviceTransforms.from_cameras(be, cams))
    assert got.dtype == activation_dtype(cp, precision) and got.shape == (batch, n, 339)
    assert got.strides[1] == 344 * 2 and got.data.ptr % 16 == 0
    got = widen16(cp, cp.ascontiguousarray(got), precision).get()
    np.testing.assert_array_equal(got[..., :3], round16(want[..., :3], precision))
    assert_rounded16(got, want, precision, max(float(cp.abs(m).max()) for m in maps))


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("cout", [192, 1])
def test_local_gconv_equals_reference(cp, gb, ref_gb, residual, cout):
    from xmesh.model.deformation import local_gconv
    from xmesh.model.params import GraphConv

    rng = np.random.default_rng(cout + residual)
    b, k, n, cin = 2, 43, 300, 339
    x = cp.asarray(rng.standard_normal((b, k, n, cin)).astype(np.float32))
    w = cp.asarray((rng.standard_normal((cin, 2 * cout)) * 0.05).astype(np.float32))
    bias = cp.asarray(rng.standard_normal(cout).astype(np.float32) * 0.1)
    layer = GraphConv(w, bias, cout, True)
    cheb1 = cp.asarray(rng.standard_normal((k, k)).astype(np.float32) * 0.2)
    res = cp.asarray(rng.standard_normal((b, k, n, cout)).astype(np.float32)) if residual else None
    out = local_gconv(gb, layer, x, cheb1, None, res)
    ref = local_gconv(ref_gb, layer, x, cheb1, None, res)
    assert out.shape == (b, k, n, cout) and out.dtype == cp.float32
    np.testing.assert_allclose(out.get(), ref.get(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("batch,n", [(1, 2466), (3, 157)])
def test_hypothesis_update_kernel_equals_reference(cp, gb, ref_gb, batch, n):
    from xmesh.model.deformation import hypothesis_update

    rng = np.random.default_rng(n)
    centers = cp.asarray(rng.standard_normal((batch, n, 3)).astype(np.float32))
    score = cp.asarray((rng.standard_normal((batch, 43, n)) * 5).astype(np.float32))
    offsets = cp.asarray((rng.standard_normal((43, 3)) * 0.02).astype(np.float32))
    out = hypothesis_update(gb, centers, score, offsets).get()
    ref = hypothesis_update(ref_gb, centers, score, offsets).get()
    s = score.get().astype(np.float64)
    w = np.exp(s - s.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    exact = centers.get() + np.einsum("bkn,kd->bnd", w, offsets.get().astype(np.float64))
    np.testing.assert_allclose(out, exact, rtol=0, atol=2e-7)
    np.testing.assert_allclose(out, ref, rtol=0, atol=5e-7)  # the reference rounds in another order


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("batch,n", [(1, 2466), (2, 157)])
def test_fused_score_update_equals_the_layer_then_the_update(cp, precision, batch, n):
    """drb_score_update (the last layer, the softmax and the moved vertices in one kernel) against a
    float64 reference; in the 16-bit modes (16-bit X, as the layer before leaves it on Hopper) bit for
    bit what skinny_gemm16, drb_mix_epilogue and hypothesis_softmax_update gave one after another."""
    from xmesh.backends import get_backend
    from xmesh.backends.cupy_backend.hopper import narrow16
    from xmesh.model.deformation import hypothesis_update, local_gconv
    from xmesh.model.params import GraphConv

    be = get_backend("cupy", precision=precision)
    if precision != "fp32" and be.hopper is None:
        pytest.skip("16-bit activations come from the Hopper layer kernel (compute capability 9.0)")
    rng = np.random.default_rng(n + batch)
    x = cp.asarray(np.maximum(rng.standard_normal((batch, 43, n, 192)), 0).astype(np.float32))
    if precision != "fp32":
        x = narrow16(cp, x, precision)
    layer = GraphConv(
        cp.asarray((rng.standard_normal((192, 2)) * 0.1).astype(np.float32)),
        cp.asarray(np.float32([0.05])),
        1,
        relu=True,
    )
    cheb1 = cp.asarray((rng.standard_normal((43, 43)) * (rng.uniform(size=(43, 43)) < 0.2)).astype(np.float32))
    centers = cp.asarray(rng.standard_normal((batch, n, 3)).astype(np.float32))
    offsets = cp.asarray((rng.standard_normal((43, 3)) * 0.02).astype(np.float32))
    fused = be.op_score_update(layer, x, cheb1, None, centers, offsets)
    assert fused is not None
    fused = fused.get()
    xf = (be._activation_f32(x) if precision != "fp32" else x).get().astype(np.float64)
    w = layer.weight.get().astype(np.float64)
    y0, y1 = xf @ w[:, 0], xf @ w[:, 1]  # (B, K, N)
    s = np.maximum(y0 + np.einsum("kj,bjn->bkn", cheb1.get().astype(np.float64), y1) + 0.05, 0)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    exact = centers.get() + np.einsum("bkn,kd->bnd", p, offsets.get().astype(np.float64))
    np.testing.assert_allclose(fused, exact, rtol=0, atol=2e-6)
    score = local_gconv(be, layer, x, cheb1)[..., 0]
    apart = hypothesis_update(be, centers, score, offsets).get()
    if precision == "fp32":  # the unfused layer's product is 3xTF32: float32-accurate, another order
        np.testing.assert_allclose(fused, apart, rtol=0, atol=2e-6)
    else:
        np.testing.assert_array_equal(fused, apart)


@pytest.mark.parametrize("size,kernel,stride,cin", [(224, 3, 1, 3), (224, 3, 2, 16), (28, 5, 2, 128), (7, 3, 1, 32)])
def test_conv2d_same_equals_numpy(cp, gb, size, kernel, stride, cin):
    from xmesh.backends import get_backend

    rng = np.random.default_rng(size + kernel + stride)
    x = rng.standard_normal((3, size, size, cin)).astype(np.float32)
    w = (rng.standard_normal((kernel, kernel, cin, 24)) / np.sqrt(kernel * kernel * cin)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    got = gb.conv2d_same(cp.asarray(x), cp.asarray(w), cp.asarray(b), stride).get()
    ref = get_backend("numpy").conv2d_same(x, w, b, stride)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
@pytest.mark.parametrize(
    "size,kernel,stride,cin,cout,relu",
    [(224, 3, 1, 3, 16, True), (57, 3, 2, 3, 16, False), (30, 5, 2, 4, 8, True), (9, 3, 1, 1, 4, False)],
)
def test_few_channel_conv_is_float32_in_every_mode(cp, precision, size, kernel, stride, cin, cout, relu):
    """Convolutions with fewer than 16 input channels (the CNNs' first layer) run as direct float32
    sums (conv_direct_x4) in every mode: float32 error against float64, where one TF32 pass (the
    tf32 mode's GEMMs) would be ~1e-4 off."""
    from xmesh.backends.cupy_backend import CupyBackend
    from xmesh.backends.numpy_backend import same_padding

    be = CupyBackend(precision=precision)
    rng = np.random.default_rng(size + cin)
    x = rng.standard_normal((2, size, size, cin)).astype(np.float32)
    w = (rng.standard_normal((kernel, kernel, cin, cout)) / kernel).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    got = be.conv2d_same(cp.asarray(x), cp.asarray(w), cp.asarray(b), stride, relu=relu).get()
    ho, top, bottom = same_padding(size, kernel, stride)
    padded = np.pad(x.astype(np.float64), ((0, 0), (top, bottom), (top, bottom), (0, 0)))
    span = (ho - 1) * stride + 1
    want = (
        sum(
            padded[:, i : i + span : stride, j : j + span : stride] @ w[i, j].astype(np.float64)
            for i in range(kernel)
            for j in range(kernel)
        )
        + b
    )
    if relu:
        want = np.maximum(want, 0.0)
    assert got.shape == want.shape == (2, ho, ho, cout)
    np.testing.assert_allclose(got, want, rtol=0, atol=4e-6 * np.abs(want).max())


@pytest.mark.parametrize("size,with_bias,relu", [(224, True, True), (57, False, False), (33, True, False)])
def test_first_layer_conv_kernel_equals_the_general_direct_one_bit_for_bit(cp, gb, size, with_bias, relu):
    """The CNNs' first layer (3 -> 16 channels, 3 x 3, stride 1) takes conv_direct_c3_k3_n16 (a thread
    per pixel, all 16 outputs): the bits of conv_direct_x4, which the test above checks against float64."""
    from xmesh.backends.cupy_backend.device import THREADS

    rng = np.random.default_rng(size)
    x = cp.asarray(rng.standard_normal((2, size, size, 3)).astype(np.float32))
    w = cp.asarray((rng.standard_normal((3, 3, 3, 16)) / 3).astype(np.float32))
    b = cp.asarray(rng.standard_normal(16).astype(np.float32)) if with_bias else None
    got = gb.conv2d_same(x, w, b, 1, relu=relu)
    want = cp.full_like(got, np.nan)
    gb._kernel("conv_direct_x4")(
        (size, 2),
        (THREADS,),
        (
            x,
            w.reshape(27, 16),
            np.uint64(0) if b is None else b,
            want,
            np.int32(size),
            np.int32(size),
            np.int32(3),
            np.int32(3),
            np.int32(3),
            np.int32(1),
            np.int32(size),
            np.int32(1),
            np.int32(1),
            np.int32(16),
            np.int32(relu),
        ),
        shared_mem=27 * 16 * 4,
    )
    assert bool(cp.isfinite(got).all()) and float(cp.abs(got).max()) > 0
    np.testing.assert_array_equal(got.get(), want.get())


def test_spmm_batched_equals_scipy(cp, gb):
    import scipy.sparse as sp

    rng = np.random.default_rng(5)
    s = sp.random(618, 618, density=0.01, random_state=2, dtype=np.float32).tocsr()
    dense = rng.standard_normal((3, 618, 40)).astype(np.float32)
    got = gb.spmm(gb.sparse(s), cp.asarray(dense)).get()
    ref = np.stack([s @ d for d in dense])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- whole reconstructions
@pytest.fixture(scope="module")
def scenes():
    rng = np.random.default_rng(42)
    images = rng.uniform(0, 1, (3, 3, 224, 224, 3)).astype(np.float32)
    cameras = random_cameras(rng, 3)
    return images, cameras


@pytest.mark.parametrize("seed", [2, 3])
def test_cupy_reconstruction_matches_numpy(cp, scenes, seed):
    from xmesh import Reconstructor
    from xmesh.io.weights import synthetic_weights
    from xmesh.template_gen import generate_template

    weights, template = synthetic_weights(seed), generate_template()
    images, cameras = scenes
    cpu = Reconstructor(weights, template=template, backend="numpy")
    gpu = Reconstructor(weights, template=template, backend="cupy")
    c_ref, r_ref = cpu.run(images[:1], cameras[:1])
    c_gpu, r_gpu = (a.get() for a in gpu.run(images[:1], cameras[:1]))
    assert np.isfinite(r_gpu).all()
    assert_mostly_within(c_gpu, c_ref, GPU_ATOL, GPU_MAX_FRACTION)
    assert_mostly_within(r_gpu, r_ref, GPU_ATOL, GPU_MAX_FRACTION)
    # the stage-2 moves themselves agree (relative to their size)
    move_ref, move_gpu = r_ref - c_ref, r_gpu - c_gpu
    assert np.linalg.norm(move_gpu - move_ref) <= 5e-2 * np.linalg.norm(move_ref)


@pytest.fixture(scope="module")
def gpu_model():
    from xmesh import Reconstructor
    from xmesh.io.weights import synthetic_weights
    from xmesh.template_gen import generate_template

    return Reconstructor(synthetic_weights(2), template=generate_template(), backend="cupy")


def test_batched_equals_one_by_one(cp, gpu_model, scenes):
    images, cameras = scenes
    coarse, refined = (a.get() for a in gpu_model.run(images, cameras))
    for b in range(3):
        c1, r1 = (a.get() for a in gpu_model.run(images[b : b + 1], cameras[b : b + 1]))
        assert_mostly_within(coarse[b], c1[0], VERTEX_ATOL, GPU_MAX_FRACTION)
        assert_mostly_within(refined[b], r1[0], VERTEX_ATOL, GPU_MAX_FRACTION)


def test_graph_replay_equals_eager(cp, gb):
    """A captured graph of the projection kernels replays to the eager result, also on new inputs."""
    from xmesh.model.projection import DeviceTransforms, graph_projection, local_projection, pad_maps

    rng = np.random.default_rng(7)
    cams = random_cameras(rng, 2)
    tf = DeviceTransforms.from_cameras(gb, cams)
    coords = cp.asarray(random_points(rng, 2, 618))
    maps1 = [
        cp.asarray(rng.standard_normal((6, s, s, c)).astype(np.float32))
        for s, c in ((56, 64), (28, 128), (14, 256), (7, 512))
    ]
    maps2 = pad_maps(
        gb,
        [cp.asarray(rng.standard_normal((6, s, s, c)).astype(np.float32)) for s, c in ((224, 16), (112, 32), (56, 64))],
    )

    def step(pts):
        f1 = graph_projection(gb, pts, maps1, tf)
        f2 = local_projection(gb, pts, maps2, tf)
        return f1 * 2.0, cp.maximum(f2, 0.5)

    eager = [a.get() for a in step(coords)]
    graph = gb.capture(step, coords)
    replay = [a.get() for a in graph.replay(synchronize=True)]
    for e, r in zip(eager, replay):
        np.testing.assert_array_equal(r, e)
    coords[...] = cp.asarray(random_points(rng, 2, 618))
    again = [a.get() for a in graph.replay(synchronize=True)]
    fresh = [a.get() for a in step(coords)]
    for e, r in zip(fresh, again):
        np.testing.assert_array_equal(r, e)


def test_capturing_cublas_work_says_why_it_fails(cp, scenes, monkeypatch):
    """fp16 mode without the Hopper kernels runs its deformation GEMMs through cuBLAS, which CuPy
    refuses under stream capture; the backend says so instead of a bare NotImplementedError, and the
    model still runs eagerly."""
    from xmesh import Reconstructor
    from xmesh.backends.cupy_backend import CupyBackend, GraphCaptureError
    from xmesh.io.weights import synthetic_weights
    from xmesh.model.deformation import local_gconv
    from xmesh.template_gen import generate_template

    monkeypatch.setenv("XMESH_HOPPER_GEMM", "0")  # as on a GPU other than an H100/H200
    # a backend of its own: get_backend's shared fp16 backend keeps the Hopper kernels
    model = Reconstructor(synthetic_weights(2), template=generate_template(), backend=CupyBackend(precision="fp16"))
    be = model.backend
    assert be.hopper is None and not be.can_capture_network and not model.graphs
    layers = model.stage2.blocks[0]
    x = cp.asarray(np.random.default_rng(1).standard_normal((1, 43, 100, 339)).astype(np.float32))
    with pytest.raises(GraphCaptureError, match="cuBLAS"):
        be.capture(
            lambda h: local_gconv(be, layers[0], h, model.stage2.sample_cheb1, model.stage2.sample_cheb0), x, warmup=1
        )
    images, cameras = scenes
    assert np.isfinite(model.run(images[:1], cameras[:1])[1].get()).all()


def test_whole_reconstruction_replays_as_a_cuda_graph(cp, scenes):
    """fp32: the second call with a batch size captures the whole network, later calls replay it;
    replays equal eager runs, on the captured inputs and on new ones, within the tolerance of two GPU
    runs (cuBLAS may choose other algorithms while a stream is captured)."""
    from xmesh import Reconstructor
    from xmesh.io.weights import synthetic_weights
    from xmesh.template_gen import generate_template

    weights, template = synthetic_weights(3), generate_template()
    images, cameras = scenes
    eager = Reconstructor(weights, template=template, backend="cupy", graphs=False)
    graphed = Reconstructor(weights, template=template, backend="cupy")
    assert graphed.graphs
    for size in (1, 2):
        for start in (0, 1, 0):  # call 1 eager, call 2 captures + replays, call 3 replays new inputs
            sl = slice(start, start + size)
            want = [a.get() for a in eager.run(images[sl], cameras[sl])]
            got = [a.get() for a in graphed.run(images[sl], cameras[sl])]
            for w, g in zip(want, got):
                assert_mostly_within(g, w, VERTEX_ATOL, GPU_MAX_FRACTION)
        assert size in graphed.graph_bytes()
    assert eager.graph_bytes() == {}


def test_graphs_stay_within_their_memory_share(cp, scenes):
    """Captured graphs of all batch sizes together stay within ``graph_memory_share`` of the device's
    memory: with room for about three samples' graphs, sizes 1 and 2 are captured and size 3 runs
    eagerly, none dropped for it. Every call equals the eager model within the tolerance of two GPU runs."""
    from xmesh import Reconstructor
    from xmesh.io.weights import synthetic_weights
    from xmesh.template_gen import generate_template

    weights, template = synthetic_weights(3), generate_template()
    images, cameras = scenes
    eager = Reconstructor(weights, template=template, backend="cupy", graphs=False)
    graphed = Reconstructor(weights, template=template, backend="cupy")

    def call(size):
        want = [a.get() for a in eager.run(images[:size], cameras[:size])]
        got = [a.get() for a in graphed.run(images[:size], cameras[:size])]
        for w, g in zip(want, got):
            assert_mostly_within(g, w, VERTEX_ATOL, GPU_MAX_FRACTION)

    for _ in range(2):
        call(1)
    one = graphed.graph_bytes()[1]
    total = graphed.backend.memory_bytes()[1]
    # a graph's size is guessed at one's per sample: 1 and then 2 fit (3 x one), 3 does not
    graphed.graph_memory_share = 3.5 * one / total
    for size in (2, 2, 3, 3, 3, 1):
        call(size)
    assert sorted(graphed.graph_bytes()) == [1, 2]
    assert sum(graphed.graph_bytes().values()) <= graphed.graph_memory_share * total
    graphed.graph_memory_share = 0.25
    call(3)  # with room again, the next call captures it
    assert sorted(graphed.graph_bytes()) == [1, 2, 3]


def test_graph_replay_takes_device_images_and_leaves_them_alone(cp, scenes):
    """Device images work as inputs of captured graphs too: the capture does not keep the caller's
    array as its input (a later call with other images must not overwrite it)."""
    from xmesh import Reconstructor
    from xmesh.io.weights import synthetic_weights
    from xmesh.template_gen import generate_template

    weights, template = synthetic_weights(4), generate_template()
    images, cameras = scenes
    eager = Reconstructor(weights, template=template, backend="cupy", graphs=False)
    graphed = Reconstructor(weights, template=template, backend="cupy")
    first = cp.asarray(images[0:1])
    for start in (0, 0, 1, 2):  # eager, capture + replay, replays of new device inputs
        sl = slice(start, start + 1)
        got = graphed.run(first if start == 0 else cp.asarray(images[sl]), cameras[sl])
        want = eager.run(images[sl], cameras[sl])
        for g, w in zip(got, want):
            assert_mostly_within(g.get(), w.get(), VERTEX_ATOL, GPU_MAX_FRACTION)
    assert 1 in graphed.graph_bytes()
    np.testing.assert_array_equal(first.get(), images[0:1])


@pytest.mark.parametrize("n,cin,batch", [(618, 300, 3), (156, 2883, 1), (2466, 3075, 2)])
def test_stage1_graph_conv_kernel_equals_reference(cp, gb, ref_gb, n, cin, batch):
    """op_graph_conv (one GEMM, then the CSR kernel; inputs whose width is not a multiple of 4 padded
    for the GEMM's vector loads) against the model's array code and a float64 reference; with a
    residual it gives bit for bit the array code's (out + residual) * 0.5 of its own output."""
    import scipy.sparse as sp

    from xmesh.model.graph import graph_conv
    from xmesh.model.params import GraphConv

    rng = np.random.default_rng(9)
    cout = 192
    s1 = sp.random(n, n, density=6 / n, random_state=3, dtype=np.float32).tocsr()
    host_x = rng.standard_normal((batch, n, cin)).astype(np.float32)
    x = cp.asarray(host_x)
    residual = cp.asarray(rng.standard_normal((batch, n, cout)).astype(np.float32))
    for relu in (True, False):
        host_w = (rng.standard_normal((cin, 2 * cout)) / np.sqrt(cin)).astype(np.float32)
        host_b = rng.standard_normal(cout).astype(np.float32)
        layer = GraphConv(cp.asarray(host_w), cp.asarray(host_b), cout, relu)
        out = graph_conv(gb, layer, x, (None, gb.sparse(s1)))
        ref = graph_conv(ref_gb, layer, x, (None, ref_gb.sparse(s1)))
        np.testing.assert_allclose(out.get(), ref.get(), rtol=1e-4, atol=1e-5)
        y = host_x.astype(np.float64) @ host_w
        exact = y[..., :cout] + np.stack([s1 @ yb[:, cout:] for yb in y]) + host_b
        exact = np.maximum(exact, 0) if relu else exact
        np.testing.assert_allclose(out.get(), exact, rtol=1e-5, atol=1e-5)
        fused = graph_conv(gb, layer, x, (None, gb.sparse(s1)), residual)
        np.testing.assert_array_equal(fused.get(), ((out + residual) * 0.5).get())


@pytest.mark.parametrize("batch,n", [(2, 156), (5, 2466)])
def test_projection_with_carried_columns_feeds_the_graph_conv_in_place(cp, gb, batch, n):
    """The concatenating layers (15, 31): the projection writes a[-2]'s columns after its own into rows
    padded to 16 bytes, the concatenation bit for bit, and the next graph convolution reads those rows
    in place (K = 3075 ending inside a 16-byte copy, zero-filled there), bit for bit what it computes
    from the contiguous (padded and copied) input; 312 rows take the mma.sync GEMM, 12330 the
    Hopper one where there is one."""
    import scipy.sparse as sp

    from xmesh.model.graph import graph_conv
    from xmesh.model.params import GraphConv
    from xmesh.model.projection import DeviceTransforms, graph_projection

    rng = np.random.default_rng(n)
    tf = DeviceTransforms.from_cameras(gb, random_cameras(rng, batch))
    coords = cp.asarray(random_points(rng, batch, n))
    maps = [
        cp.asarray(rng.standard_normal((batch, s, s, c)).astype(np.float32))
        for s, c in ((56, 64), (28, 128), (14, 256), (7, 512))
    ]
    carried = cp.asarray(rng.standard_normal((batch, n, 192)).astype(np.float32))
    joined = graph_projection(gb, coords, maps, tf, True, carried)
    alone = graph_projection(gb, coords, maps, tf, True)
    assert joined.shape == (batch, n, 3075) and joined.strides[1] == 3076 * 4
    np.testing.assert_array_equal(joined.get(), np.concatenate([alone.get(), carried.get()], axis=-1))
    s1 = gb.sparse(sp.random(n, n, density=6 / n, random_state=1, dtype=np.float32).tocsr())
    layer = GraphConv(
        cp.asarray((rng.standard_normal((3075, 384)) / 55).astype(np.float32)),
        cp.asarray(rng.standard_normal(192).astype(np.float32)),
        192,
        True,
    )
    in_place = graph_conv(gb, layer, joined, (None, s1))
    copied = graph_conv(gb, layer, cp.ascontiguousarray(joined), (None, s1))
    np.testing.assert_array_equal(in_place.get(), copied.get())
    y = joined.get()[0].astype(np.float64) @ layer.weight.get().astype(np.float64)
    exact = np.maximum(y[:, :192] + s1.get() @ y[:, 192:] + layer.bias.get(), 0.0)
    np.testing.assert_allclose(in_place.get()[0], exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())


def test_large_convolutions_of_the_speed_modes_go_to_cudnn(cp, monkeypatch):
    """In tf32 mode a stride-1 'SAME' convolution of at least CONV_MIN_FLOP runs in cuDNN (where it is
    installed): bias and ReLU applied, TF32 products (error above float32's, within TF32's against
    float64), whatever the output buffer held before (NaN here); smaller or strided ones stay in
    xmesh's kernels, and fp32 mode never uses it."""
    from xmesh.backends.cupy_backend import CupyBackend
    from xmesh.backends.plan import CUDNN_MIN_FLOP as CONV_MIN_FLOP

    be = CupyBackend(precision="tf32")
    if be._cudnn is None:
        pytest.skip("cuDNN is not installed here")
    assert CupyBackend(precision="fp32")._cudnn is None
    rng = np.random.default_rng(11)
    x = rng.standard_normal((32, 112, 112, 32)).astype(np.float32)
    w = (rng.standard_normal((3, 3, 32, 32)) / 17).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    assert 2.0 * x[..., 0].size * 32 * 9 * 32 >= CONV_MIN_FLOP
    calls = []
    real = be._cudnn.conv2d_same_relu
    monkeypatch.setattr(be._cudnn, "conv2d_same_relu", lambda *a: (calls.append(a[0].shape), real(*a))[1])
    got = be.conv2d_same(cp.asarray(x), cp.asarray(w), cp.asarray(b), 1).get()
    be.conv2d_same(cp.asarray(x[:2]), cp.asarray(w), cp.asarray(b), 1)  # too small
    be.conv2d_same(cp.asarray(x), cp.asarray(w), cp.asarray(b), 2)  # strided
    assert calls == [x.shape]
    padded = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    exact = (
        sum(padded[:, i : i + 112, j : j + 112] @ w[i, j].astype(np.float64) for i in range(3) for j in range(3)) + b
    )
    want = np.maximum(exact, 0.0)
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert 3e-5 < err < 3e-3, err
    out = cp.full(x.shape, cp.nan, dtype=cp.float32)
    real(cp.asarray(x), cp.asarray(w), cp.asarray(b), out)
    np.testing.assert_array_equal(out.get(), got)
    # cuDNN failing at run time (say, built for another CUDA): a warning, then xmesh's kernels, for good
    from xmesh.backends.cudnn_conv import CudnnError

    def broken(*args):
        raise CudnnError("cudnnConvolutionBiasActivationForward failed: CUDNN_STATUS_EXECUTION_FAILED (status 8)")

    monkeypatch.setattr(be._cudnn, "conv2d_same_relu", broken)
    with pytest.warns(RuntimeWarning, match="XMESH_CUDNN=0"):
        ours = be.conv2d_same(cp.asarray(x), cp.asarray(w), cp.asarray(b), 1).get()
    assert be._cudnn is None
    err = np.linalg.norm(ours - want) / np.linalg.norm(want)
    assert 3e-5 < err < 3e-3, err


@pytest.mark.parametrize(
    "batch,n,relu,with_res", [(1, 2466, True, True), (3, 618, False, False), (2, 156, True, False)]
)
def test_csr_gconv_x4_equals_the_scalar_kernel_bit_for_bit(cp, gb, batch, n, relu, with_res):
    """csr_gconv_x4 (4 columns a thread, 32-bit indices) gives exactly csr_gconv's results."""
    import scipy.sparse as sp

    rng = np.random.default_rng(n + batch)
    cout = 192
    s1 = gb.sparse(sp.random(n, n, density=7 / n, random_state=n, dtype=np.float32).tocsr())
    y = cp.asarray(rng.standard_normal((batch * n, 2 * cout)).astype(np.float32))
    bias = cp.asarray(rng.standard_normal(cout).astype(np.float32))
    res = cp.asarray(rng.standard_normal((batch, n, cout)).astype(np.float32)) if with_res else None
    outs = []
    for kernel, per_thread in (("csr_gconv", 1), ("csr_gconv_x4", 4)):
        out = cp.full((batch, n, cout), np.nan, dtype=cp.float32)
        total = out.size // per_thread
        gb._kernel(kernel)(
            ((total + 255) // 256,),
            (256,),
            (
                s1.indptr,
                s1.indices,
                s1.data,
                y,
                np.int32(2 * cout),
                np.int32(cout),
                bias,
                np.uint64(0) if res is None else res,
                out,
                np.int32(batch),
                np.int32(n),
                np.int32(cout),
                np.int32(relu),
            ),
        )
        outs.append(out.get())
    assert np.isfinite(outs[1]).all()
    np.testing.assert_array_equal(outs[1], outs[0])


@pytest.mark.parametrize("n_old,cin,batch", [(156, 3075, 1), (618, 3075, 2), (40, 192, 3)])
def test_stage1_graph_conv_after_unpooling_equals_reference(cp, gb, ref_gb, n_old, cin, batch):
    """op_graph_conv with pool_idx (GEMM on the rows before unpooling, unpool kernel on its output,
    CSR kernel) is the layer on the unpooled input: against a float64 reference of the original's
    order (unpool, then the layer) and the model's array code on the unpooled input."""
    import scipy.sparse as sp

    from xmesh.model.graph import graph_conv, unpool
    from xmesh.model.params import GraphConv

    rng = np.random.default_rng(n_old + cin)
    cout = 192
    pool = np.unique(np.sort(rng.integers(0, n_old, size=(3 * n_old, 2)), axis=1), axis=0)
    pool = pool[pool[:, 0] != pool[:, 1]]
    n = n_old + len(pool)
    s1 = sp.random(n, n, density=6 / n, random_state=5, dtype=np.float32).tocsr()
    host_x = rng.standard_normal((batch, n_old, cin)).astype(np.float32)
    host_w = (rng.standard_normal((cin, 2 * cout)) / np.sqrt(cin)).astype(np.float32)
    host_b = rng.standard_normal(cout).astype(np.float32)
    layer = GraphConv(cp.asarray(host_w), cp.asarray(host_b), cout, True)
    x, edges = cp.asarray(host_x), cp.asarray(pool, dtype=cp.int64)
    out = graph_conv(gb, layer, x, (None, gb.sparse(s1)), pool_idx=edges)
    assert out.shape == (batch, n, cout)
    up = host_x.astype(np.float64)
    up = np.concatenate([up, (up[:, pool[:, 0]] + up[:, pool[:, 1]]) / 2], axis=1)
    y = up @ host_w
    exact = np.maximum(y[..., :cout] + np.stack([s1 @ yb[:, cout:] for yb in y]) + host_b, 0)
    np.testing.assert_allclose(out.get(), exact, rtol=1e-5, atol=1e-5)
    first = graph_conv(ref_gb, layer, unpool(ref_gb, x, edges), (None, ref_gb.sparse(s1)))
    np.testing.assert_allclose(out.get(), first.get(), rtol=1e-4, atol=1e-5)
    with pytest.raises(InputError, match="support"):
        graph_conv(gb, layer, x, (None, gb.sparse(s1[: n - 1, : n - 1])), pool_idx=edges)


@pytest.mark.parametrize("batch,n,c", [(1, 156, 963), (3, 618, 3075), (2, 5, 1)])
def test_unpool_kernel_equals_the_array_code(cp, gb, batch, n, c):
    """op_unpool (one kernel) gives bit for bit what graph.unpool's take/add/multiply/concat give."""
    from xmesh.model import graph

    rng = np.random.default_rng(n + c)
    x = cp.asarray(rng.standard_normal((batch, n, c)).astype(np.float32))
    edges = cp.asarray(rng.integers(0, n, size=(2 * n, 2)), dtype=cp.int64)
    got = gb.op_unpool(x, edges)
    xp = gb.xp
    ref = xp.concat([x, (xp.take(x, edges[:, 0], axis=1) + xp.take(x, edges[:, 1], axis=1)) * 0.5], axis=1)
    assert got.shape == (batch, 3 * n, c)
    np.testing.assert_array_equal(got.get(), ref.get())
    np.testing.assert_array_equal(graph.unpool(gb, x, edges).get(), ref.get())


def test_bf16_needs_the_hopper_kernel(cp, monkeypatch):
    """bf16 runs only in the Hopper layer kernel: without it the backend refuses the mode and says
    what to use instead."""
    from xmesh.backends.cupy_backend import CupyBackend
    from xmesh.errors import InputError

    monkeypatch.setenv("XMESH_HOPPER_GEMM", "0")
    with pytest.raises(InputError, match="compute capability 9.0.*'fp16' or 'tf32'"):
        CupyBackend(precision="bf16")


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_16bit_modes_replay_as_cuda_graphs_on_hopper(cp, hopper, scenes, precision):
    """On an H100/H200 the 16-bit modes run the deformation layers in the Hopper kernel (no cuBLAS),
    so the whole reconstruction is captured; replay equals the eager run bit for bit."""
    from xmesh import Reconstructor
    from xmesh.io.weights import synthetic_weights
    from xmesh.template_gen import generate_template

    weights, template = synthetic_weights(2), generate_template()
    images, cameras = scenes
    graphed = Reconstructor(weights, template=template, backend="cupy", precision=precision)
    eager = Reconstructor(weights, template=template, backend="cupy", precision=precision, graphs=False)
    assert graphed.backend.can_capture_network and graphed.graphs
    want = [a.get() for a in eager.run(images[:1], cameras[:1])]
    for _ in range(3):  # eager, capture + replay, replay
        got = [a.get() for a in graphed.run(images[:1], cameras[:1])]
    assert 1 in graphed.graph_bytes()
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16", "bf16"])
def test_products_outside_the_deformation_layers_follow_the_mode(cp, precision):
    """The CNN's and graph convolutions' products (CupyBackend.gemm, conv2d_same) are float32-accurate
    (3xTF32) in fp32 mode and one TF32 pass in every speed mode: error above float32's, within TF32's."""
    from xmesh.backends.cupy_backend import CupyBackend

    if precision == "bf16" and not _hopper_available(cp):
        pytest.skip("bf16 needs compute capability 9.0")
    be = CupyBackend(precision=precision)
    rng = np.random.default_rng(8)
    a = rng.standard_normal((3000, 288)).astype(np.float32)
    b = (rng.standard_normal((288, 64)) / 17).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    err = np.linalg.norm(be.gemm(cp.asarray(a), cp.asarray(b)).get() - exact) / np.linalg.norm(exact)
    x = rng.standard_normal((2, 30, 30, 16)).astype(np.float32)
    w = (rng.standard_normal((3, 3, 16, 32)) / 12).astype(np.float32)
    conv = be.conv2d_same(cp.asarray(x), cp.asarray(w), cp.zeros(32, dtype=cp.float32), 1, relu=False).get()
    padded = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    conv_exact = sum(padded[:, i : i + 30, j : j + 30] @ w[i, j].astype(np.float64) for i in range(3) for j in range(3))
    conv_err = np.linalg.norm(conv - conv_exact) / np.linalg.norm(conv_exact)
    if precision == "fp32":
        assert err < 1e-6 and conv_err < 1e-6, (err, conv_err)
    else:
        assert 3e-5 < err < 3e-3 and 3e-5 < conv_err < 3e-3, (err, conv_err)


def _hopper_available(cp) -> bool:
    from xmesh.backends.cupy_backend import hopper

    return hopper.supported(cp.cuda.Device())


@pytest.mark.parametrize("precision,rtol", [("tf32", 0.2), ("fp16", 0.2), ("bf16", 0.2)])
def test_reduced_precision_modes_stay_close(cp, gpu_model, scenes, precision, rtol):
    from xmesh import Reconstructor
    from xmesh.io.weights import synthetic_weights
    from xmesh.template_gen import generate_template

    images, cameras = scenes
    model = Reconstructor(synthetic_weights(2), template=generate_template(), backend="cupy", precision=precision)
    c_ref, r_ref = (a.get() for a in gpu_model.run(images[:1], cameras[:1]))
    c, r = (a.get() for a in model.run(images[:1], cameras[:1]))
    assert np.isfinite(r).all()
    move_ref, move = r_ref - c_ref, r - c
    assert np.linalg.norm(move - move_ref) <= rtol * np.linalg.norm(move_ref)


# Every test above except the two CPU ones needs CUDA and CuPy.
_CPU_TESTS = {"test_missing_cupy_names_what_to_install", "test_unknown_precision_is_rejected"}
for _name, _obj in list(globals().items()):
    if _name.startswith("test_") and _name not in _CPU_TESTS and callable(_obj):
        globals()[_name] = requires_cuda(pytest.mark.gpu(_obj))
