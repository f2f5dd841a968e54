// The tensor cores' rate for the 3xTF32 warpgroup MMAs the training's layer kernels issue (A in
// registers, B through a shared-memory descriptor), alone and with the work that feeds them
// (scripts/wgmma_rate.py). Each iteration is one K slice of 32: four k8 steps of three products
// (big x big, big x small, small x big), their sum added to a float32 accumulator after
// wgmma.wait_group 0, as wgmma_gemm.cu's kernels add each slice. A block is 1-3 warpgroups, one
// block a multiprocessor; B is a zeroed slice (the rate does not depend on the values).
//
// MODE 0: the same A fragments every slice (the unit's own rate). 1: each slice's 32 floats a thread
// split into fresh fragments. 2: those floats loaded from global memory first, two rows' 8 floats in
// 16-byte loads, the next slice's issued during this slice's products (the held layer kernel's
// wg_mainloop_direct). 3: the same, two slices ahead in two register sets.
#include "kernel_select.cuh"

#define WG_BK 32
#include "wgmma_common.cuh"

#define WGR_COLUMNS 192   // floats a row of the streamed A (MODE 2, 3): six K slices

struct WgrRows {   // the thread's two rows of a block's 192-row tile walking `rows` rows of A
    const float* x;
    long row, rows;
    int t;
    __device__ __forceinline__ void load(float (&dst)[2][8], int it) const {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const long r = (row + 8 * h + 192L * (it / 6)) % rows;
            const float* p = x + r * WGR_COLUMNS + (it % 6) * WG_BK + 8 * t;
            const float4 lo = __ldg(reinterpret_cast<const float4*>(p)), hi = __ldg(reinterpret_cast<const float4*>(p + 4));
            dst[h][0] = lo.x, dst[h][1] = lo.y, dst[h][2] = lo.z, dst[h][3] = lo.w;
            dst[h][4] = hi.x, dst[h][5] = hi.y, dst[h][6] = hi.z, dst[h][7] = hi.w;
        }
    }
};

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
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
        for (int e = 0; e < 4; ++e) wg_split<WG_3XTF32>(raw[e & 1][2 * s + (e >> 1)], a_big[s][e], a_small[s][e]);
    auto slice = [&](int it, float (&cur)[2][8]) {
        if (MODE >= 1) {
#pragma unroll
            for (int s = 0; s < 4; ++s)
#pragma unroll
                for (int e = 0; e < 4; ++e) wg_split<WG_3XTF32>(cur[e & 1][2 * s + (e >> 1)], a_big[s][e], a_small[s][e]);
        }
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const unsigned long long big = wg_desc(base + 32 * s);
            wg_mma(part, a_big[s], big, s > 0);
            wg_mma(part, a_big[s], wg_desc(base + N * 128 + 32 * s), 1);
            wg_mma(part, a_small[s], big, 1);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
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

// Names: wg_rate_n<N>_<fixed | split | loaded | loaded2>; blocks of up to 3 warpgroups (N = 64) or 2.
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
