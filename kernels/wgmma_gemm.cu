// Hopper tensor-core GEMM (sm_90a only: wgmma): C = act(A B + bias), float32 in and out.
//
// The same products as tc_gemm.cu (3xTF32 for the "fp32" mode, one TF32 pass for "tf32"), issued
// as warpgroup MMAs (wgmma.mma_async m64n128k8), which run at about twice the rate mma.sync reaches
// on an H100/H200. Built with NVRTC for sm_90a by xmesh/backends/hopper_gemm.py; other GPUs use
// tc_gemm.cu.
//
// Operands:
//   A (M x K, row stride lda), row-major float32, read as it is. Each warp loads its fragments from
//     shared memory into registers and splits them there (big = tf32(a), small = a - big).
//   B is given prepared by wg_split_weight: transposed to (Np x Kp) "K-major" rows, already split
//     into big and small TF32 parts, zero-padded to whole 128 x 32 tiles. The weights of a layer are
//     prepared once; wgmma reads them straight from shared memory through matrix descriptors.
//   C (M x N, row stride ldc), row-major float32.
//
// Tiling: a block of 256 threads = 2 warpgroups computes a 128 x 128 tile of C (64 rows each),
// stepping through K in slices of 32 that cp.async streams into a WG_STAGES-deep ring. A slice of B
// is stored as 128 rows of 128 bytes in the 128-byte swizzle wgmma expects: 16-byte chunk c of row
// r sits at chunk c ^ (r % 8). The tensor cores add into their float32 accumulator with truncation,
// so each slice is summed on its own (the first wgmma of a slice starts from zero) and added to the
// block's accumulator with rounded FADDs, as in tc_gemm.cu.

#define WG_BM 128
#define WG_BN 128
#define WG_BK 32
#ifndef WG_STAGES
#define WG_STAGES 4
#endif
#define WG_THREADS 256
#define WG_A_STRIDE 36                        // floats per A row in shared memory: conflict-free fragment loads
#define WG_B_TILE (WG_BN * WG_BK * 4)         // bytes of one B part's slice (16 KB, a multiple of 1024)
#define WG_A_TILE (WG_BM * WG_A_STRIDE * 4)   // bytes of one A slice (18 KB)
#define WG_STAGE_BYTES(P) (((P) == 3 ? 2 : 1) * WG_B_TILE + WG_A_TILE)
// Dynamic shared memory a launch needs: the ring plus slack to align it to 1024 bytes.
#define WG_SMEM_BYTES(P) (WG_STAGES * WG_STAGE_BYTES(P) + 1024)

