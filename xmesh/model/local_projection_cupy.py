"""The local projection's training pair on CuPy in one launch each way (float32, the model's three maps).

The forward is the per-view taps (:mod:`.bilinear_cupy`) and the pooling (:mod:`.view_pool_cupy`)
without the (V, B*n, C) stack between them: a warp per point, a lane per 4 channels of the maps'
concatenation (28 lanes for the model's 16 + 32 + 64). The warp works out the point's pixel and its
bilinear corners once for each view and map (the array-API code's float32 operations, each rounded;
lane j takes view j / 3 on map j % 3, into shared memory), then each lane samples its channels with
16-byte gathers and pools them over the views into the point's row ``[point, max, mean, std]``.

The backward takes a group of rows at a time (a vertex's 43 hypotheses, whose pixels it works out
once into shared memory), a warp per row again, its corners worked out as the forward's and each
row's pooled values and their gradients read in 16-byte loads: it samples the views once more (the
same operations, so the same values, ties included), splits the pooled gradients over the views as
:func:`view_pool_cupy.pool_views_backward` does, adds each corner's share into the maps' gradients
with 16-byte atomics, sums the pulls along each map's axes over the lanes and carries them through
the clamp and the camera into the point's gradient: no (V, B*n, C) gradient, no pixel arrays, no
array-API camera arithmetic. (Summing a group's shares of the 64-channel map in a window of shared
memory first, as :mod:`.bilinear_cupy`'s grouped kernel does, made it no faster at batch 1 and 6%
slower at batch 32: ``scripts/projection_backward_bench.py``.)
"""

from __future__ import annotations

import functools

import numpy as np

from .bilinear_cupy import ATOMIC_ADD4

MAPS = 3  # the stage-2 maps the pair takes (conv 2, 5 and 8)
FORWARD_WARPS = 8  # rows a forward block takes, a warp each
BACKWARD_THREADS = 256
#: the backward's blocks a multiprocessor: 2 caps its registers at 128 (3 views take 126, none
#: spilled; 3 blocks spill a few at 80 and took the batch-32 step 0.6-1.0 ms longer)
BACKWARD_BLOCKS = 2
MAX_VIEWS = 8  # a module per view count, its per-view values in registers
MAX_GROUP_ROWS = 64  # the backward's rows a block (LP_MAX_HYPS)

