// Tensor-core GEMM for the CuPy backend: C = act(A B + bias), float32 in and out.
//
// A (M x K, row stride lda), B (K x N, row stride ldb), C (M x N, row stride ldc), all row-major
// float32. The products run on the tensor cores with mma.sync m16n8k8 TF32 instructions:
//   PASSES = 3: "3xTF32": each operand x is split into big = tf32(x) and small = tf32(x - big);
//               a b ~ a_small b_big + a_big b_small + a_big b_big, accumulated in float32. The
//               dropped a_small b_small term is ~2^-22 of the product, so the result has float32
//               accuracy (this is the backend's "fp32" mode);
//   PASSES = 1: one TF32 product (the "tf32" mode; ~1e-3 relative error per product).
//
// Tiling: a block of 256 threads (8 warps) computes a 128 x BN tile of C, stepping through K in
// slices of XG_BK (16, or 32 for the few-tile 3xTF32 products: a second build)
// that cp.async streams into a 3-stage shared-memory ring. Rows of A and B that fall
// outside the matrix are zero-filled by the copy itself (src-size 0), so M, N and K are arbitrary.
// VEC = true copies 16 bytes at a time and needs lda, ldb, K and N to be multiples of 4 and A, B
// 16-byte aligned (the host checks); VEC = false copies single floats and takes anything.
//
// The block index runs over N tiles fastest, so the blocks that share a slice of A run together
// and read it from L2.
#include "kernel_select.cuh"

// The tile's constants: one Python definition each (xmesh/backends/kernel_constants.py, GEMM_DEFINES and
// the K slice), passed with -D by the backend.
#if !defined(XG_BM) || !defined(XG_BK) || !defined(XG_STAGES) || !defined(XG_THREADS)
#error "tc_gemm.cu is built with the backend's -D constants (xmesh/backends/kernel_constants.py)"
#endif
#define XG_A_STRIDE (XG_BK + 4)   // 20 or 36 floats: fragment loads hit 32 distinct banks

__device__ __forceinline__ unsigned xg_smem(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes into shared memory, of which the first src_bytes come from src and the rest are zeros.
__device__ __forceinline__ void xg_copy16(float* dst, const float* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(xg_smem(dst)), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void xg_copy4(float* dst, const float* src, bool full) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(xg_smem(dst)), "l"(src), "r"(full ? 4 : 0));
}

__device__ __forceinline__ void xg_commit() { asm volatile("cp.async.commit_group;\n" ::); }

__device__ __forceinline__ void xg_wait_stages() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(XG_STAGES - 2));
}

// big = x rounded to TF32 (10 mantissa bits, to nearest by adding half a unit of the 13 dropped
// bits); small = x - big, exact in float32, whose low bits the tensor core ignores (a truncation of
// ~2^-11 of small, i.e. ~2^-22 of x). Integer arithmetic instead of cvt.rna.tf32 keeps it to two
// instructions for big and one for small.
template <int PASSES>
__device__ __forceinline__ void xg_split(float x, unsigned& big, unsigned& small) {
    big = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    if (PASSES == 3) small = __float_as_uint(x - __uint_as_float(big));
}

__device__ __forceinline__ void xg_mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Copy a ROWS x COLS tile of a row-major matrix (src: its first element, ld: row stride) into shared
// memory (row stride STRIDE). Elements past rows_left / cols_left are zero-filled by the copy, also
// within a 16-byte copy (VEC): a row of A may end inside one (K not a multiple of 4, rows padded to 16
// bytes: what lies past K there is never read).
template <int ROWS, int COLS, int STRIDE, bool VEC>
__device__ __forceinline__ void xg_copy_tile(float* dst, const float* __restrict__ src, long ld, int rows_left,
                                             int cols_left, int tid) {
    constexpr int W = VEC ? 4 : 1;   // floats per copy
    constexpr int COPIES = ROWS * COLS / W;
#pragma unroll
    for (int i = 0; i < (COPIES + XG_THREADS - 1) / XG_THREADS; ++i) {
        const int idx = tid + i * XG_THREADS;
        if (COPIES % XG_THREADS != 0 && idx >= COPIES) break;   // narrow B tiles: fewer copies than threads
        const int row = idx / (COLS / W), col = (idx % (COLS / W)) * W;
        const int left = row < rows_left ? cols_left - col : 0;   // valid floats from col on
        const int n = left <= 0 ? 0 : (left >= W ? W : left);
        const float* from = n > 0 ? src + (long)row * ld + col : src;
        if (VEC)
            xg_copy16(dst + row * STRIDE + col, from, 4 * n);
        else
            xg_copy4(dst + row * STRIDE + col, from, n > 0);
    }
}

