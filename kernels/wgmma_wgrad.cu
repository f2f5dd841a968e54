// The training's weights' gradients on Hopper (sm_90a): P = U^T V for U (K x MU) and V (K x NV), both
// rows of float32 over K (a deformation layer's dW = X^T [dZ | A1^T dZ] sums millions of hypothesis
// rows into a (cin x 384) matrix), as 3xTF32 warpgroup MMAs with float32's accuracy.
//
// wgmma takes TF32 operands only K-major, and both U and V lie K-outermost. U is the register
// operand: a block's U slice (32 rows of K x WGT_ROWS columns) is copied as it lies and each warp
// loads its fragments across the rows, splitting them in registers as wgmma_gemm.cu does (the next
// slice's while this slice's wgmmas run). V is the shared-memory operand: its raw slice (32 x BN) is
// copied beside U's, then the block transposes it into BN rows of 32 floats in wgmma's 128-byte
// swizzle, split into big and small TF32 parts, while the previous slice's wgmmas run. Each run of
// WGT_SUM_SLICES slices' products is summed in the tensor cores on its own and added with FADDs, as
// in the other TF32 kernels (two slices: a little faster than one and no less accurate). BN is 128,
// 96 or 64 (m64n<BN>k8): the host takes the one that pads V's columns least.
//
// K is split over the grid's y: block (tile, y) takes rows [y * k_chunk, (y + 1) * k_chunk) and writes
// its (MU x NV) part to P + y * split_stride (rows of NV floats); wg_wgrad_reduce sums the parts in
// order and writes the transpose, C = V^T U (NV x MU, row stride ldc). Rows of U and V must start
// 16-byte aligned (row strides multiples of 4 floats).
#include "kernel_select.cuh"

#define WG_BK 32
#include "wgmma_common.cuh"

#define WGT_ROWS 128                  // U columns a block: two warpgroups of 64
#define WGT_THREADS (2 * WGT_ROWS)
#define WGT_U_STRIDE (WGT_ROWS + 8)   // floats per K row of a U slice: conflict-free fragment loads
#ifndef WGT_SUM_SLICES
#define WGT_SUM_SLICES 2   // K slices whose products the tensor cores add up before the FADDs
#endif
// Bytes of one ring stage (the raw U and V slices) and of one transposed V slice (big, small), for
// BN columns of V a block.
__host__ __device__ constexpr int wgt_stage_bytes(int bn) { return WG_BK * (WGT_U_STRIDE + bn) * 4; }
__host__ __device__ constexpr int wgt_split_bytes(int bn) { return 2 * bn * 128; }

// Copy rows [k0, k0 + 32) of the block's U and V columns into a ring stage; rows past k_len and
// columns past MU / NV read as zeros.
template <int BN>
__device__ __forceinline__ void wgt_load(unsigned stage, const float* __restrict__ U, long ldu, int MU,
                                         const float* __restrict__ V, long ldv, int NV, int m0, int n0,
                                         int k0, int k_len, int tid) {
#pragma unroll
    for (int i = 0; i < WG_BK * WGT_ROWS / 4 / WGT_THREADS; ++i) {   // U: 32 rows of 32 chunks
        const int idx = tid + i * WGT_THREADS, r = idx / (WGT_ROWS / 4), c = idx % (WGT_ROWS / 4);
        const int col = m0 + 4 * c, left = k0 + r < k_len ? MU - col : 0;
        const int n = left <= 0 ? 0 : (left >= 4 ? 4 : left);
        wg_copy(stage + (r * WGT_U_STRIDE + 4 * c) * 4, n > 0 ? U + (long)(k0 + r) * ldu + col : U, 16, 4 * n);
    }
    const unsigned vs = stage + WG_BK * WGT_U_STRIDE * 4;
#pragma unroll
    for (int i = 0; i < WG_BK * BN / 4 / WGT_THREADS; ++i) {   // V: 32 rows of BN / 4 chunks
        const int idx = tid + i * WGT_THREADS, r = idx / (BN / 4), c = idx % (BN / 4);
        const int col = n0 + 4 * c, left = k0 + r < k_len ? NV - col : 0;
        const int n = left <= 0 ? 0 : (left >= 4 ? 4 : left);
        wg_copy(vs + (r * BN + 4 * c) * 4, n > 0 ? V + (long)(k0 + r) * ldv + col : V, 16, 4 * n);
    }
}

