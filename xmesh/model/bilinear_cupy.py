"""The local projection training pair's bilinear taps on CuPy: each (view, map) in one launch each way.

Both kernels find a sample's cell as the array-API code does (``x = h / (224 / s)``, the floor and
ceiling corners, their rows in the (B*V*(s+1)^2, C) map, the weights ``x2 - x`` ...), each operation
rounded on its own. ``bilinear_forward`` is ``q11 w11 + q21 w21 + q12 w12 + q22 w22`` for every sample
row and channel, rounded as that code rounds it (no fused multiply-add), so its features are the
array-API code's bit for bit. ``bilinear_backward`` (a warp per row, its lanes over the channels) adds
each corner's share of the features' gradient into the map's gradient (atomic adds, as
``cupy.add.at``) and the gradient's pull along the map's two axes, times ``s / 224``, into the
row's pixel gradients; for float32 maps of 16, 32 or 64 channels a thread takes 4 channels of a row
and adds them with one 16-byte atomic. Both run in float32 and float64 (the gradient checks).
"""

from __future__ import annotations

import functools

import numpy as np

from .camera import IMAGE_SIZE

THREADS = 256
#: float32 gradients with 16, 32 or 64 channels take the float4 kernel (False: the warp-per-row one, for comparisons)
FLOAT4_BACKWARD = True
#: rows given in groups (the hypotheses of a vertex) take the grouped kernel, which sums each group's shares in
#: shared memory first (False: the float4 kernel's global atomics, for comparisons)
GROUPED_BACKWARD = True
#: the grouped kernel's window of map cells x channels in shared memory (floats); a group touching more
#: takes global atomics
GROUP_WINDOW_FLOATS = 8192
#: maps of fewer channels (finer maps, whose groups spread over more cells) keep the float4 kernel
GROUP_MIN_CHANNELS = 64
GROUP_THREADS = 128
_opted_in: dict = {}  # the grouped kernel's dynamic shared memory opt-in, by kernel

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
                                                 TYPE* __restrict__ out, long long out_stride) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= count * channels) return;
    const long long r = i / channels;
    const long long c = i - r * channels;
    const Taps t = taps(h, w, r, n, views, view, padded, step);
    TYPE acc = MUL(fmap[t.r11 * channels + c], MUL(t.wx1, t.wy1));
    acc = ADD(acc, MUL(fmap[t.r21 * channels + c], MUL(t.wx2, t.wy1)));
    acc = ADD(acc, MUL(fmap[t.r12 * channels + c], MUL(t.wx1, t.wy2)));
    acc = ADD(acc, MUL(fmap[t.r22 * channels + c], MUL(t.wx2, t.wy2)));
    out[r * out_stride + c] = acc;
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

# four floats added with one 16-byte atomic (compute capability 9.0; four single ones elsewhere): the
# projection backwards' adds into the maps' gradients (here and in local_projection_cupy)
ATOMIC_ADD4 = r"""
__device__ __forceinline__ void add4(float* at, float4 v) {
#if __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float4*>(at), v);
#else
    atomicAdd(at, v.x);
    atomicAdd(at + 1, v.y);
    atomicAdd(at + 2, v.z);
    atomicAdd(at + 3, v.w);
#endif
}
"""