// Where the A operand's tiles come from. Each source copies the K slice [k0, k0 + XG_BK) of the
// block's 128 rows into shared memory (row stride XG_A_STRIDE).
//
// XgDenseA: a row-major matrix (row stride lda); with TRANSPOSED, A given as its transpose At (K x M,
// row stride lda): the weights' gradient X^T dY of a training pass, whose K runs over the rows of a
// row-major X. Its slices are then copied as they lie, K rows of M columns ([k][m], row stride
// XG_AT_STRIDE), and the fragments read across them.
#define XG_AT_STRIDE (XG_BM + 8)   // fragment loads (row t, column g) hit 32 distinct banks
template <bool VEC, bool T = false>
struct XgDenseA {
    static constexpr bool TRANSPOSED = T;
    const float* __restrict__ A;
    long lda;
    int M, K, m0;

    __device__ __forceinline__ void load(float* dst, int k0, int tid) const {
        if constexpr (T)
            xg_copy_tile<XG_BK, XG_BM, XG_AT_STRIDE, VEC>(dst, A + (long)k0 * lda + m0, lda, K - k0, M - m0, tid);
        else
            xg_copy_tile<XG_BM, XG_BK, XG_A_STRIDE, VEC>(dst, A + (long)m0 * lda + k0, lda, M - m0, K - k0, tid);
    }
};

// XgConvA: the im2col matrix of a 'SAME' convolution, read straight from the NHWC input x (implicit
// GEMM): row m = (image n, output pixel oy, ox), column k = (tap ky, kx, channel c) in the weight's
// (kh, kw, C) order. With C a multiple of XG_BK, a K slice lies within one tap, so each of a
// thread's rows is one 16-byte copy of C-contiguous input, zero-filled where the tap falls in the
// padding. k_begin offsets k (split K).
struct XgConvA {
    static constexpr bool TRANSPOSED = false;
    static constexpr int ROWS_PER_THREAD = (XG_BM * XG_BK / 4) / XG_THREADS;
    const float* __restrict__ x;
    int H, W, C, kw, k_begin;
    long base[ROWS_PER_THREAD];                  // offset of image n in x
    int iy0[ROWS_PER_THREAD], ix0[ROWS_PER_THREAD];   // input pixel of tap (0, 0); far outside for rows >= M

    __device__ __forceinline__ XgConvA(const float* x_, int H_, int W_, int C_, int kw_, int stride, int Ho,
                                       int Wo, int pad_top, int pad_left, int M, int m0, int k_begin_, int tid)
        : x(x_), H(H_), W(W_), C(C_), kw(kw_), k_begin(k_begin_) {
#pragma unroll
        for (int i = 0; i < ROWS_PER_THREAD; ++i) {
            const int row = m0 + (tid + i * XG_THREADS) / (XG_BK / 4);
            base[i] = 0;
            iy0[i] = ix0[i] = -(1 << 29);
            if (row < M) {
                const int n = row / (Ho * Wo), r = row - n * (Ho * Wo);
                const int oy = r / Wo, ox = r - oy * Wo;
                base[i] = (long)n * H * W * C;
                iy0[i] = oy * stride - pad_top;
                ix0[i] = ox * stride - pad_left;
            }
        }
    }

    __device__ __forceinline__ void load(float* dst, int k0, int tid) const {
        const int k = k_begin + k0;
        const int tap = k / C, c0 = k - tap * C;
        const int ky = tap / kw, kx = tap - ky * kw;
#pragma unroll
        for (int i = 0; i < ROWS_PER_THREAD; ++i) {
            const int idx = tid + i * XG_THREADS;
            const int row = idx / (XG_BK / 4), col = (idx % (XG_BK / 4)) * 4;
            const int iy = iy0[i] + ky, ix = ix0[i] + kx;
            const bool ok = (unsigned)iy < (unsigned)H && (unsigned)ix < (unsigned)W;
            const float* from = ok ? x + base[i] + ((long)iy * W + ix) * C + c0 + col : x;
            xg_copy16(dst + row * XG_A_STRIDE + col, from, ok ? 16 : 0);
        }
    }
};