SOURCE = r"""
#define LP_FOCAL 248.0f
#define LP_CENTER 112.0f
#define LP_MAX_PIXEL 223.0f
#define LP_MAPS 3
#define LP_MAX_HYPS 64   // the backward's rows a group

struct LpMaps {
    const float* map[LP_MAPS];
    int padded[LP_MAPS];    // cells a side of the zero-padded map
    int channels[LP_MAPS];
};
// The kernels' map arguments: three maps (B*V, s+1, s+1, C) float32, 16-byte aligned, C a multiple of 4.
#define LP_MAP_PARAMS const float* __restrict__ m0, const float* __restrict__ m1, const float* __restrict__ m2, \
    int s0, int s1, int s2, int c0, int c1, int c2
#define LP_MAPS_FROM_PARAMS {{m0, m1, m2}, {s0, s1, s2}, {c0, c1, c2}}

// A point in one view: its pixel before (h, w) and after the clamp (hc, wc), and in the view's frame (q).
struct LpView {
    float h, w, hc, wc, q0, q1, q2;
};

// Camera-0 point p of the sample whose packed transforms are T, in view v: the array-API code's
// float32 operations (camera.mat3's order), each rounded.
__device__ __forceinline__ LpView lp_view(const float* __restrict__ T, int v, float p0, float p1, float p2) {
    const float* F = T;
    const float* o0 = T + 9;
    const float* R = T + 12 + 9 * v;
    const float* ov = T + 12 + 9 * LP_VIEWS + 3 * v;
    float d[3];
#pragma unroll
    for (int j = 0; j < 3; ++j) {
        const float world = __fadd_rn(
            __fadd_rn(__fadd_rn(__fmul_rn(p0, F[j]), __fmul_rn(p1, F[3 + j])), __fmul_rn(p2, F[6 + j])), o0[j]);
        d[j] = __fsub_rn(world, ov[j]);
    }
    float q[3];
#pragma unroll
    for (int j = 0; j < 3; ++j)
        q[j] = __fadd_rn(__fadd_rn(__fmul_rn(d[0], R[j]), __fmul_rn(d[1], R[3 + j])), __fmul_rn(d[2], R[6 + j]));
    LpView out;
    out.q0 = q[0];
    out.q1 = q[1];
    out.q2 = q[2];
    out.h = __fadd_rn(__fmul_rn(LP_FOCAL, __fdiv_rn(-q[1], -q[2])), LP_CENTER);
    out.w = __fadd_rn(__fmul_rn(LP_FOCAL, __fdiv_rn(q[0], -q[2])), LP_CENTER);
    // min(max(.)) as the array-API code's, a NaN kept
    out.hc = out.h < 0.0f ? 0.0f : out.h;
    out.hc = out.hc > LP_MAX_PIXEL ? LP_MAX_PIXEL : out.hc;
    out.wc = out.w < 0.0f ? 0.0f : out.w;
    out.wc = out.wc > LP_MAX_PIXEL ? LP_MAX_PIXEL : out.wc;
    return out;
}

// The four corners (q11, q21, q12, q22) of a clamped pixel in view v on a map of `padded` cells a
// side, as cell indices within the sample's views of that map, and their weights, as bilinear_cupy's
// taps. 32 bytes: a warp's taps lie in shared memory (lp_share_taps). 32-bit offsets: a sample's views
// of one map hold fewer than 2^31 floats (takes() checks).
struct LpTaps {
    int cell[4];
    float wx1, wx2, wy1, wy2;
};

__device__ __forceinline__ LpTaps lp_taps(const LpView& pv, int v, int padded) {
    const float step = (float)(224.0 / (double)(padded - 1));
    const float x = __fdiv_rn(pv.hc, step), y = __fdiv_rn(pv.wc, step);
    const float x1 = floorf(x), x2 = ceilf(x), y1 = floorf(y), y2 = ceilf(y);
    const int base = v * padded * padded;
    LpTaps t;
    t.cell[0] = base + (int)x1 * padded + (int)y1;
    t.cell[1] = base + (int)x2 * padded + (int)y1;
    t.cell[2] = base + (int)x1 * padded + (int)y2;
    t.cell[3] = base + (int)x2 * padded + (int)y2;
    t.wx1 = __fsub_rn(x2, x);
    t.wx2 = __fsub_rn(x, x1);
    t.wy1 = __fsub_rn(y2, y);
    t.wy2 = __fsub_rn(y, y1);
    return t;
}

// A warp's point in every view on every map, worked out once: lane j < LP_MAPS * LP_VIEWS takes view
// j / LP_MAPS on map j % LP_MAPS (its pixel from `view`, the point in that view) into taps[j], where
// lane l of map m finds view v's at taps[LP_MAPS * v + m]. The whole warp calls it.
template <typename View>
__device__ __forceinline__ void lp_share_taps(LpTaps* taps, const LpMaps& maps, int lane, View view) {
    if (lane < LP_MAPS * LP_VIEWS) {
        const int v = lane / LP_MAPS, m = lane - LP_MAPS * v;
        const int padded = m == 0 ? maps.padded[0] : (m == 1 ? maps.padded[1] : maps.padded[2]);
        taps[lane] = lp_taps(view(v), v, padded);
    }
    __syncwarp();
}

// The lane's 4 channels: which map (its pointer, cells a side and channels) and its first channel there
// (false for the lanes past the channel groups).
struct LpLane {
    const float* map;
    int index, padded, channels, c;
    bool valid;
};

__device__ __forceinline__ LpLane lp_lane(const LpMaps& maps, int lane) {
    const int g0 = maps.channels[0] >> 2, g1 = g0 + (maps.channels[1] >> 2), g2 = g1 + (maps.channels[2] >> 2);
    LpLane l;
    l.index = lane < g0 ? 0 : (lane < g1 ? 1 : 2);
    l.valid = lane < g2;
    l.map = l.index == 0 ? maps.map[0] : (l.index == 1 ? maps.map[1] : maps.map[2]);
    l.padded = l.index == 0 ? maps.padded[0] : (l.index == 1 ? maps.padded[1] : maps.padded[2]);
    l.channels = l.index == 0 ? maps.channels[0] : (l.index == 1 ? maps.channels[1] : maps.channels[2]);
    l.c = 4 * (lane - (l.index == 0 ? 0 : (l.index == 1 ? g0 : g1)));
    return l;
}

__device__ __forceinline__ float4 lp_load4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// The bilinear sample of 4 channels, rounded as bilinear_forward's.
__device__ __forceinline__ float lp_lerp(float q11, float q21, float q12, float q22, const LpTaps& t) {
    float acc = __fmul_rn(q11, __fmul_rn(t.wx1, t.wy1));
    acc = __fadd_rn(acc, __fmul_rn(q21, __fmul_rn(t.wx2, t.wy1)));
    acc = __fadd_rn(acc, __fmul_rn(q12, __fmul_rn(t.wx1, t.wy2)));
    return __fadd_rn(acc, __fmul_rn(q22, __fmul_rn(t.wx2, t.wy2)));
}

// `map`: the lane's first channel in the sample's views of its map (channels floats a cell).
__device__ __forceinline__ void lp_sample4(const float* map, int channels, const LpTaps& t, float* f) {
    const float4 q11 = lp_load4(map + t.cell[0] * channels), q21 = lp_load4(map + t.cell[1] * channels);
    const float4 q12 = lp_load4(map + t.cell[2] * channels), q22 = lp_load4(map + t.cell[3] * channels);
    f[0] = lp_lerp(q11.x, q21.x, q12.x, q22.x, t);
    f[1] = lp_lerp(q11.y, q21.y, q12.y, q22.y, t);
    f[2] = lp_lerp(q11.z, q21.z, q12.z, q22.z, t);
    f[3] = lp_lerp(q11.w, q21.w, q12.w, q22.w, t);
}

// The start of sample b's views of a map of `padded` cells a side.
__device__ __forceinline__ long long lp_base(int b, int padded) {
    return (long long)b * LP_VIEWS * padded * padded;
}

// Floats 3 + 4 lane .. 6 + 4 lane of a row (a lane's 4 channels of one of [max, mean, std], `row` at
// that part's start less 3), for the first `lanes` lanes. With `aligned` rows (16-byte aligned, as
// the rows of 3 + 3 * total floats padded to a multiple of 4 are) a lane loads floats 4 lane ..
// 4 lane + 3 in one 16-byte load and takes 3 of them from its neighbour: one load instead of four,
// each filling whole sectors. The whole warp calls it.
__device__ __forceinline__ float4 lp_lane_part(const float* row, int lane, int lanes, bool aligned) {
    if (aligned) {
        const float4 a = lane <= lanes ? lp_load4(row + 4 * lane) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        return make_float4(a.w, __shfl_down_sync(0xffffffffu, a.x, 1), __shfl_down_sync(0xffffffffu, a.y, 1),
                           __shfl_down_sync(0xffffffffu, a.z, 1));
    }
    if (lane >= lanes) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float* at = row + 4 * lane + 3;
    return make_float4(at[0], at[1], at[2], at[3]);
}

// Rows r of (B*n) points p (B*n, 3) -> out rows (ldo = 3 + 3 total + 1 floats, 16-byte aligned)
// [p, max, mean, std, 0], a warp a row;
// consecutive warps take a group's rows b n + k groups + v (k < n / groups), near one another.
extern "C" __global__ void lp_forward(const float* __restrict__ points, const float* __restrict__ tf, LP_MAP_PARAMS,
                                      long long rows, long long n, int groups, float* __restrict__ out,
                                      long long ldo) {
    const LpMaps maps = LP_MAPS_FROM_PARAMS;
    const int lane = threadIdx.x & 31;
    const long long w = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (w >= rows) return;   // the whole warp
    const long long hyps = n / groups, group = w / hyps;
    const int b = (int)(group / groups);
    const long long r = (long long)b * n + (w - group * hyps) * groups + (group - (long long)b * groups);
    const float* T = tf + (long long)b * (12 + 12 * LP_VIEWS);
    const float p0 = points[3 * r], p1 = points[3 * r + 1], p2 = points[3 * r + 2];
    const LpLane l = lp_lane(maps, lane);
    float* row = out + r * ldo;
    const int total = (maps.channels[0] + maps.channels[1] + maps.channels[2]);
    __shared__ LpTaps shared_taps[LP_FORWARD_WARPS][LP_MAPS * LP_VIEWS];
    LpTaps* taps = shared_taps[threadIdx.x >> 5];
    lp_share_taps(taps, maps, lane, [&](int v) { return lp_view(T, v, p0, p1, p2); });
    float pooled[3][4] = {};   // the lane's channels' max, mean and std
    if (l.valid) {
        const float* map = l.map + lp_base(b, l.padded) * l.channels + l.c;
        float vals[LP_VIEWS][4];
#pragma unroll
        for (int v = 0; v < LP_VIEWS; ++v) lp_sample4(map, l.channels, taps[LP_MAPS * v + l.index], vals[v]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {   // view_pool_cupy's max, mean and std, each operation rounded
            float top = vals[0][j], sum = vals[0][j];
#pragma unroll
            for (int v = 1; v < LP_VIEWS; ++v) {
                top = vals[v][j] > top ? vals[v][j] : top;
                sum = __fadd_rn(sum, vals[v][j]);
            }
            const float mean = __fdiv_rn(sum, (float)LP_VIEWS);
            float square = 0.0f;
#pragma unroll
            for (int v = 0; v < LP_VIEWS; ++v) {
                const float d = __fsub_rn(vals[v][j], mean);
                square = __fadd_rn(square, __fmul_rn(d, d));
            }
            pooled[0][j] = top;
            pooled[1][j] = mean;
            pooled[2][j] = __fsqrt_rn(__fadd_rn(__fdiv_rn(square, (float)LP_VIEWS), 1e-6f));
        }
    }
    // The row [p, max, mean, std, 0] (3 + 3 total + 1 floats) in 16-byte stores: part s's float4 at
    // s total + 4 lane is the lane before's last 3 floats of the part (lane 0: the point, or the last
    // lane's of the part before) and this lane's first; the last lane past the part writes the row's end.
    const int last = (total >> 2) - 1;
#pragma unroll
    for (int part = 0; part < 3; ++part) {
        float before[3];
#pragma unroll
        for (int e = 0; e < 3; ++e) {
            const float own = __shfl_sync(0xffffffffu, pooled[part][e + 1], lane > 0 ? lane - 1 : 0);
            const float previous = __shfl_sync(0xffffffffu, pooled[part > 0 ? part - 1 : 0][e + 1], last);
            before[e] = lane > 0 ? own : (part == 0 ? (e == 0 ? p0 : (e == 1 ? p1 : p2)) : previous);
        }
        if (lane <= last || (part == 2 && lane == last + 1))
            *reinterpret_cast<float4*>(row + part * total + 4 * lane) =
                make_float4(before[0], before[1], before[2], lane <= last ? pooled[part][0] : 0.0f);
    }
}

// A group's `hyps` rows first + k * groups (k < hyps) of sample b's n, a block per group and a warp a
// row: the gradients of the maps (added into dmaps) and of the points (dpoints, (B*n, 3)) from the
// features' dfeats (rows lddf floats apart) and the forward's features (rows ldf floats apart).
extern "C" __global__ void __launch_bounds__(LP_BACKWARD_THREADS, LP_BACKWARD_BLOCKS)
lp_backward(const float* __restrict__ points, const float* __restrict__ tf, LP_MAP_PARAMS,
            const float* __restrict__ feats, long long ldf, const float* __restrict__ dfeats, long long lddf,
            long long n, int groups, int hyps, float* dmap0, float* dmap1, float* dmap2,
            float* __restrict__ dpoints, int aligned) {
    const LpMaps maps = LP_MAPS_FROM_PARAMS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int b = (int)(blockIdx.x / groups);
    const long long first = (long long)b * n + (blockIdx.x - (long long)b * groups);
    const float* T = tf + (long long)b * (12 + 12 * LP_VIEWS);
    const int total = (maps.channels[0] + maps.channels[1] + maps.channels[2]);

    __shared__ LpView pixels[LP_MAX_HYPS * LP_VIEWS];   // each (row, view)'s, worked out once
    for (int i = threadIdx.x; i < hyps * LP_VIEWS; i += blockDim.x) {
        const int k = i / LP_VIEWS, v = i - k * LP_VIEWS;
        const long long r = first + (long long)k * groups;
        pixels[i] = lp_view(T, v, points[3 * r], points[3 * r + 1], points[3 * r + 2]);
    }
    __syncthreads();

    const LpLane l = lp_lane(maps, lane);
    const int m = l.index;
    const int padded = l.padded, channels = l.channels;
    const long long at = lp_base(b, padded) * channels + l.c;   // the lane's first channel in the sample's views
    const float* map = l.map + at;
    float* dmap = (m == 0 ? dmap0 : (m == 1 ? dmap1 : dmap2)) + at;
    const float scale = (float)((double)(padded - 1) / 224.0);
    __shared__ LpTaps shared_taps[LP_BACKWARD_THREADS / 32][LP_MAPS * LP_VIEWS];
    LpTaps* taps = shared_taps[warp];
    for (int k = warp; k < hyps; k += warps) {
        const long long r = first + (long long)k * groups;
        const LpView* pv = pixels + k * LP_VIEWS;
        __syncwarp();   // the row before's taps are read
        lp_share_taps(taps, maps, lane, [&](int v) { return pv[v]; });
        float sx[LP_VIEWS], sy[LP_VIEWS];
#pragma unroll
        for (int v = 0; v < LP_VIEWS; ++v) sx[v] = sy[v] = 0.0f;
        float f[LP_VIEWS][4];   // the lane's channels sampled in each view (valid lanes)
        if (l.valid) {
#pragma unroll
            for (int v = 0; v < LP_VIEWS; ++v) lp_sample4(map, channels, taps[LP_MAPS * v + m], f[v]);
        }
        // the lane's channels of the forward's max, mean and std and of their gradients
        const float* frow = feats + r * ldf;
        const float* drow = dfeats + r * lddf;
        const float4 top4 = lp_lane_part(frow, lane, total >> 2, aligned);
        const float4 mean4 = lp_lane_part(frow + total, lane, total >> 2, aligned);
        const float4 std4 = lp_lane_part(frow + 2 * total, lane, total >> 2, aligned);
        const float4 dtop4 = lp_lane_part(drow, lane, total >> 2, aligned);
        const float4 dmean4 = lp_lane_part(drow + total, lane, total >> 2, aligned);
        const float4 dstd4 = lp_lane_part(drow + 2 * total, lane, total >> 2, aligned);
        if (l.valid) {
            // view_pool_cupy's backward: the max's gradient split among the tied views, the mean's, the std's
            const float top[4] = {top4.x, top4.y, top4.z, top4.w}, mean[4] = {mean4.x, mean4.y, mean4.z, mean4.w};
            const float sdev[4] = {std4.x, std4.y, std4.z, std4.w}, dtop[4] = {dtop4.x, dtop4.y, dtop4.z, dtop4.w};
            const float dmean[4] = {dmean4.x, dmean4.y, dmean4.z, dmean4.w};
            const float dstd[4] = {dstd4.x, dstd4.y, dstd4.z, dstd4.w};
            float share[4], through_mean[4], spread[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                int ties = 0;
#pragma unroll
                for (int v = 0; v < LP_VIEWS; ++v) ties += f[v][j] == top[j];
                share[j] = __fdiv_rn(dtop[j], (float)ties);
                through_mean[j] = __fdiv_rn(dmean[j], (float)LP_VIEWS);
                spread[j] = __fdiv_rn(dstd[j], __fmul_rn((float)LP_VIEWS, sdev[j]));
            }
#pragma unroll
            for (int v = 0; v < LP_VIEWS; ++v) {
                const LpTaps t = taps[LP_MAPS * v + m];
                float d[4];
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    d[j] = __fadd_rn(__fadd_rn(f[v][j] == top[j] ? share[j] : 0.0f, through_mean[j]),
                                     __fmul_rn(__fsub_rn(f[v][j], mean[j]), spread[j]));
                const float4 q11 = lp_load4(map + t.cell[0] * channels);
                const float4 q21 = lp_load4(map + t.cell[1] * channels);
                const float4 q12 = lp_load4(map + t.cell[2] * channels);
                const float4 q22 = lp_load4(map + t.cell[3] * channels);
                const float wy1 = t.wy1, wy2 = t.wy2, wx1 = t.wx1, wx2 = t.wx2;
                sx[v] = d[0] * ((q21.x - q11.x) * wy1 + (q22.x - q12.x) * wy2);
                sx[v] += d[1] * ((q21.y - q11.y) * wy1 + (q22.y - q12.y) * wy2);
                sx[v] += d[2] * ((q21.z - q11.z) * wy1 + (q22.z - q12.z) * wy2);
                sx[v] += d[3] * ((q21.w - q11.w) * wy1 + (q22.w - q12.w) * wy2);
                sy[v] = d[0] * ((q12.x - q11.x) * wx1 + (q22.x - q21.x) * wx2);
                sy[v] += d[1] * ((q12.y - q11.y) * wx1 + (q22.y - q21.y) * wx2);
                sy[v] += d[2] * ((q12.z - q11.z) * wx1 + (q22.z - q21.z) * wx2);
                sy[v] += d[3] * ((q12.w - q11.w) * wx1 + (q22.w - q21.w) * wx2);
                sx[v] *= scale;
                sy[v] *= scale;
                const float w[4] = {__fmul_rn(wx1, wy1), __fmul_rn(wx2, wy1), __fmul_rn(wx1, wy2), __fmul_rn(wx2, wy2)};
#pragma unroll
                for (int corner = 0; corner < 4; ++corner) {
                    const float weight = w[corner];
                    add4(dmap + t.cell[corner] * channels,
                            make_float4(d[0] * weight, d[1] * weight, d[2] * weight, d[3] * weight));
                }
            }
        }
#pragma unroll
        for (int v = 0; v < LP_VIEWS; ++v)
            for (int offset = 16; offset > 0; offset >>= 1) {
                sx[v] += __shfl_down_sync(0xffffffffu, sx[v], offset);
                sy[v] += __shfl_down_sync(0xffffffffu, sy[v], offset);
            }
        if (lane == 0) {   // through the clamp (TF's gradient where the pixel lies in [0, 223]) and the cameras
            const float* F = T;
            float dp[3] = {dfeats[r * lddf], dfeats[r * lddf + 1], dfeats[r * lddf + 2]};
#pragma unroll
            for (int v = 0; v < LP_VIEWS; ++v) {
                const LpView& at = pv[v];
                const float dh = (at.h >= 0.0f && at.h <= LP_MAX_PIXEL) ? sx[v] : 0.0f;
                const float dw = (at.w >= 0.0f && at.w <= LP_MAX_PIXEL) ? sy[v] : 0.0f;
                const float focal_z = LP_FOCAL / at.q2;
                const float dq[3] = {-dw * focal_z, dh * focal_z, (dw * at.q0 - dh * at.q1) * focal_z / at.q2};
                const float* R = T + 12 + 9 * v;
                float dworld[3];
#pragma unroll
                for (int i = 0; i < 3; ++i) dworld[i] = dq[0] * R[3 * i] + dq[1] * R[3 * i + 1] + dq[2] * R[3 * i + 2];
#pragma unroll
                for (int i = 0; i < 3; ++i)
                    dp[i] += dworld[0] * F[3 * i] + dworld[1] * F[3 * i + 1] + dworld[2] * F[3 * i + 2];
            }
            dpoints[3 * r] = dp[0];
            dpoints[3 * r + 1] = dp[1];
            dpoints[3 * r + 2] = dp[2];
        }
    }
}
"""


