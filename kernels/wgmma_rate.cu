// The tensor cores' rate for the 3xTF32 warpgroup MMAs the training's layer kernels issue (A in
// registers, B through a shared-memory descriptor), alone and with the work that feeds them
// (scripts/wgmma_rate.py). Each iteration is one K slice of 32: four k8 steps of three products
// (big x big, big x small, small x big), their sum added to a float32 accumulator after
// wgmma.wait_group 0, as wgmma_gemm.cu's kernels add each slice. A block is 1-3 warpgroups, one
// block a multiprocessor; B is a zeroed slice (the rate does not depend on the values).
//
// MODE 0: the same A fragments every slice (the unit's own rate). 1: each slice's 32 floats a thread
// split into fresh fragments. 2: those floats loaded from global memory first, two rows' 8 floats in
// 16-byte loads (wg_direct_load), the next slice's issued during this slice's products (the held
// layer kernel's wg_mainloop_direct). 3: the same, two slices ahead in two register sets. 4: those
// floats read from a shared-memory slice of 192 rows x 128 bytes (the 128-byte swizzle), the next
// slice's during this slice's products. 5: the same from a ring of three such slots that a producer
// warp fills, a slice a Tensor Memory Accelerator copy of real rows of A, each slot handed back once
// the MMA warps have read it.
#include "kernel_select.cuh"

#define WG_BK 32
#include "wgmma_common.cuh"

#define WGR_COLUMNS 192   // floats a row of the streamed A (MODE 2, 3): six K slices

struct WgrRows {   // the thread's two rows of a block's 192-row tile walking `rows` rows of A
    const float* x;
    long row, rows;
    int t;
    __device__ __forceinline__ void load(float (&dst)[2][8], int it) const {   // the layer kernels' loader
        WgDirectRows r;
#pragma unroll
        for (int h = 0; h < 2; ++h) r.row[h] = x + ((row + 8 * h + 192L * (it / 6)) % rows) * WGR_COLUMNS;
        wg_direct_load<true, true>(dst, r, (it % 6) * WG_BK + 8 * t, WGR_COLUMNS);
    }
};

// A slice's fragments split into TF32 parts, then its twelve wgmmas (four k8 steps of three products)
// into part, committed.
__device__ __forceinline__ void wgr_split(const float (&raw)[2][8], unsigned (&big)[4][4], unsigned (&small)[4][4]) {
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
        for (int e = 0; e < 4; ++e) wg_split<WG_3XTF32>(raw[e & 1][2 * s + (e >> 1)], big[s][e], small[s][e]);
}
template <int N>
__device__ __forceinline__ void wgr_products(float (&part)[N / 2], const unsigned (&big)[4][4],
                                             const unsigned (&small)[4][4], unsigned base) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        const unsigned long long b = wg_desc(base + 32 * s);
        wg_mma(part, big[s], b, s > 0);
        wg_mma(part, big[s], wg_desc(base + N * 128 + 32 * s), 1);
        wg_mma(part, small[s], b, 1);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N, int MODE>
__device__ __forceinline__ void wg_rate(int iters, const float* __restrict__ x, long rows, float* __restrict__ out) {
    extern __shared__ float4 wgr_shared[];
    const unsigned raw_base = wg_smem(wgr_shared), base = (raw_base + 1023u) & ~1023u;
    float* b = reinterpret_cast<float*>(reinterpret_cast<char*>(wgr_shared) + (base - raw_base));
    for (int i = threadIdx.x; i < 2 * N * WG_BK; i += blockDim.x) b[i] = 0.0f;   // big and small parts
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const WgrRows a_rows{x, rows > 0 ? ((long)blockIdx.x * 192 + (warp & 3) * 16 + (lane >> 2)) % rows : 0,
                               rows, lane & 3};
    float acc[N / 2], part[N / 2], raw[2][8], raw2[2][8];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[i] = part[i] = 0.0f;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 8; ++e) raw[h][e] = raw2[h][e] = 1.0f + 1e-3f * (threadIdx.x + e + h);
    if (MODE >= 2) a_rows.load(raw, 0);
    if (MODE == 3) a_rows.load(raw2, 1);
    unsigned a_big[4][4], a_small[4][4];
    wgr_split(raw, a_big, a_small);
    auto slice = [&](int it, float (&cur)[2][8]) {
        if (MODE >= 1) wgr_split(cur, a_big, a_small);
        wgr_products<N>(part, a_big, a_small, base);
        if (MODE >= 2) a_rows.load(cur, it + (MODE == 3 ? 2 : 1));
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 8; ++e)
                if (MODE == 1) cur[h][e] += 1e-7f;   // fresh values, so that the split is not hoisted
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        wg_end_slice(a_big, a_small, part, acc);
    };
#pragma unroll 1
    for (int it = 0; it < iters; it += 2) {
        slice(it, raw);
        slice(it + 1, MODE == 3 ? raw2 : raw);
    }
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) total += acc[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = total;
}

// This thread's two rows' floats 8t .. 8t + 7 of a slot of 128-byte rows in the 128-byte swizzle (row
// r's 16-byte chunk c at chunk c ^ (r % 8); r % 8 == g).
__device__ __forceinline__ void wgr_slot_load(float (&dst)[2][8], const unsigned char* slot, int r, int g, int t) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const unsigned char* row = slot + (r + 8 * h) * 128;
        const float4 lo = *reinterpret_cast<const float4*>(row + (((2 * t) ^ g) << 4));
        const float4 hi = *reinterpret_cast<const float4*>(row + (((2 * t + 1) ^ g) << 4));
        dst[h][0] = lo.x, dst[h][1] = lo.y, dst[h][2] = lo.z, dst[h][3] = lo.w;
        dst[h][4] = hi.x, dst[h][5] = hi.y, dst[h][6] = hi.z, dst[h][7] = hi.w;
    }
}