# float32 maps whose channels come in 4, 8 or 16 float4 groups (the stage-2 maps' 16, 32 and 64): a
# thread per (row, group of 4 channels), the row's threads adjacent lanes of one warp, each corner's
# share added with one 16-byte atomic.
SOURCE4 = (
    ATOMIC_ADD4
    + r"""

// a row's gradient of 4 channels (from `drow`) and its pulls along the map's axes over them (the sums sx, sy);
// `map` is the map from those channels on
__device__ __forceinline__ float4 pull4(const float* drow, const float* map, int channels, const Taps& t, float& sx,
                                        float& sy) {
    const float4 d = *reinterpret_cast<const float4*>(drow);
    const float4 q11 = *reinterpret_cast<const float4*>(map + t.r11 * channels);
    const float4 q21 = *reinterpret_cast<const float4*>(map + t.r21 * channels);
    const float4 q12 = *reinterpret_cast<const float4*>(map + t.r12 * channels);
    const float4 q22 = *reinterpret_cast<const float4*>(map + t.r22 * channels);
    sx = d.x * ((q21.x - q11.x) * t.wy1 + (q22.x - q12.x) * t.wy2);
    sx += d.y * ((q21.y - q11.y) * t.wy1 + (q22.y - q12.y) * t.wy2);
    sx += d.z * ((q21.z - q11.z) * t.wy1 + (q22.z - q12.z) * t.wy2);
    sx += d.w * ((q21.w - q11.w) * t.wy1 + (q22.w - q12.w) * t.wy2);
    sy = d.x * ((q12.x - q11.x) * t.wx1 + (q22.x - q21.x) * t.wx2);
    sy += d.y * ((q12.y - q11.y) * t.wx1 + (q22.y - q21.y) * t.wx2);
    sy += d.z * ((q12.z - q11.z) * t.wx1 + (q22.z - q21.z) * t.wx2);
    sy += d.w * ((q12.w - q11.w) * t.wx1 + (q22.w - q21.w) * t.wx2);
    return d;
}

extern "C" __global__ void bilinear_backward4_float(const float* __restrict__ df, long long df_stride,
                                                    const float* __restrict__ fmap, const float* __restrict__ h,
                                                    const float* __restrict__ w, long long count, long long n,
                                                    int views, int view, int padded, float step, float scale,
                                                    int channels, float* dmap, float* __restrict__ dh,
                                                    float* __restrict__ dw) {
    const int group = channels >> 2;   // 4, 8 or 16 lanes a row
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long r = i / group;
    const int c = 4 * (int)(i - r * group);
    float sx = 0.0f, sy = 0.0f;
    if (r < count) {   // no early return: every lane takes part in the shuffles
        const Taps t = taps(h, w, r, n, views, view, padded, step);
        const float w11 = MUL(t.wx1, t.wy1), w21 = MUL(t.wx2, t.wy1), w12 = MUL(t.wx1, t.wy2), w22 = MUL(t.wx2, t.wy2);
        const float4 d = pull4(df + r * df_stride + c, fmap + c, channels, t, sx, sy);
        add4(dmap + t.r11 * channels + c, make_float4(d.x * w11, d.y * w11, d.z * w11, d.w * w11));
        add4(dmap + t.r21 * channels + c, make_float4(d.x * w21, d.y * w21, d.z * w21, d.w * w21));
        add4(dmap + t.r12 * channels + c, make_float4(d.x * w12, d.y * w12, d.z * w12, d.w * w12));
        add4(dmap + t.r22 * channels + c, make_float4(d.x * w22, d.y * w22, d.z * w22, d.w * w22));
    }
    for (int offset = group >> 1; offset > 0; offset >>= 1) {
        sx += __shfl_down_sync(0xffffffffu, sx, offset, group);
        sy += __shfl_down_sync(0xffffffffu, sy, offset, group);
    }
    if (r < count && c == 0) {
        dh[r] = ADD(dh[r], MUL(sx, scale));
        dw[r] = ADD(dw[r], MUL(sy, scale));
    }
}
"""
)