@functools.cache
def _module(views: int, blocks: int):
    import cupy

    defines = "".join(
        f"#define {name} {value}\n"
        for name, value in (
            ("LP_VIEWS", views),
            ("LP_BACKWARD_THREADS", BACKWARD_THREADS),
            ("LP_FORWARD_WARPS", FORWARD_WARPS),
            ("LP_BACKWARD_BLOCKS", blocks),
        )
    )
    return cupy.RawModule(code=defines + ATOMIC_ADD4 + SOURCE, options=("--std=c++11",))


def _kernels(views: int):
    module = _module(views, BACKWARD_BLOCKS)
    return module.get_function("lp_forward"), module.get_function("lp_backward")


def takes(points, maps, views: int) -> bool:
    """Whether the pair takes these operands: float32 points (B, n, 3), the three float32 maps, contiguous
    and 16-byte aligned, of channel counts that are multiples of 4 and fill at most 29 lanes, each
    sample's views of a map under 2^31 floats, up to ``MAX_VIEWS`` views."""
    if str(points.dtype) != "float32" or points.ndim != 3 or len(maps) != MAPS or not 1 <= views <= MAX_VIEWS:
        return False
    channels = [int(m.shape[3]) for m in maps]
    return (
        all(c % 4 == 0 for c in channels)
        and sum(channels) // 4 + 3 <= 32
        and all(views * int(m.shape[1]) * int(m.shape[2]) * int(m.shape[3]) < 2**31 for m in maps)
        and all(str(m.dtype) == "float32" and m.flags.c_contiguous and m.data.ptr % 16 == 0 for m in maps)
    )