#define WGR_SLOT_BYTES (192 * 128)
#define WGR_SLOTS 3
#define WGR_FREE 1   // named barriers 1 .. 3: slot s read by the MMA warps (they arrive, the producer waits)

// MODE 4 (xmap unused) and 5: three MMA warpgroups read A's slices from shared memory; in MODE 5 warp
// 12 is the producer.
template <int MODE>
__device__ __forceinline__ void wg_rate_shared(int iters, const WgTensorMap& xmap, long rows, float* __restrict__ out) {
    constexpr int N = 64;
    constexpr int MMA_THREADS = 384;
    extern __shared__ float4 wgr_shared[];
    const unsigned raw_base = wg_smem(wgr_shared), base = (raw_base + 1023u) & ~1023u;
    unsigned char* base_ptr = reinterpret_cast<unsigned char*>(wgr_shared) + (base - raw_base);
    float* b = reinterpret_cast<float*>(base_ptr);
    const unsigned ring = base + 2 * N * 128, full = ring + WGR_SLOTS * WGR_SLOT_BYTES;
    const unsigned char* ring_ptr = base_ptr + 2 * N * 128;
    for (int i = threadIdx.x; i < 2 * N * WG_BK; i += blockDim.x) b[i] = 0.0f;   // big and small parts
    if (MODE == 4)
        for (int i = threadIdx.x; i < WGR_SLOT_BYTES / 4; i += blockDim.x)
            reinterpret_cast<float*>(base_ptr + 2 * N * 128)[i] = 1.0f + 1e-3f * (i % 97);
    if (threadIdx.x == 0) {
        for (int s = 0; s < WGR_SLOTS; ++s) wg_mbar_init(full + 8 * s, 1);
        wg_mbar_init_fence();
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long row_of_block = (long)blockIdx.x * 192;
    if (threadIdx.x >= MMA_THREADS) {   // the producer warp (MODE 5)
        for (int it = 0; it < iters; ++it) {
            const int s = it % WGR_SLOTS;
            if (it >= WGR_SLOTS) wg_bar_sync(WGR_FREE + s, MMA_THREADS + 32);
            if (lane == 0)
                wg_tensor_copy_3d(ring + s * WGR_SLOT_BYTES, xmap, (it % 6) * WG_BK,
                                  (int)((row_of_block + 192L * (it / 6)) % rows), 0, full + 8 * s, WGR_SLOT_BYTES);
            __syncwarp();
        }
        return;
    }
    const int g = lane >> 2, t = lane & 3;
    const int r = (warp >> 2) * 64 + (warp & 3) * 16 + g;
    auto fetch = [&](float (&dst)[2][8], int it) {
        const int s = MODE == 5 ? it % WGR_SLOTS : 0;
        if (MODE == 5) wg_mbar_wait(full + 8 * s, (it / WGR_SLOTS) & 1);
        wgr_slot_load(dst, ring_ptr + s * WGR_SLOT_BYTES, r, g, t);
        if (MODE == 5 && it + WGR_SLOTS < iters) wg_bar_arrive(WGR_FREE + s, MMA_THREADS + 32);
    };
    float acc[N / 2], part[N / 2], raw[2][8];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[i] = part[i] = 0.0f;
    fetch(raw, 0);
    unsigned a_big[4][4], a_small[4][4];
#pragma unroll 1
    for (int it = 0; it < iters; ++it) {
        wgr_split(raw, a_big, a_small);
        wgr_products<N>(part, a_big, a_small, base);
        if (it + 1 < iters) fetch(raw, it + 1);
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        wg_end_slice(a_big, a_small, part, acc);
    }
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) total += acc[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = total;
}

// Names: wg_rate_n<N>_<fixed | split | loaded | loaded2>; blocks of up to 3 warpgroups (N = 64) or 2.
// wg_rate_n64_shared (3 warpgroups) and wg_rate_n64_streamed (3 warpgroups and a producer warp) take a
// tensor map of A (192 floats x rows x 1, boxes of 32 x 192 x 1) in place of x.
#define WGR_KERNEL(NAME, N, MODE)                                                                      \
    XM_KERNEL(NAME) void __launch_bounds__(N == 64 ? 384 : 256, 1) NAME(int iters, const float* x, long rows, \
                                                                         float* out) {                  \
        wg_rate<N, MODE>(iters, x, rows, out);                                                           \
    }
WGR_KERNEL(wg_rate_n64_fixed, 64, 0)
WGR_KERNEL(wg_rate_n64_split, 64, 1)
WGR_KERNEL(wg_rate_n64_loaded, 64, 2)
WGR_KERNEL(wg_rate_n64_loaded2, 64, 3)
WGR_KERNEL(wg_rate_n96_fixed, 96, 0)
WGR_KERNEL(wg_rate_n96_split, 96, 1)
WGR_KERNEL(wg_rate_n96_loaded, 96, 2)
WGR_KERNEL(wg_rate_n128_fixed, 128, 0)
XM_KERNEL(wg_rate_n64_shared) void __launch_bounds__(384, 1) wg_rate_n64_shared(
    int iters, const __grid_constant__ WgTensorMap xmap, long rows, float* out) {
    wg_rate_shared<4>(iters, xmap, rows, out);
}
XM_KERNEL(wg_rate_n64_streamed) void __launch_bounds__(416, 1) wg_rate_n64_streamed(
    int iters, const __grid_constant__ WgTensorMap xmap, long rows, float* out) {
    wg_rate_shared<5>(iters, xmap, rows, out);
}
