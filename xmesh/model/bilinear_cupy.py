"""The local projection training pair's bilinear taps on CuPy: each (view, map) in one launch each way.

Both kernels find a sample's cell as the array-API code does (``x = h / (224 / s)``, the floor and
ceiling corners, their rows in the (B*V*(s+1)^2, C) map, the weights ``x2 - x`` ...), each operation
rounded on its own. ``bilinear_forward`` is ``q11 w11 + q21 w21 + q12 w12 + q22 w22`` for every sample
row and channel, rounded as that code rounds it (no fused multiply-add), so its features are the
array-API code's bit for bit. ``bilinear_backward`` (a warp per row, its lanes over the channels) adds
each corner's share of the features' gradient into the map's gradient (atomic adds, as
``cupyx.scatter_add``) and the gradient's pull along the map's two axes, times ``s / 224``, into the
row's pixel gradients. Both run in float32 and float64 (the gradient checks).
"""

from __future__ import annotations

import functools

import numpy as np

from .camera import IMAGE_SIZE

THREADS = 256

SOURCE = r"""
struct Taps {
    long long r11, r21, r12, r22;
    TYPE wx1, wx2, wy1, wy2;
};

// row r's four corners on map `view` of its sample (rows in samples of n), a map of `padded`^2 cells
__device__ __forceinline__ Taps taps(const TYPE* h, const TYPE* w, long long r, long long n, int views, int view,
                                     int padded, TYPE step) {
    const TYPE x = DIV(h[r], step), y = DIV(w[r], step);
    const TYPE x1 = floor(x), x2 = ceil(x), y1 = floor(y), y2 = ceil(y);
    const long long base = ((r / n) * views + view) * (long long)padded * padded;
    Taps t;
    t.r11 = base + (long long)x1 * padded + (long long)y1;
    t.r21 = base + (long long)x2 * padded + (long long)y1;
    t.r12 = base + (long long)x1 * padded + (long long)y2;
    t.r22 = base + (long long)x2 * padded + (long long)y2;
    t.wx1 = SUB(x2, x);
    t.wx2 = SUB(x, x1);
    t.wy1 = SUB(y2, y);
    t.wy2 = SUB(y, y1);
    return t;
}

extern "C" __global__ void bilinear_forward_TYPE(const TYPE* __restrict__ fmap, const TYPE* __restrict__ h,
                                                 const TYPE* __restrict__ w, long long count, long long n, int views,
                                                 int view, int padded, TYPE step, int channels,
                                                 TYPE* __restrict__ out) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= count * channels) return;
    const long long r = i / channels;
    const long long c = i - r * channels;
    const Taps t = taps(h, w, r, n, views, view, padded, step);
    TYPE acc = MUL(fmap[t.r11 * channels + c], MUL(t.wx1, t.wy1));
    acc = ADD(acc, MUL(fmap[t.r21 * channels + c], MUL(t.wx2, t.wy1)));
    acc = ADD(acc, MUL(fmap[t.r12 * channels + c], MUL(t.wx1, t.wy2)));
    acc = ADD(acc, MUL(fmap[t.r22 * channels + c], MUL(t.wx2, t.wy2)));
    out[i] = acc;
}

extern "C" __global__ void bilinear_backward_TYPE(const TYPE* __restrict__ df, long long df_stride,
                                                  const TYPE* __restrict__ fmap, const TYPE* __restrict__ h,
                                                  const TYPE* __restrict__ w, long long count, long long n, int views,
                                                  int view, int padded, TYPE step, TYPE scale, int channels,
                                                  TYPE* dmap, TYPE* __restrict__ dh, TYPE* __restrict__ dw) {
    const long long r = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (r >= count) return;   // a whole warp: r is the same for its 32 lanes
    const Taps t = taps(h, w, r, n, views, view, padded, step);
    const TYPE w11 = MUL(t.wx1, t.wy1), w21 = MUL(t.wx2, t.wy1), w12 = MUL(t.wx1, t.wy2), w22 = MUL(t.wx2, t.wy2);
    TYPE sx = 0, sy = 0;
    for (int c = lane; c < channels; c += 32) {
        const TYPE d = df[r * df_stride + c];
        const TYPE q11 = fmap[t.r11 * channels + c], q21 = fmap[t.r21 * channels + c];
        const TYPE q12 = fmap[t.r12 * channels + c], q22 = fmap[t.r22 * channels + c];
        sx += d * ((q21 - q11) * t.wy1 + (q22 - q12) * t.wy2);
        sy += d * ((q12 - q11) * t.wx1 + (q22 - q21) * t.wx2);
        atomicAdd(dmap + t.r11 * channels + c, d * w11);
        atomicAdd(dmap + t.r21 * channels + c, d * w21);
        atomicAdd(dmap + t.r12 * channels + c, d * w12);
        atomicAdd(dmap + t.r22 * channels + c, d * w22);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        sx += __shfl_down_sync(0xffffffffu, sx, offset);
        sy += __shfl_down_sync(0xffffffffu, sy, offset);
    }
    if (lane == 0) {
        dh[r] = ADD(dh[r], MUL(sx, scale));
        dw[r] = ADD(dw[r], MUL(sy, scale));
    }
}
"""