def _map_arguments(maps) -> tuple:
    return (
        *maps,
        *(np.int32(m.shape[1]) for m in maps),
        *(np.int32(m.shape[3]) for m in maps),
    )


def forward(points, maps, packed, views: int, groups: int = 1):
    """The features (B, n, row) of points (B, n, 3) on the zero-padded maps (B*V, s+1, s+1, C): rows
    ``[point, max, mean, std]`` of 3 + 3 * sum(C) floats and a zero, a multiple of 4 (the layer
    kernels' 16-byte copies; the kernel's 16-byte stores). ``packed``: the (B, 12 + 12V) transforms.
    ``groups``: each sample's rows are (n / groups, groups), and the rows k * groups + v of one v (a
    vertex's hypotheses, which sample the same few cells) are taken one after another."""
    import cupy

    points = cupy.ascontiguousarray(points)
    packed = cupy.ascontiguousarray(packed, dtype=cupy.float32)
    batch, n, _ = points.shape
    if n % groups:
        groups = 1
    row = 3 + 3 * sum(int(m.shape[3]) for m in maps) + 1  # a multiple of 4: the channels come in fours
    out = cupy.empty((batch, n, row), dtype=cupy.float32)
    rows = batch * n
    if rows:
        _kernels(views)[0](
            (-(-rows // FORWARD_WARPS),),
            (32 * FORWARD_WARPS,),
            (
                points,
                packed,
                *_map_arguments(maps),
                np.int64(rows),
                np.int64(n),
                np.int32(groups),
                out,
                np.int64(row),
            ),
        )
    return out


def _row_stride(array) -> int:
    return array.strides[-2] // array.itemsize


def backward(dfeats, feats, points, maps, packed, views: int, groups: int = 1, into=None):
    """(dpoints (B, n, 3), [dmap (B*V, s+1, s+1, C)]) from the features' gradient ``dfeats`` (B, n, width),
    the forward's ``feats`` (B, n, row) and its inputs. ``groups``: each sample's rows are (n / groups,
    groups), a block taking the rows k * groups + v of one v (a vertex's hypotheses, near one another);
    groups of more than ``MAX_GROUP_ROWS`` rows are taken a row a block. ``into``: contiguous maps'
    gradients of the same shapes that the shares are added to (and returned), instead of zeros."""
    import cupy

    batch, n, _ = points.shape
    if n % groups or n // groups > MAX_GROUP_ROWS:
        groups = n
    if dfeats.strides[-1] != dfeats.itemsize or dfeats.strides[0] != n * dfeats.strides[1]:
        dfeats = cupy.ascontiguousarray(dfeats)
    points = cupy.ascontiguousarray(points)
    packed = cupy.ascontiguousarray(packed, dtype=cupy.float32)
    if into is not None and not all(
        d.shape == m.shape and d.dtype == m.dtype and d.flags.c_contiguous for d, m in zip(into, maps, strict=True)
    ):
        raise ValueError("local projection backward: into must hold contiguous arrays of the maps' shapes")
    dmaps = list(into) if into is not None else [cupy.zeros_like(m) for m in maps]
    dpoints = cupy.empty_like(points)
    aligned = all(_row_stride(a) % 4 == 0 and a.data.ptr % 16 == 0 for a in (feats, dfeats))
    function = _kernels(views)[1]
    if batch * n:
        function(
            (batch * groups,),
            (BACKWARD_THREADS,),
            (
                points,
                packed,
                *_map_arguments(maps),
                feats,
                np.int64(_row_stride(feats)),
                dfeats,
                np.int64(_row_stride(dfeats)),
                np.int64(n),
                np.int32(groups),
                np.int32(n // groups),
                *dmaps,
                dpoints,
                np.int32(aligned),
            ),
        )
    return dpoints, dmaps