__device__ __forceinline__ unsigned wg_smem(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void wg_copy(unsigned dst, const float* src, int bytes, int src_bytes) {
    if (bytes == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// big = x rounded to TF32 (two integer instructions), small = x - big (exact in float32).
template <int PASSES>
__device__ __forceinline__ void wg_split(float x, unsigned& big, unsigned& small) {
    big = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    if (PASSES == 3) small = __float_as_uint(x - __uint_as_float(big));
}

// Matrix descriptor of a K-major B slice in shared memory with the 128-byte swizzle: start address,
// leading byte offset (unused for this layout: 1), stride byte offset 1024 (between 8-row groups).
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3ffffu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

#define WG_F8(i)                                                                                       \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),       \
        "+f"(d[i + 6]), "+f"(d[i + 7])

// d (64 x 128 over the warpgroup) = A (64 x 8, registers) B (8 x 128, descriptor) + (accumulate ? d : 0)
__device__ __forceinline__ void wg_mma(float (&d)[64], const unsigned (&a)[4], unsigned long long desc,
                                       int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %68, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
        "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "
        "%59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %69, p, 1, 1;\n}\n"
        : WG_F8(0), WG_F8(8), WG_F8(16), WG_F8(24), WG_F8(32), WG_F8(40), WG_F8(48), WG_F8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(accumulate), "l"(desc));
}

// Keep a register's value (and its liveness) pinned at this point: wgmma reads its register
// operands and writes its accumulators asynchronously, until wgmma.wait_group.
__device__ __forceinline__ void wg_pin(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void wg_pin(unsigned& x) { asm volatile("" : "+r"(x)::"memory"); }

// Copy the K slice [k0, k0 + 32) of the block's 128 A rows, and of the prepared B parts, into one stage.
template <int PASSES, bool VEC>
__device__ __forceinline__ void wg_load_stage(unsigned stage, const float* __restrict__ A, long lda,
                                              const float* __restrict__ Bbig, const float* __restrict__ Bsmall,
                                              long ldbt, int M, int K, int m0, int n0, int k0, int tid) {
#pragma unroll
    for (int i = 0; i < (WG_BN * WG_BK / 4) / WG_THREADS; ++i) {   // 16-byte chunks of B
        const int idx = tid + i * WG_THREADS, r = idx >> 3, c = idx & 7;
        const unsigned dst = stage + r * 128 + ((c ^ (r & 7)) << 4);
        const long off = (long)(n0 + r) * ldbt + k0 + 4 * c;
        wg_copy(dst, Bbig + off, 16, 16);
        if (PASSES == 3) wg_copy(dst + WG_B_TILE, Bsmall + off, 16, 16);
    }
    const unsigned as = stage + (PASSES == 3 ? 2 : 1) * WG_B_TILE;
    constexpr int W = VEC ? 4 : 1;   // floats per copy
#pragma unroll
    for (int i = 0; i < (WG_BM * WG_BK / W) / WG_THREADS; ++i) {
        const int idx = tid + i * WG_THREADS;
        const int r = idx / (WG_BK / W), col = (idx % (WG_BK / W)) * W;
        const int left = r < M - m0 ? K - (k0 + col) : 0;   // valid floats from here on
        const int n = left <= 0 ? 0 : (left >= W ? W : left);
        const float* src = n > 0 ? A + (long)(m0 + r) * lda + k0 + col : A;
        wg_copy(as + (r * WG_A_STRIDE + col) * 4, src, 4 * W, 4 * n);
    }
}

template <int PASSES, bool VEC>
__device__ __forceinline__ void wg_gemm(const float* __restrict__ A, long lda, const float* __restrict__ Bbig,
                                        const float* __restrict__ Bsmall, long ldbt, float* __restrict__ C,
                                        long ldc, int M, int N, int K, const float* __restrict__ bias, int relu) {
    extern __shared__ float4 wg_shared[];
    const unsigned raw = wg_smem(wg_shared);
    const unsigned ring = (raw + 1023u) & ~1023u;   // the 128-byte swizzle repeats every 1024 bytes
    const float* ring_ptr = reinterpret_cast<const float*>(reinterpret_cast<const char*>(wg_shared) + (ring - raw));
    constexpr int STAGE = WG_STAGE_BYTES(PASSES);
    constexpr int A_OFFSET = (PASSES == 3 ? 2 : 1) * WG_B_TILE;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = (warp >> 2) * 64 + (warp & 3) * 16;   // this warp's first row in the tile
    const int tiles_n = (N + WG_BN - 1) / WG_BN;
    const int m0 = (int)(blockIdx.x / tiles_n) * WG_BM, n0 = (int)(blockIdx.x % tiles_n) * WG_BN;
    const int ktiles = (K + WG_BK - 1) / WG_BK;

#pragma unroll
    for (int s = 0; s < WG_STAGES - 1; ++s) {
        if (s < ktiles)
            wg_load_stage<PASSES, VEC>(ring + s * STAGE, A, lda, Bbig, Bsmall, ldbt, M, K, m0, n0, s * WG_BK, tid);
        asm volatile("cp.async.commit_group;\n" ::);
    }

    float acc[64], part[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = part[i] = 0.0f;

    for (int kt = 0; kt < ktiles; ++kt) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(WG_STAGES - 2));
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // copies visible to wgmma
        __syncthreads();   // slice kt is in; every warpgroup is done with slice kt - 1's stage
        const int next = kt + WG_STAGES - 1;
        if (next < ktiles)
            wg_load_stage<PASSES, VEC>(ring + (next % WG_STAGES) * STAGE, A, lda, Bbig, Bsmall, ldbt, M, K, m0, n0,
                                       next * WG_BK, tid);
        asm volatile("cp.async.commit_group;\n" ::);

        const unsigned stage = ring + (kt % WG_STAGES) * STAGE;
        const float* as = ring_ptr + ((kt % WG_STAGES) * STAGE + A_OFFSET) / 4 + (row0 + g) * WG_A_STRIDE + t;
        unsigned a_big[4][4], a_small[4][4];
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            wg_split<PASSES>(as[8 * s], a_big[s][0], a_small[s][0]);
            wg_split<PASSES>(as[8 * s + 8 * WG_A_STRIDE], a_big[s][1], a_small[s][1]);
            wg_split<PASSES>(as[8 * s + 4], a_big[s][2], a_small[s][2]);
            wg_split<PASSES>(as[8 * s + 8 * WG_A_STRIDE + 4], a_big[s][3], a_small[s][3]);
        }
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const unsigned long long big = wg_desc(stage + 32 * s);
            wg_mma(part, a_big[s], big, s > 0);
            if (PASSES == 3) {
                wg_mma(part, a_big[s], wg_desc(stage + WG_B_TILE + 32 * s), 1);
                wg_mma(part, a_small[s], big, 1);
            }
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < 4; ++s)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                wg_pin(a_big[s][e]);
                if (PASSES == 3) wg_pin(a_small[s][e]);
            }
#pragma unroll
        for (int i = 0; i < 64; ++i) {
            wg_pin(part[i]);
            acc[i] += part[i];
        }
    }
    asm volatile("cp.async.wait_all;\n" ::);

    // acc[4j + e]: row row0 + g (+8 for e >= 2), column 8j + 2t (+1 for odd e)
    const bool pairs = (ldc % 2 == 0) && ((reinterpret_cast<unsigned long long>(C) & 7) == 0);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const int col = n0 + 8 * j + 2 * t;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = m0 + row0 + g + 8 * h;
            if (row >= M) continue;
            float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
            if (bias != nullptr) {
                if (col < N) v0 += bias[col];
                if (col + 1 < N) v1 += bias[col + 1];
            }
            if (relu) {
                v0 = fmaxf(v0, 0.0f);
                v1 = fmaxf(v1, 0.0f);
            }
            float* out = C + (long)row * ldc + col;
            if (pairs && col + 1 < N) {
                *reinterpret_cast<float2*>(out) = make_float2(v0, v1);
            } else {
                if (col < N) out[0] = v0;
                if (col + 1 < N) out[1] = v1;
            }
        }
    }
}

