"""The local graph convolution's element-wise ends on CuPy, one pass each over its (B,K,N,C) arrays.

``bias_relu`` is the training forward's ``z = y0 + mixed + bias``, ``active = z > 0``, ``out = where(active,
z, 0)`` and the residual added after it, in the array-API code's order of operations (so bit for bit
that code's values), without its intermediate arrays; ``relu_gradient`` is the backward's
``where(active, dout, 0)`` (or, the mask read from the ReLU's output, ``where(out > 0, dout, 0)``);
``relu_gradient_mixed`` is that with the support's transpose applied over the hypotheses (the two
halves of the weights' gradient product) and the bias's sums, in one pass. At batch 32 each of those
arrays is 2.6 GB, so every pass saved is about a millisecond of memory traffic per layer. The training
CNN's convolutions end the same way: ``plus_bias_relu`` and ``relu_gradient`` of its output.
"""

from __future__ import annotations

import functools

import numpy as np


@functools.cache
def _kernels():
    import cupy

    plain = cupy.ElementwiseKernel(
        "T y0, T mixed, T bias",
        "T out, bool active",
        "const T z = y0 + mixed + bias; active = z > (T)0; out = active ? z : (T)0;",
        "xmesh_bias_relu",
    )
    residual = cupy.ElementwiseKernel(
        "T y0, T mixed, T bias, T res",
        "T out, bool active",
        "const T z = y0 + mixed + bias; active = z > (T)0; out = (active ? z : (T)0) + res;",
        "xmesh_bias_relu_residual",
    )
    return plain, residual


@functools.cache
def _convolution_kernels():
    import cupy

    forward = cupy.ElementwiseKernel(
        "T y, T bias", "T out", "const T z = y + bias; out = (z > (T)0 || isnan(z)) ? z : (T)0;", "xmesh_plus_bias_relu"
    )
    return forward


@functools.cache
def _gradient_kernel():
    import cupy

    plain = cupy.ElementwiseKernel("T dout, M mask", "T dz", "dz = mask > (M)0 ? dout : (T)0", "xmesh_relu_gradient")
    plus = cupy.ElementwiseKernel(
        "T dout, T plus, M mask", "T dz", "dz = mask > (M)0 ? dout + plus : (T)0", "xmesh_relu_gradient_plus"
    )
    return plain, plus


def plus_bias_relu(y, bias):
    """``maximum(y + bias, 0)`` (NaN kept) in one pass: a convolution's end."""
    return _convolution_kernels()(y, bias)


def bias_relu(y0, mixed, bias, residual=None):
    """(relu(y0 + mixed + bias) [+ residual], the mask where y0 + mixed + bias > 0)."""
    plain, with_residual = _kernels()
    if residual is None:
        return plain(y0, mixed, bias)
    return with_residual(y0, mixed, bias, residual)


def relu_gradient(dout, mask, plus=None):
    """``dout`` (``dout + plus`` where given) where the ReLU passed, else 0, in one pass: ``mask`` the
    forward's bool mask, or the ReLU's output (positive where it passed)."""
    plain, with_plus = _gradient_kernel()
    return plain(dout, mask) if plus is None else with_plus(dout, plus, mask)


_MIXED_SOURCE = r"""
// One thread per (sample b, vertex n, column c) of dout (B, K, N, C): dz_i = dout_i where the ReLU
// passed (mask_i > 0, the mask a bool or the ReLU's output), written to dy[b, i, n, c]; the mixing's
// transpose sum_j A1[j, i] dz_j (an fmaf chain over j) to dy[b, i, n, C + c]; and sum_i dz_i to
// sums[b, n, c], from which the bias's gradient is summed. A1's columns sit in shared memory as rows
// of A1_STRIDE floats, read four at a time: a warp's loads of them are broadcasts, one per four FMAs.
// Built with NARROW = w > 0, dout is the product of narrow rows (B, K, N, w) and weights (C, w) made
// on the way (dout_i = sum_k rows_ik W_ck, an fmaf chain from 0 over k) and written to `product`.
#define A1_STRIDE 44
extern "C" __global__ void relu_gradient_mixed_MASK(const float* __restrict__ dout, const MASK* __restrict__ mask,
                                                    const float* __restrict__ a1, long long columns, int channels,
                                                    long long total, float* __restrict__ dy,
                                                    float* __restrict__ sums, const float* __restrict__ weights,
                                                    float* __restrict__ product) {
    __shared__ __align__(16) float at[HYP * A1_STRIDE];   // at[i * A1_STRIDE + j] = A1[j, i]
    for (int q = threadIdx.x; q < HYP * A1_STRIDE; q += blockDim.x) {
        const int i = q / A1_STRIDE, j = q % A1_STRIDE;
        at[q] = j < HYP ? a1[j * HYP + i] : 0.0f;
    }
    __syncthreads();
    const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (t >= total) return;
    const long long b = t / columns, nc = t - b * columns;
    const long long n = nc / channels, c = nc - n * channels;
    const MASK* passed = mask + b * HYP * columns + nc;
    float* dst = dy + b * HYP * 2 * columns + n * 2 * channels + c;
#if NARROW
    const long long rows_apart = columns / channels * NARROW;   // between hypotheses: N rows of w floats
    const float* src = dout + b * HYP * rows_apart + n * NARROW;
    float w[NARROW];
#pragma unroll
    for (int k = 0; k < NARROW; ++k) w[k] = weights[c * NARROW + k];
#else
    const float* src = dout + b * HYP * columns + nc;
#endif
    float dz[HYP];
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < HYP; ++i) {
#if NARROW
        float value = 0.0f;
#pragma unroll
        for (int k = 0; k < NARROW; ++k) value = fmaf(src[i * rows_apart + k], w[k], value);
        product[b * HYP * columns + nc + i * columns] = value;
#else
        const float value = src[i * columns];
#endif
        dz[i] = passed[i * columns] > (MASK)0 ? value : 0.0f;
        dst[i * 2 * columns] = dz[i];
        sum += dz[i];
    }
#pragma unroll 1
    for (int i = 0; i < HYP; ++i) {   // rolled: dz stays in registers, A1's column i comes from shared memory
        const float* column = at + i * A1_STRIDE;
        float m = 0.0f;
#pragma unroll
        for (int j = 0; j < HYP; j += 4) {
            const float4 a = *reinterpret_cast<const float4*>(column + j);
            m = fmaf(a.x, dz[j], m);
            if (j + 1 < HYP) m = fmaf(a.y, dz[j + 1], m);
            if (j + 2 < HYP) m = fmaf(a.z, dz[j + 2], m);
            if (j + 3 < HYP) m = fmaf(a.w, dz[j + 3], m);
        }
        dst[i * 2 * columns + channels] = m;
    }
    sums[t] = sum;
}
"""

