"""A narrow local graph convolution's weights' gradient X^T dY on CuPy, in one pass over X (float32).

The score layer's dY = [dZ | A1^T dZ] is two columns wide, so its weights' gradient (192 x 2 at the
model's widths) is a sum over every hypothesis row of X, 3.4 million rows at batch 32: reading X's
2.6 GB bounds it. cuBLAS's SGEMM spends a 64 x 128 tile on those two columns. Here a team of threads
reads one row of X at a time, each thread 4 columns in one 16-byte load, multiplies them by the row's
dY and adds them up in registers. Each block writes its teams' sums, and
:func:`xmesh.model.products.column_sums` adds the blocks'.
"""

from __future__ import annotations

import functools

import numpy as np

from .products import column_sums

#: The widest dY this pass takes (its row's values sit in registers).
MAX_COLUMNS = 8
# A block's threads at most (whole teams of C / 4), and blocks a multiprocessor at most: at batch 32,
# 0.63 ms with 128 and 16 against 0.66-1.45 for 128-512 threads and 4-16 blocks (H200, one call).
THREADS = 128
BLOCKS_PER_SM = 16
MIN_BLOCK_ROWS = 512  # small batches: blocks of at least this many rows

SOURCE = r"""
// Block g sums rows [g * chunk, (g + 1) * chunk) of X (count x 4 * quads, row stride ldx floats) times
// dY (count x W, contiguous): team t of its blockDim.x / quads teams takes rows t, t + teams, ...,
// thread q of a team columns 4q .. 4q + 3, four rows in flight. The teams' sums go through shared
// memory and the block writes sum_t of them to partials[g, c * W + k] in team order.
extern "C" __global__ void narrow_weight_gradient(const float* __restrict__ x, long long ldx,
                                                  const float* __restrict__ dy, long long count, int quads,
                                                  long long chunk, float* __restrict__ partials) {
    extern __shared__ float team_sums[];
    const int q = threadIdx.x % quads, team = threadIdx.x / quads, teams = blockDim.x / quads;
    const int width = 4 * quads * W;
    const long long begin = blockIdx.x * chunk;
    const long long end = begin + chunk < count ? begin + chunk : count;
    float acc[4][W];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int k = 0; k < W; ++k) acc[j][k] = 0.0f;
    long long r = begin + team;
    for (; r + 3 * teams < end; r += 4 * teams) {
        float4 v[4];
        float d[4][W];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const long long row = r + u * teams;
            v[u] = __ldg(reinterpret_cast<const float4*>(x + row * ldx) + q);
#pragma unroll
            for (int k = 0; k < W; ++k) d[u][k] = __ldg(dy + row * W + k);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int k = 0; k < W; ++k) {
                acc[0][k] = fmaf(v[u].x, d[u][k], acc[0][k]);
                acc[1][k] = fmaf(v[u].y, d[u][k], acc[1][k]);
                acc[2][k] = fmaf(v[u].z, d[u][k], acc[2][k]);
                acc[3][k] = fmaf(v[u].w, d[u][k], acc[3][k]);
            }
    }
    for (; r < end; r += teams) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(x + r * ldx) + q);
#pragma unroll
        for (int k = 0; k < W; ++k) {
            const float d = __ldg(dy + r * W + k);
            acc[0][k] = fmaf(v.x, d, acc[0][k]);
            acc[1][k] = fmaf(v.y, d, acc[1][k]);
            acc[2][k] = fmaf(v.z, d, acc[2][k]);
            acc[3][k] = fmaf(v.w, d, acc[3][k]);
        }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int k = 0; k < W; ++k) team_sums[team * width + (4 * q + j) * W + k] = acc[j][k];
    __syncthreads();
    for (int o = threadIdx.x; o < width; o += blockDim.x) {
        float s = team_sums[o];
        for (int t = 1; t < teams; ++t) s += team_sums[t * width + o];
        partials[blockIdx.x * (long long)width + o] = s;
    }
}
"""


@functools.cache
def _kernel(columns: int):
    import cupy

    code = f"#define W {columns}\n" + SOURCE
    return cupy.RawModule(code=code, options=("--std=c++11",)).get_function("narrow_weight_gradient")


@functools.cache
def _multiprocessors(device_id: int) -> int:
    import cupy

    return int(cupy.cuda.Device(device_id).attributes["MultiProcessorCount"])


def takes(x, dy) -> bool:
    """Whether :func:`weight_gradient` reads ``x`` (R, C) and ``dy`` (R, W) as they lie: float32, x's rows
    16-byte aligned with unit column stride and C a multiple of 4 (at most 4 * THREADS), dy contiguous
    and at most MAX_COLUMNS wide."""
    return (
        x.ndim == 2
        and dy.ndim == 2
        and x.shape[0] == dy.shape[0]
        and str(x.dtype) == "float32"
        and str(dy.dtype) == "float32"
        and x.shape[1] % 4 == 0
        and 0 < x.shape[1] <= 4 * THREADS
        and 0 < dy.shape[1] <= MAX_COLUMNS
        and x.strides[1] == 4
        and x.strides[0] % 16 == 0
        and x.data.ptr % 16 == 0
        and dy.flags.c_contiguous
    )


def weight_gradient(x, dy):
    """``x.T @ dy`` (C, W) for float32 ``x`` (R, C) and narrow ``dy`` (R, W), as :func:`takes` says: per
    thread float32 sums of four rows in flight, then the teams', then the blocks' (``column_sums``)."""
    import cupy

    if not takes(x, dy):
        raise ValueError(f"narrow weight gradient: X {x.shape} {x.dtype} and dY {dy.shape} {dy.dtype} do not fit")
    count, channels = x.shape
    columns = dy.shape[1]
    if count == 0:
        return cupy.zeros((channels, columns), dtype=cupy.float32)
    quads = channels // 4
    teams = max(1, THREADS // quads)
    most = BLOCKS_PER_SM * _multiprocessors(x.device.id)
    blocks = max(1, min(most, -(-count // MIN_BLOCK_ROWS)))
    chunk = -(-count // blocks)
    blocks = max(1, -(-count // chunk))
    width = channels * columns
    partials = cupy.empty((blocks, width), dtype=cupy.float32)
    _kernel(columns)(
        (blocks,),
        (teams * quads,),
        (x, np.int64(x.strides[0] // 4), dy, np.int64(count), np.int32(quads), np.int64(chunk), partials),
        shared_mem=teams * width * 4,
    )
    return cupy.reshape(column_sums(cupy, partials), (channels, columns))