// Copy the K slice [k0, k0 + XG_BK) of the block's A rows and B columns into one ring stage.
template <int BN, bool VEC, class ASrc>
__device__ __forceinline__ void xg_load_stage(float* As, float* Bs, const ASrc& a_src, const float* __restrict__ B,
                                              long ldb, int N, int K, int n0, int k0, int tid) {
    a_src.load(As, k0, tid);
    xg_copy_tile<XG_BK, BN, BN + 8, VEC>(Bs, B + (long)k0 * ldb + n0, ldb, K - k0, N - n0, tid);
}

template <int MT, int NT>
__device__ __forceinline__ void xg_zero(float (&x)[MT][NT][4]) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) x[i][j][e] = 0.0f;
}

template <int BN, int WARPS_M, int PASSES, bool VEC, class ASrc>
__device__ __forceinline__ void xg_gemm(const ASrc& a_src, const float* __restrict__ B, long ldb,
                                        float* __restrict__ C, long ldc, int M, int N, int K, int m0, int n0,
                                        const float* __restrict__ bias, int relu) {
    constexpr int WARPS_N = (XG_THREADS / 32) / WARPS_M;
    constexpr int WM = XG_BM / WARPS_M, WN = BN / WARPS_N;
    constexpr int MT = WM / 16, NT = WN / 8;
    constexpr int B_STRIDE = BN + 8;   // fragment loads hit 32 distinct banks
    constexpr int A_STAGE = XG_BM * XG_A_STRIDE, B_STAGE = XG_BK * B_STRIDE;   // >= XG_BK * XG_AT_STRIDE
    // A's element (row m, column k) of a stage: rows of XG_A_STRIDE, or [k][m] for a transposed source
    constexpr int AM = ASrc::TRANSPOSED ? 1 : XG_A_STRIDE, AK = ASrc::TRANSPOSED ? XG_AT_STRIDE : 1;
    extern __shared__ float4 xg_shared[];
    float* As = reinterpret_cast<float*>(xg_shared);
    float* Bs = As + XG_STAGES * A_STAGE;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = warp % WARPS_M, wn = warp / WARPS_M;
    const int ktiles = (K + XG_BK - 1) / XG_BK;

    float acc[MT][NT][4];
    xg_zero(acc);

#pragma unroll
    for (int s = 0; s < XG_STAGES - 1; ++s) {
        if (s < ktiles)
            xg_load_stage<BN, VEC>(As + s * A_STAGE, Bs + s * B_STAGE, a_src, B, ldb, N, K, n0, s * XG_BK, tid);
        xg_commit();
    }

    for (int kt = 0; kt < ktiles; ++kt) {
        xg_wait_stages();
        __syncthreads();   // slice kt is visible; every warp is done with slice kt - 1's stage
        int next = kt + XG_STAGES - 1;
        if (next < ktiles) {
            int s = next % XG_STAGES;
            xg_load_stage<BN, VEC>(As + s * A_STAGE, Bs + s * B_STAGE, a_src, B, ldb, N, K, n0, next * XG_BK, tid);
        }
        xg_commit();
        const float* as = As + (kt % XG_STAGES) * A_STAGE + (wm * WM) * AM;
        const float* bs = Bs + (kt % XG_STAGES) * B_STAGE + wn * WN;
        // The tensor cores add into their float32 accumulator with truncation, which biases a long
        // sum; each XG_BK-wide slice is summed on its own and added to acc with a rounded FADD.
        float part[MT][NT][4];
        xg_zero(part);
#pragma unroll
        for (int kk = 0; kk < XG_BK; kk += 8) {
            unsigned a_big[MT][4], a_small[MT][4], b_big[NT][2], b_small[NT][2];
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                const float* p = as + (i * 16 + g) * AM + (kk + t) * AK;
                xg_split<PASSES>(p[0], a_big[i][0], a_small[i][0]);
                xg_split<PASSES>(p[8 * AM], a_big[i][1], a_small[i][1]);
                xg_split<PASSES>(p[4 * AK], a_big[i][2], a_small[i][2]);
                xg_split<PASSES>(p[8 * AM + 4 * AK], a_big[i][3], a_small[i][3]);
            }
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const float* p = bs + (kk + t) * B_STRIDE + j * 8 + g;
                xg_split<PASSES>(p[0], b_big[j][0], b_small[j][0]);
                xg_split<PASSES>(p[4 * B_STRIDE], b_big[j][1], b_small[j][1]);
            }
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    if (PASSES == 3) {
                        xg_mma(part[i][j], a_small[i], b_big[j]);
                        xg_mma(part[i][j], a_big[i], b_small[j]);
                    }
                    xg_mma(part[i][j], a_big[i], b_big[j]);
                }
        }
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] += part[i][j][e];
    }
    asm volatile("cp.async.wait_all;\n" ::);