_ROUNDED = {
    "float": ("__fmul_rn", "__fadd_rn", "__fsub_rn", "__fdiv_rn"),
    "double": ("__dmul_rn", "__dadd_rn", "__dsub_rn", "__ddiv_rn"),
}


@functools.cache
def _kernels(type_name: str):
    import cupy

    defines = "".join(
        f"#define {op} {name}\n" for op, name in zip(("MUL", "ADD", "SUB", "DIV"), _ROUNDED[type_name], strict=True)
    )
    module = cupy.RawModule(code=defines + SOURCE.replace("TYPE", type_name), options=("--std=c++11",))
    return module.get_function(f"bilinear_forward_{type_name}"), module.get_function(f"bilinear_backward_{type_name}")


def _type_name(dtype) -> str:
    if dtype == np.float32:
        return "float"
    if dtype == np.float64:
        return "double"
    raise TypeError(f"the bilinear kernels take float32 or float64 maps, got {dtype}")


def _geometry(fmap, h, view: int, views: int, dtype) -> tuple:
    """The kernels' (count, n, views, view, padded, step) arguments for a (B*V, s+1, s+1, C) map."""
    padded = int(fmap.shape[1])
    scalar = np.dtype(dtype).type
    return (
        np.int64(h.size),
        np.int64(h.shape[-1]),
        np.int32(views),
        np.int32(view),
        np.int32(padded),
        scalar(IMAGE_SIZE / (padded - 1)),
    )


def bilinear_forward(fmap, h, w, views: int, view: int):
    """The (B*n, C) bilinear samples of ``view``'s zero-padded maps ``fmap`` (B*V, s+1, s+1, C) at the
    clamped pixel rows ``h`` and columns ``w`` (B, n) of the samples' points."""
    import cupy

    fmap = cupy.ascontiguousarray(fmap)
    h, w = cupy.ascontiguousarray(h, dtype=fmap.dtype), cupy.ascontiguousarray(w, dtype=fmap.dtype)
    channels = int(fmap.shape[3])
    out = cupy.empty((h.size, channels), dtype=fmap.dtype)
    total = h.size * channels
    if total:
        forward, _ = _kernels(_type_name(fmap.dtype))
        forward(
            ((total + THREADS - 1) // THREADS,),
            (THREADS,),
            (fmap, h, w, *_geometry(fmap, h, view, views, fmap.dtype), np.int32(channels), out),
        )
    return out


def bilinear_backward(df, fmap, h, w, views: int, view: int, dmap, dh, dw) -> None:
    """From the samples' gradient ``df`` (B*n, C; a row-strided view is read in place): add each corner's
    share into ``dmap`` (B*V*(s+1)^2, C) and the pulls along the map's axes times s/224 into ``dh``, ``dw``
    (B, n), all contiguous arrays of the map's dtype."""
    import cupy

    fmap = cupy.ascontiguousarray(fmap)
    if df.ndim != 2 or df.strides[1] != df.itemsize or df.strides[0] % df.itemsize:
        df = cupy.ascontiguousarray(df)
    h, w = cupy.ascontiguousarray(h, dtype=fmap.dtype), cupy.ascontiguousarray(w, dtype=fmap.dtype)
    for name, array in (("dmap", dmap), ("dh", dh), ("dw", dw)):
        if not array.flags.c_contiguous or array.dtype != fmap.dtype:
            raise ValueError(f"bilinear_backward: {name} must be a contiguous {fmap.dtype} array")
    if h.size:
        _, backward = _kernels(_type_name(fmap.dtype))
        scale = np.dtype(fmap.dtype).type((fmap.shape[1] - 1) / IMAGE_SIZE)
        backward(
            ((h.size * 32 + THREADS - 1) // THREADS,),
            (THREADS,),
            (
                df,
                np.int64(df.strides[0] // df.itemsize),
                fmap,
                h,
                w,
                *_geometry(fmap, h, view, views, fmap.dtype),
                scale,
                np.int32(fmap.shape[3]),
                dmap,
                dh,
                dw,
            ),
        )