#define WG_KERNEL(NAME, PASSES, VEC)                                                                      \
    extern "C" __global__ void __launch_bounds__(WG_THREADS) NAME(                                         \
        const float* A, long lda, const float* Bbig, const float* Bsmall, long ldbt, float* C, long ldc,  \
        int M, int N, int K, const float* bias, int relu) {                                              \
        wg_gemm<PASSES, VEC>(A, lda, Bbig, Bsmall, ldbt, C, ldc, M, N, K, bias, relu);                    \
    }

// Names: wg_gemm_<passes>x_<v: 16-byte copies of A (lda % 4 == 0, A 16-byte aligned) | s: single floats>
WG_KERNEL(wg_gemm_3x_v, 3, true)
WG_KERNEL(wg_gemm_3x_s, 3, false)
WG_KERNEL(wg_gemm_1x_v, 1, true)
WG_KERNEL(wg_gemm_1x_s, 1, false)

// Prepare B (K x N, row stride ldb) for the kernels above: big[n][k] = tf32(B[k][n]) and (passes 3)
// small[n][k] = B[k][n] - big[n][k], as (Np x Kp) rows with zeros past N and K.
extern "C" __global__ void wg_split_weight(const float* __restrict__ B, long ldb, int K, int N, int Kp, int Np,
                                           int passes, float* __restrict__ big, float* __restrict__ small) {
    const long long total = (long long)Np * Kp;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int n = (int)(i / Kp), k = (int)(i % Kp);
        const float x = (n < N && k < K) ? B[(long)k * ldb + n] : 0.0f;
        unsigned hi, lo;
        wg_split<3>(x, hi, lo);
        big[i] = __uint_as_float(hi);
        if (passes == 3) small[i] = __uint_as_float(lo);
    }
}