# float32 maps of 16, 32 or 64 channels, the rows of a sample grouped as (hyps, groups): a block per
# (sample, group) of `hyps` rows r = b n + k groups + v. The group's corner shares are summed in shared
# memory over the window of cells its rows touch, then added to the map once per touched cell: fewer
# global atomics, and none from one block to one address. A window over `window_floats` floats takes
# the global atomics of bilinear_backward4_float instead. dh and dw as there.
SOURCE_GROUPED = r"""
extern "C" __global__ void bilinear_backward_grouped_float(
        const float* __restrict__ df, long long df_stride, const float* __restrict__ fmap, const float* __restrict__ h,
        const float* __restrict__ w, long long n, int groups, int hyps, int views, int view, int padded, float step,
        float scale, int channels, int window_floats, float* dmap, float* __restrict__ dh, float* __restrict__ dw) {
    extern __shared__ float acc[];
    __shared__ int bounds[4];   // lowest and highest corner row and column of the group
    const long long g = blockIdx.x;
    const long long sample = g / groups, first = sample * n + (g - sample * groups);
    const int lanes = channels >> 2;   // 4, 8 or 16 threads a row, adjacent lanes of one warp
    if (threadIdx.x == 0) {
        bounds[0] = bounds[2] = 0x7fffffff;
        bounds[1] = bounds[3] = -1;
    }
    __syncthreads();
    for (int k = threadIdx.x; k < hyps; k += blockDim.x) {
        const long long r = first + (long long)k * groups;
        const float x = DIV(h[r], step), y = DIV(w[r], step);
        atomicMin(&bounds[0], (int)floorf(x));
        atomicMax(&bounds[1], (int)ceilf(x));
        atomicMin(&bounds[2], (int)floorf(y));
        atomicMax(&bounds[3], (int)ceilf(y));
    }
    __syncthreads();
    const int x0 = bounds[0], y0 = bounds[2], wy = bounds[3] - y0 + 1;
    const int cells = (bounds[1] - x0 + 1) * wy;
    const bool local = cells * channels <= window_floats;
    const long long base = (sample * views + view) * (long long)padded * padded;
    if (local) {
        for (int i = threadIdx.x; i < cells * channels; i += blockDim.x) acc[i] = 0.0f;
        __syncthreads();
    }
    const int items = hyps * lanes;
    for (int start = 0; start < items; start += blockDim.x) {   // every lane of a warp in each round
        const int i = start + threadIdx.x;
        const int k = i / lanes;
        const int c = 4 * (i - k * lanes);
        const long long r = first + (long long)k * groups;
        float sx = 0.0f, sy = 0.0f;
        if (i < items) {
            const Taps t = taps(h, w, r, n, views, view, padded, step);
            const float w11 = MUL(t.wx1, t.wy1), w21 = MUL(t.wx2, t.wy1);
            const float w12 = MUL(t.wx1, t.wy2), w22 = MUL(t.wx2, t.wy2);
            const float4 d = pull4(df + r * df_stride + c, fmap + c, channels, t, sx, sy);
            const long long rows[4] = {t.r11, t.r21, t.r12, t.r22};
            const float shares[4] = {w11, w21, w12, w22};
            for (int corner = 0; corner < 4; ++corner) {
                const float4 v = make_float4(d.x * shares[corner], d.y * shares[corner], d.z * shares[corner],
                                             d.w * shares[corner]);
                if (local) {
                    const long long cell = rows[corner] - base;
                    const int at = ((int)(cell / padded - x0) * wy + (int)(cell % padded - y0)) * channels + c;
                    atomicAdd(acc + at, v.x);
                    atomicAdd(acc + at + 1, v.y);
                    atomicAdd(acc + at + 2, v.z);
                    atomicAdd(acc + at + 3, v.w);
                } else {
                    add4(dmap + rows[corner] * channels + c, v);
                }
            }
        }
        for (int offset = lanes >> 1; offset > 0; offset >>= 1) {
            sx += __shfl_down_sync(0xffffffffu, sx, offset, lanes);
            sy += __shfl_down_sync(0xffffffffu, sy, offset, lanes);
        }
        if (i < items && c == 0) {
            dh[r] = ADD(dh[r], MUL(sx, scale));
            dw[r] = ADD(dw[r], MUL(sy, scale));
        }
    }
    if (!local) return;
    __syncthreads();
    for (int i = threadIdx.x; i < cells * lanes; i += blockDim.x) {
        const int cell = i / lanes, c = 4 * (i - cell * lanes);
        const float4 v = *reinterpret_cast<const float4*>(acc + cell * channels + c);
        if (v.x != 0.0f || v.y != 0.0f || v.z != 0.0f || v.w != 0.0f) {
            const long long row = base + (long long)(x0 + cell / wy) * padded + (y0 + cell % wy);
            add4(dmap + row * channels + c, v);
        }
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
    code = defines + SOURCE.replace("TYPE", type_name) + (SOURCE4 + SOURCE_GROUPED if type_name == "float" else "")
    module = cupy.RawModule(code=code, options=("--std=c++11",))
    names = ("forward", "backward") + (("backward4", "backward_grouped") if type_name == "float" else ())
    return tuple(module.get_function(f"bilinear_{name}_{type_name}") for name in names)


def _backward4_takes(df, channels: int) -> bool:
    """Whether bilinear_backward4_float reads this float32 gradient: 4, 8 or 16 groups of 4 channels,
    16-byte aligned rows."""
    return (
        df.dtype == np.float32
        and channels in (16, 32, 64)
        and df.data.ptr % 16 == 0
        and (df.strides[0] // df.itemsize) % 4 == 0
    )


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


def bilinear_forward(fmap, h, w, views: int, view: int, out=None):
    """The (B*n, C) bilinear samples of ``view``'s zero-padded maps ``fmap`` (B*V, s+1, s+1, C) at the
    clamped pixel rows ``h`` and columns ``w`` (B, n) of the samples' points; written into ``out`` where
    given (a (B*n, C) array of the map's dtype with unit column stride, e.g. columns of a wider array)."""
    import cupy

    fmap = cupy.ascontiguousarray(fmap)
    h, w = cupy.ascontiguousarray(h, dtype=fmap.dtype), cupy.ascontiguousarray(w, dtype=fmap.dtype)
    channels = int(fmap.shape[3])
    if out is None:
        out = cupy.empty((h.size, channels), dtype=fmap.dtype)
    elif out.shape != (h.size, channels) or out.dtype != fmap.dtype or out.strides[1] != out.itemsize:
        raise ValueError(f"bilinear_forward: out must be ({h.size}, {channels}) {fmap.dtype} with unit column stride")
    total = h.size * channels
    if total:
        forward = _kernels(_type_name(fmap.dtype))[0]
        forward(
            ((total + THREADS - 1) // THREADS,),
            (THREADS,),
            (
                fmap,
                h,
                w,
                *_geometry(fmap, h, view, views, fmap.dtype),
                np.int32(channels),
                out,
                np.int64(out.strides[0] // out.itemsize),
            ),
        )
    return out


def bilinear_backward(df, fmap, h, w, views: int, view: int, dmap, dh, dw, groups: int = 1) -> None:
    """From the samples' gradient ``df`` (B*n, C; a row-strided view is read in place): add each corner's
    share into ``dmap`` (B*V*(s+1)^2, C) and the pulls along the map's axes times s/224 into ``dh``, ``dw``
    (B, n), all contiguous arrays of the map's dtype. ``groups`` > 1: each sample's n rows are
    (n / groups, groups), the rows k * groups + v of one v near one another (a vertex's hypotheses),
    whose shares the grouped kernel sums before adding them to the map."""
    import cupy

    fmap = cupy.ascontiguousarray(fmap)
    if df.ndim != 2 or df.strides[1] != df.itemsize or df.strides[0] % df.itemsize:
        df = cupy.ascontiguousarray(df)
    h, w = cupy.ascontiguousarray(h, dtype=fmap.dtype), cupy.ascontiguousarray(w, dtype=fmap.dtype)
    for name, array in (("dmap", dmap), ("dh", dh), ("dw", dw)):
        if not array.flags.c_contiguous or array.dtype != fmap.dtype:
            raise ValueError(f"bilinear_backward: {name} must be a contiguous {fmap.dtype} array")
    if h.size:
        kernels = _kernels(_type_name(fmap.dtype))
        scale = np.dtype(fmap.dtype).type((fmap.shape[1] - 1) / IMAGE_SIZE)
        channels = int(fmap.shape[3])
        lanes = 32
        backward = kernels[1]
        if (
            GROUPED_BACKWARD
            and groups > 1
            and channels >= GROUP_MIN_CHANNELS
            and h.shape[-1] % groups == 0
            and _backward4_takes(df, channels)
        ):
            grouped, smem = kernels[3], GROUP_WINDOW_FLOATS * 4
            if _opted_in.get(id(grouped), 0) < smem:  # over 48 KB needs the kernel's opt-in, set once
                grouped.max_dynamic_shared_size_bytes = smem
                _opted_in[id(grouped)] = smem
            _, n, *view_geometry = _geometry(fmap, h, view, views, fmap.dtype)  # views, view, padded, step
            grouped(
                (h.shape[0] * groups,),
                (GROUP_THREADS,),
                (
                    df,
                    np.int64(df.strides[0] // df.itemsize),
                    fmap,
                    h,
                    w,
                    n,
                    np.int32(groups),
                    np.int32(h.shape[-1] // groups),
                    *view_geometry,
                    scale,
                    np.int32(channels),
                    np.int32(GROUP_WINDOW_FLOATS),
                    dmap,
                    dh,
                    dw,
                ),
                shared_mem=smem,
            )
            return
        if FLOAT4_BACKWARD and _backward4_takes(df, channels):
            backward, lanes = kernels[2], channels // 4
        backward(
            ((h.size * lanes + THREADS - 1) // THREADS,),
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