MIXED_THREADS = 128


#: The widest rows :func:`relu_gradient_mixed_of_product` takes (its weights' rows sit in registers).
NARROW_MAX = 8


@functools.cache
def _mixed_kernel(mask_type: str, hypotheses: int, narrow: int = 0):
    import cupy

    code = f"#define HYP {hypotheses}\n#define NARROW {narrow}\n" + _MIXED_SOURCE.replace("MASK", mask_type)
    return cupy.RawModule(code=code, options=("--std=c++11",)).get_function(f"relu_gradient_mixed_{mask_type}")


def relu_gradient_mixed(dout, mask, a1):
    """The local graph convolution's backward up to its products, for float32 dout (B, K, N, C), the
    forward's ``mask`` (bool, or the ReLU's output: positive where it passed) and the (K, K) support A1:
    (dy (B, K, N, 2C) = [dZ | A1^T dZ] over the K axis, dZ summed over K (B, N, C)), dZ = dout where the
    ReLU passed. One pass over dout and the mask instead of the mask's, the mixing's and the concat's."""
    import cupy

    dout = cupy.ascontiguousarray(dout, dtype=cupy.float32)
    return _mixed(dout, mask, a1, dout.shape)


def relu_gradient_mixed_of_product(rows, weights, mask, a1):
    """:func:`relu_gradient_mixed` of dout = rows W^T, for narrow float32 ``rows`` (B, K, N, w), w <=
    ``NARROW_MAX`` and ``weights`` (C, w), the product made in the same pass (a narrow layer's input
    gradient, the score layer's [dZ | A1^T dZ] times [W0 | W1]^T, never read back): (dy, sums, dout)."""
    import cupy

    b, k, n, w = rows.shape
    c = weights.shape[0]
    if weights.shape != (c, w) or not 0 < w <= NARROW_MAX:
        raise ValueError(f"relu_gradient_mixed_of_product: rows {rows.shape} and weights {weights.shape} do not fit")
    rows = cupy.ascontiguousarray(rows, dtype=cupy.float32)
    weights = cupy.ascontiguousarray(weights, dtype=cupy.float32)
    product = cupy.empty((b, k, n, c), dtype=cupy.float32)
    dy, sums = _mixed(rows, mask, a1, (b, k, n, c), weights, product)
    return dy, sums, product


def _mixed(dout, mask, a1, shape, weights=None, product=None):
    """One launch of the mixed kernel for dout of ``shape`` (B, K, N, C), or its narrow product's rows."""
    import cupy

    b, k, n, c = shape
    mask = cupy.ascontiguousarray(mask)
    mask_type = "bool" if mask.dtype == cupy.bool_ else "float"
    if mask_type == "float" and mask.dtype != cupy.float32:
        raise TypeError(f"relu_gradient_mixed: the mask is bool or float32, got {mask.dtype}")
    if mask.shape != tuple(shape):
        raise ValueError(f"relu_gradient_mixed: the mask is {mask.shape}, the gradient {tuple(shape)}")
    dy = cupy.empty((b, k, n, 2 * c), dtype=cupy.float32)
    sums = cupy.empty((b, n, c), dtype=cupy.float32)
    total = b * n * c
    if total:
        narrow = 0 if weights is None else int(weights.shape[1])
        null = np.uint64(0)
        _mixed_kernel(mask_type, int(k), narrow)(
            (-(-total // MIXED_THREADS),),
            (MIXED_THREADS,),
            (
                dout,
                mask,
                cupy.ascontiguousarray(a1, dtype=cupy.float32),
                np.int64(n * c),
                np.int32(c),
                np.int64(total),
                dy,
                sums,
                null if weights is None else weights,
                null if product is None else product,
            ),
        )
    return dy, sums