#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int row = m0 + wm * WM + i * 16 + g + (e >= 2 ? 8 : 0);
                int col = n0 + wn * WN + j * 8 + 2 * t + (e & 1);
                if (row < M && col < N) {
                    float v = acc[i][j][e];
                    if (bias != nullptr) v += bias[col];
                    if (relu) v = fmaxf(v, 0.0f);
                    C[(long)row * ldc + col] = v;
                }
            }
}

// Shared memory (bytes) a launch of a BN-wide variant needs.
#define XG_SMEM_BYTES(BN) (XG_STAGES * (XG_BM * XG_A_STRIDE + XG_BK * ((BN) + 8)) * 4)

// Split K: block row y of the grid takes K columns [y * k_chunk, (y + 1) * k_chunk) and writes its
// partial product to C + y * split_stride (gemm_splitk_reduce then sums the parts in order, so
// results do not depend on scheduling). Without a split: gridDim.y = 1, k_chunk >= K.
// The block index runs over N tiles fastest.
#define XG_TILE_ORIGIN(BN)                                                                              \
    const int tiles_n = (N + (BN) - 1) / (BN);                                                           \
    const int m0 = (int)(blockIdx.x / tiles_n) * XG_BM, n0 = (int)(blockIdx.x % tiles_n) * (BN);         \
    const int k_begin = (int)blockIdx.y * k_chunk, k_len = min(K - k_begin, k_chunk);

#define XG_KERNEL(NAME, BN, WARPS_M, PASSES, VEC)                                                         \
    XM_KERNEL(NAME) void __launch_bounds__(XG_THREADS) NAME(                                               \
        const float* A, long lda, const float* B, long ldb, float* C, long ldc, int M, int N, int K,     \
        const float* bias, int relu, int k_chunk, long split_stride) {                                   \
        XG_TILE_ORIGIN(BN)                                                                                \
        const XgDenseA<VEC> a_src{A + k_begin, lda, M, k_len, m0};                                        \
        xg_gemm<BN, WARPS_M, PASSES, VEC>(a_src, B + (long)k_begin * ldb, ldb, C + blockIdx.y * split_stride, \
                                          ldc, M, N, k_len, m0, n0, bias, relu);                          \
    }

// C = act(At^T B + bias) for At (K x M, row stride lda): the same tiles, split K and names with "t".
#define XG_KERNEL_T(NAME, BN, WARPS_M, PASSES, VEC)                                                       \
    XM_KERNEL(NAME) void __launch_bounds__(XG_THREADS) NAME(                                               \
        const float* At, long lda, const float* B, long ldb, float* C, long ldc, int M, int N, int K,    \
        const float* bias, int relu, int k_chunk, long split_stride) {                                   \
        XG_TILE_ORIGIN(BN)                                                                                \
        const XgDenseA<VEC, true> a_src{At + (long)k_begin * lda, lda, M, k_len, m0};                     \
        xg_gemm<BN, WARPS_M, PASSES, VEC>(a_src, B + (long)k_begin * ldb, ldb, C + blockIdx.y * split_stride, \
                                          ldc, M, N, k_len, m0, n0, bias, relu);                          \
    }