// The raw V slice of a stage as BN K-major rows of 32 floats (128-byte swizzle: 16-byte chunk c of
// row r at chunk c ^ (r % 8)), big parts then small parts. Task (column n, chunk c) moves rows
// 4c .. 4c + 3 of column n: neighbouring threads read neighbouring columns, one 16-byte store a part.
template <int BN>
__device__ __forceinline__ void wgt_transpose_split(float* __restrict__ dst, const float* __restrict__ raw, int tid) {
    static_assert(BN * (WG_BK / 4) % WGT_THREADS == 0, "whole tasks a thread");
#pragma unroll
    for (int i = 0; i < BN * (WG_BK / 4) / WGT_THREADS; ++i) {
        const int task = tid + i * WGT_THREADS, n = task % BN, c = task / BN;
        float4 big, small;
        float* b = reinterpret_cast<float*>(&big);
        float* s = reinterpret_cast<float*>(&small);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            unsigned hi, lo;
            wg_split<WG_3XTF32>(raw[(4 * c + e) * BN + n], hi, lo);
            b[e] = __uint_as_float(hi);
            s[e] = __uint_as_float(lo);
        }
        const int chunk = c ^ (n & 7);
        *reinterpret_cast<float4*>(dst + n * 32 + chunk * 4) = big;
        *reinterpret_cast<float4*>(dst + BN * 32 + n * 32 + chunk * 4) = small;
    }
}

// A warp's U fragments of one slice, split: rows g / g + 8 of its slab are U's columns (us points at
// column row0 + g of the slice's first K row), the slice's rows 8s + t / 8s + t + 4 its K.
__device__ __forceinline__ void wgt_fragments(const float* us, int t, unsigned (&big)[4][4], unsigned (&small)[4][4]) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        wg_split<WG_3XTF32>(us[(8 * s + t) * WGT_U_STRIDE], big[s][0], small[s][0]);
        wg_split<WG_3XTF32>(us[(8 * s + t) * WGT_U_STRIDE + 8], big[s][1], small[s][1]);
        wg_split<WG_3XTF32>(us[(8 * s + t + 4) * WGT_U_STRIDE], big[s][2], small[s][2]);
        wg_split<WG_3XTF32>(us[(8 * s + t + 4) * WGT_U_STRIDE + 8], big[s][3], small[s][3]);
    }
}

