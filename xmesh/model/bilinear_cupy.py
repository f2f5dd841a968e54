"""The local projection training pair's bilinear taps on CuPy, each (view, map) in one launch.

``bilinear_forward`` is ``q11 w11 + q21 w21 + q12 w12 + q22 w22`` for every sample row and channel,
each product and sum rounded as the array-API code rounds them (no fused multiply-add), so its
features are that code's bit for bit. ``bilinear_backward`` adds each corner's share of the
features' gradient into the map's gradient (atomic adds, as ``cupyx.scatter_add``) and sums, per
row, the gradient's pull along the map's two axes (a warp per row, its lanes over the channels):
the array-API code's gathers, products and scatter-add without writing a row-by-channel array.
Both run in float32 and float64 (the gradient checks).
"""
from __future__ import annotations

import functools

import numpy as np

THREADS = 256

SOURCE = r"""
extern "C" __global__ void bilinear_forward_TYPE(const TYPE* __restrict__ fmap, const long long* __restrict__ rows,
                                                 const TYPE* __restrict__ w, long long count, int channels,
                                                 TYPE* __restrict__ out) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= count * channels) return;
    const long long r = i / channels;
    const long long c = i - r * channels;
    TYPE acc = MUL(fmap[rows[r] * channels + c], w[r]);
    acc = ADD(acc, MUL(fmap[rows[count + r] * channels + c], w[count + r]));
    acc = ADD(acc, MUL(fmap[rows[2 * count + r] * channels + c], w[2 * count + r]));
    acc = ADD(acc, MUL(fmap[rows[3 * count + r] * channels + c], w[3 * count + r]));
    out[i] = acc;
}

extern "C" __global__ void bilinear_backward_TYPE(const TYPE* __restrict__ df, long long df_stride,
                                                  const TYPE* __restrict__ fmap, const long long* __restrict__ rows,
                                                  const TYPE* __restrict__ w, const TYPE* __restrict__ axis_w,
                                                  long long count, int channels, TYPE* dmap,
                                                  TYPE* __restrict__ gx, TYPE* __restrict__ gy) {
    const long long r = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (r >= count) return;   // a whole warp: r is the same for its 32 lanes
    const long long o11 = rows[r] * channels, o21 = rows[count + r] * channels;
    const long long o12 = rows[2 * count + r] * channels, o22 = rows[3 * count + r] * channels;
    const TYPE w11 = w[r], w21 = w[count + r], w12 = w[2 * count + r], w22 = w[3 * count + r];
    const TYPE wx1 = axis_w[r], wx2 = axis_w[count + r], wy1 = axis_w[2 * count + r], wy2 = axis_w[3 * count + r];
    TYPE sx = 0, sy = 0;
    for (int c = lane; c < channels; c += 32) {
        const TYPE d = df[r * df_stride + c];
        const TYPE q11 = fmap[o11 + c], q21 = fmap[o21 + c], q12 = fmap[o12 + c], q22 = fmap[o22 + c];
        sx += d * ((q21 - q11) * wy1 + (q22 - q12) * wy2);
        sy += d * ((q12 - q11) * wx1 + (q22 - q21) * wx2);
        atomicAdd(dmap + o11 + c, d * w11);
        atomicAdd(dmap + o21 + c, d * w21);
        atomicAdd(dmap + o12 + c, d * w12);
        atomicAdd(dmap + o22 + c, d * w22);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        sx += __shfl_down_sync(0xffffffffu, sx, offset);
        sy += __shfl_down_sync(0xffffffffu, sy, offset);
    }
    if (lane == 0) {
        gx[r] = sx;
        gy[r] = sy;
    }
}
"""

_ROUNDED = {"float": ("__fmul_rn", "__fadd_rn"), "double": ("__dmul_rn", "__dadd_rn")}


@functools.cache
def _kernels(type_name: str):
    import cupy

    mul, add = _ROUNDED[type_name]
    code = f"#define MUL {mul}\n#define ADD {add}\n" + SOURCE.replace("TYPE", type_name)
    module = cupy.RawModule(code=code, options=("--std=c++11",))
    return module.get_function(f"bilinear_forward_{type_name}"), module.get_function(f"bilinear_backward_{type_name}")


def _type_name(dtype) -> str:
    if dtype == np.float32:
        return "float"
    if dtype == np.float64:
        return "double"
    raise TypeError(f"the bilinear kernels take float32 or float64 maps, got {dtype}")


def bilinear_forward(flat, rows, weights):
    """(R, C) samples of the flat map ``flat`` (cells, C): ``rows`` (4, R) corner rows (11, 21, 12, 22)
    and ``weights`` (4, R) their bilinear weights."""
    import cupy

    flat = cupy.ascontiguousarray(flat)
    count, channels = int(rows.shape[1]), int(flat.shape[1])
    out = cupy.empty((count, channels), dtype=flat.dtype)
    total = count * channels
    if total:
        forward, _ = _kernels(_type_name(flat.dtype))
        forward(((total + THREADS - 1) // THREADS,), (THREADS,),
                (flat, cupy.ascontiguousarray(rows), cupy.ascontiguousarray(weights, dtype=flat.dtype),
                 np.int64(count), np.int32(channels), out))
    return out


def bilinear_backward(df, flat, rows, weights, axis_weights, dflat):
    """Add ``df`` (R, C) times each corner's weight into ``dflat`` (cells, C, contiguous) at ``rows``, and
    return the pulls (gx, gy), each (R,): sum over C of df * dsample/dx and df * dsample/dy, where
    ``axis_weights`` (4, R) are (wx1, wx2, wy1, wy2). ``df`` may be a row-strided view (unit channel stride)."""
    import cupy

    count, channels = int(rows.shape[1]), int(flat.shape[1])
    if df.ndim != 2 or df.strides[1] != df.itemsize or df.strides[0] % df.itemsize:
        df = cupy.ascontiguousarray(df)
    gx = cupy.empty(count, dtype=flat.dtype)
    gy = cupy.empty(count, dtype=flat.dtype)
    if count:
        _, backward = _kernels(_type_name(flat.dtype))
        backward(((count * 32 + THREADS - 1) // THREADS,), (THREADS,),
                 (df, np.int64(df.strides[0] // df.itemsize), cupy.ascontiguousarray(flat),
                  cupy.ascontiguousarray(rows), cupy.ascontiguousarray(weights, dtype=flat.dtype),
                  cupy.ascontiguousarray(axis_weights, dtype=flat.dtype), np.int64(count), np.int32(channels),
                  dflat, gx, gy))
    return gx, gy