// Implicit-GEMM 'SAME' convolution: out (M = images * Ho * Wo rows, N = Cout) = act(im2col(x) W + bias)
// with W the (kh * kw * C, Cout) weight; C must be a multiple of XG_BK, W's rows 16-byte aligned.
#define XG_CONV_KERNEL(NAME, BN, WARPS_M, PASSES)                                                         \
    XM_KERNEL(NAME) void __launch_bounds__(XG_THREADS) NAME(                                               \
        const float* x, int H, int W, int C, int kw, int stride, int Ho, int Wo, int pad_top, int pad_left,  \
        const float* B, long ldb, float* out, long ldc, int M, int N, int K, const float* bias, int relu,    \
        int k_chunk, long split_stride) {                                                                 \
        XG_TILE_ORIGIN(BN)                                                                                \
        const XgConvA a_src(x, H, W, C, kw, stride, Ho, Wo, pad_top, pad_left, M, m0, k_begin,              \
                            (int)threadIdx.x);                                                            \
        xg_gemm<BN, WARPS_M, PASSES, true>(a_src, B + (long)k_begin * ldb, ldb, out + blockIdx.y * split_stride, \
                                           ldc, M, N, k_len, m0, n0, bias, relu);                         \
    }

XM_KERNEL(gemm_splitk_reduce) void gemm_splitk_reduce(const float* __restrict__ parts, int splits, long split_stride,
                                              int M, int N, float* __restrict__ C, long ldc,
                                              const float* __restrict__ bias, int relu) {
    const long long total = (long long)M * N;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        float v = parts[i];
        for (int s = 1; s < splits; ++s) v += parts[s * split_stride + i];
        const int col = (int)(i % N);
        if (bias != nullptr) v += bias[col];
        if (relu) v = fmaxf(v, 0.0f);
        C[(i / N) * ldc + col] = v;
    }
}

// Names: gemm_<passes>x_n<BN>_<v: 16-byte copies | s: single floats>, conv_<passes>x_n<BN>; gemm_t3x_n128_*
// take A transposed (the training's weight gradients, 3xTF32, N a multiple of 128)
XG_KERNEL(gemm_3x_n128_v, 128, 2, 3, true)
XG_KERNEL(gemm_3x_n128_s, 128, 2, 3, false)
XG_KERNEL(gemm_3x_n64_v, 64, 4, 3, true)
XG_KERNEL(gemm_3x_n64_s, 64, 4, 3, false)
XG_KERNEL(gemm_3x_n32_v, 32, 8, 3, true)
XG_KERNEL(gemm_3x_n32_s, 32, 8, 3, false)
XG_KERNEL(gemm_3x_n16_v, 16, 8, 3, true)
XG_KERNEL(gemm_3x_n16_s, 16, 8, 3, false)
XG_CONV_KERNEL(conv_3x_n128, 128, 2, 3)
XG_CONV_KERNEL(conv_3x_n64, 64, 4, 3)
XG_CONV_KERNEL(conv_3x_n32, 32, 8, 3)
XG_CONV_KERNEL(conv_3x_n16, 16, 8, 3)
XG_KERNEL_T(gemm_t3x_n128_v, 128, 2, 3, true)
XG_KERNEL_T(gemm_t3x_n128_s, 128, 2, 3, false)
XG_KERNEL(gemm_1x_n128_v, 128, 2, 1, true)
XG_KERNEL(gemm_1x_n128_s, 128, 2, 1, false)
XG_KERNEL(gemm_1x_n64_v, 64, 4, 1, true)
XG_KERNEL(gemm_1x_n64_s, 64, 4, 1, false)
XG_KERNEL(gemm_1x_n32_v, 32, 8, 1, true)
XG_KERNEL(gemm_1x_n32_s, 32, 8, 1, false)
XG_KERNEL(gemm_1x_n16_v, 16, 8, 1, true)
XG_KERNEL(gemm_1x_n16_s, 16, 8, 1, false)
XG_CONV_KERNEL(conv_1x_n128, 128, 2, 1)
XG_CONV_KERNEL(conv_1x_n64, 64, 4, 1)
XG_CONV_KERNEL(conv_1x_n32, 32, 8, 1)
XG_CONV_KERNEL(conv_1x_n16, 16, 8, 1)