template <int BN, int STAGES>
__device__ __forceinline__ void wg_wgrad(const float* __restrict__ U, long ldu, const float* __restrict__ V,
                                         long ldv, float* __restrict__ P, int MU, int NV, int K, int k_chunk,
                                         long split_stride) {
    extern __shared__ float4 wg_shared[];
    const unsigned raw_base = wg_smem(wg_shared);
    const unsigned base = (raw_base + 1023u) & ~1023u;   // the swizzle repeats every 1024 bytes
    float* base_ptr = reinterpret_cast<float*>(reinterpret_cast<char*>(wg_shared) + (base - raw_base));
    const unsigned split = base;                          // two transposed V slices
    float* split_ptr = base_ptr;
    constexpr int STAGE = wgt_stage_bytes(BN), SPLIT = wgt_split_bytes(BN);
    const unsigned ring = base + 2 * SPLIT;
    const float* ring_ptr = base_ptr + 2 * SPLIT / 4;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int row0 = (warp >> 2) * 64 + (warp & 3) * 16;
    const int tiles_n = (NV + BN - 1) / BN;
    const int m0 = (int)(blockIdx.x / tiles_n) * WGT_ROWS, n0 = (int)(blockIdx.x % tiles_n) * BN;
    const int k_begin = (int)blockIdx.y * k_chunk, k_len = min(K - k_begin, k_chunk);
    U += (long)k_begin * ldu;
    V += (long)k_begin * ldv;
    const int ktiles = (k_len + WG_BK - 1) / WG_BK;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ktiles) wgt_load<BN>(ring + s * STAGE, U, ldu, MU, V, ldv, NV, m0, n0, s * WG_BK, k_len, tid);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
    __syncthreads();
    wgt_transpose_split<BN>(split_ptr, ring_ptr + WG_BK * WGT_U_STRIDE, tid);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // the stores visible to wgmma
    __syncthreads();

    float acc[BN / 2], part[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = part[i] = 0.0f;
    // Two register sets of U fragments: one slice's feed its wgmmas while the next slice's are loaded.
    unsigned big0[4][4], small0[4][4], big1[4][4], small1[4][4];
    wgt_fragments(ring_ptr + row0 + g, t, big0, small0);

    // One slice: its wgmmas on the transposed V, added in the tensor cores to the products of the
    // slices before it in its run of WGT_SUM_SLICES; while they run, the copies of slice
    // kt + STAGES - 1 (into slice kt - 1's stage, which every thread left before the barrier that ended
    // the last step), and once slice kt - 1's wgmmas are done, slice kt + 1's transposition (into the
    // buffer they read) and its U fragments (into the registers they read). At a run's end the run's
    // sum is added to the thread's.
    auto step = [&](int kt, unsigned (&big)[4][4], unsigned (&small)[4][4], unsigned (&next_big)[4][4],
                    unsigned (&next_small)[4][4]) {
        const unsigned vt = split + (kt % 2) * SPLIT;
        const int carried = kt % WGT_SUM_SLICES != 0;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const unsigned long long desc = wg_desc(vt + 32 * s);
            wg_mma(part, big[s], desc, s > 0 || carried);
            wg_mma(part, big[s], wg_desc(vt + BN * 128 + 32 * s), 1);
            wg_mma(part, small[s], desc, 1);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        const int next = kt + STAGES - 1;
        if (next < ktiles)
            wgt_load<BN>(ring + (next % STAGES) * STAGE, U, ldu, MU, V, ldv, NV, m0, n0, next * WG_BK, k_len, tid);
        asm volatile("cp.async.commit_group;\n" ::);
        if (kt + 1 < ktiles) {
            asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
            if (WGT_SUM_SLICES > 1) {   // slice kt - 1's wgmmas may still run: wait for them
                asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                wg_pin_fragments(next_big, next_small);
            }
            __syncthreads();   // every thread's copies of slice kt + 1 are in, slice kt - 1's wgmmas done
            const float* stage = ring_ptr + ((kt + 1) % STAGES) * STAGE / 4;
            wgt_transpose_split<BN>(split_ptr + ((kt + 1) % 2) * SPLIT / 4, stage + WG_BK * WGT_U_STRIDE, tid);
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            wgt_fragments(stage + row0 + g, t, next_big, next_small);
        }
        if (kt % WGT_SUM_SLICES == WGT_SUM_SLICES - 1 || kt + 1 == ktiles) {
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            wg_end_slice(big, small, part, acc);
        }
        __syncthreads();   // slice kt + 1 is transposed; slice kt's stage is free
    };
    for (int kt = 0; kt < ktiles; kt += 2) {
        step(kt, big0, small0, big1, small1);
        if (kt + 1 < ktiles) step(kt + 1, big1, small1, big0, small0);
    }
    asm volatile("cp.async.wait_all;\n" ::);

    // acc[4j + 2h + e]: U column m0 + row0 + g + 8h, V column n0 + 8j + 2t + e.
    P += blockIdx.y * split_stride;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const int col = n0 + 8 * j + 2 * t;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = m0 + row0 + g + 8 * h;
            if (row >= MU) continue;
            float* out = P + (long)row * NV + col;
            if (col < NV) out[0] = acc[4 * j + 2 * h];
            if (col + 1 < NV) out[1] = acc[4 * j + 2 * h + 1];
        }
    }
}

#define WGT_KERNEL(NAME, BN, STAGES)                                                                      \
    XM_KERNEL(NAME) void __launch_bounds__(WGT_THREADS, 1) NAME(                                          \
        const float* U, long ldu, const float* V, long ldv, float* P, int MU, int NV, int K, int k_chunk,  \
        long split_stride) {                                                                              \
        wg_wgrad<BN, STAGES>(U, ldu, V, ldv, P, MU, NV, K, k_chunk, split_stride);                        \
    }

// Names: wg_wgrad_n<BN>, a ring of WGT_STAGES stages: dynamic shared memory
// WGT_STAGES * wgt_stage_bytes(BN) + 2 * wgt_split_bytes(BN) + 1024.
#define WGT_STAGES 4
WGT_KERNEL(wg_wgrad_n128, 128, WGT_STAGES)
WGT_KERNEL(wg_wgrad_n96, 96, WGT_STAGES)
WGT_KERNEL(wg_wgrad_n64, 64, WGT_STAGES)

// C (NV x MU, row stride ldc) = the sum over the splits of P's (MU x NV) parts, transposed, in order.
XM_KERNEL(wg_wgrad_reduce) void wg_wgrad_reduce(const float* __restrict__ P, int splits, long split_stride, int MU,
                                                int NV, float* __restrict__ C, long ldc) {
    const long long total = (long long)MU * NV;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int row = (int)(i / MU), col = (int)(i % MU);   // C's
        const long at = (long)col * NV + row;
        float v = P[at];
        for (int s = 1; s < splits; ++s) v += P[s * split_stride + at];
        C[(long)row * ldc + col] = v;
    }
}
