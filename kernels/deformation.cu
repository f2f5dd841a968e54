// The deformation blocks' kernels off the Hopper path (xmesh/backends/cupy_backend/deformation.py): the
// local graph convolution's epilogues, the narrow last layer and the score kernels that move the vertices.
#include "stage_common.cuh"
// cuda_fp16.h (a CUDA header NVRTC finds through CuPy's include folders) only for the kernels that take
// __half; a build without them needs no CUDA headers.
#if !defined(XM_NO_FP16) && (!defined(XM_SELECT) || defined(XM_WANT_gconv_epilogue_f16) || \
                             defined(XM_WANT_gconv_epilogue_f16_f32))
#define XM_FP16_KERNELS 1
#include <cuda_fp16.h>
#endif
#include "bits16.cuh"

// Local graph convolution epilogue: out = relu((y0 + mixed) + bias) (+ residual), rows of width cout.
template <typename TI, typename TO>
__device__ __forceinline__ void xm_gconv_epilogue(const TI* __restrict__ y0, const TI* __restrict__ mixed,
                                                  const float* __restrict__ bias, const TI* __restrict__ res,
                                                  TO* __restrict__ out, long long total, int cout, int relu) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        float v = __fadd_rn(__fadd_rn((float)y0[i], (float)mixed[i]), bias[i % cout]);
        if (relu) v = fmaxf(v, 0.0f);
        if (res != nullptr) v = __fadd_rn(v, (float)res[i]);
        out[i] = (TO)v;
    }
}

XM_KERNEL(gconv_epilogue_f32) void gconv_epilogue_f32(const float* y0, const float* mixed, const float* bias,
                                              const float* res, float* out, long long total, int cout, int relu) {
    xm_gconv_epilogue<float, float>(y0, mixed, bias, res, out, total, cout, relu);
}

#ifdef XM_FP16_KERNELS
XM_KERNEL(gconv_epilogue_f16) void gconv_epilogue_f16(const __half* y0, const __half* mixed, const float* bias,
                                              const __half* res, __half* out, long long total, int cout, int relu) {
    xm_gconv_epilogue<__half, __half>(y0, mixed, bias, res, out, total, cout, relu);
}

XM_KERNEL(gconv_epilogue_f16_f32) void gconv_epilogue_f16_f32(const __half* y0, const __half* mixed, const float* bias,
                                                  const __half* res, float* out, long long total, int cout, int relu) {
    xm_gconv_epilogue<__half, float>(y0, mixed, bias, res, out, total, cout, relu);
}

#endif  // XM_FP16_KERNELS

// Local graph convolution of a deformation reasoning block after the one GEMM y = x [W0 | W1]
// (hypothesis-major rows (b, k, n), width 2*cout: y0 = columns [0, cout), y1 = [cout, 2*cout)):
// out[b,k,n,c] = relu((y0[b,k,n,c] + sum_j A1[k,j] y1[b,j,n,c]) + bias[c]) (+ res[b,k,n,c]).
// The 43 x 43 mixing and the epilogue in one pass: each thread owns one (b, n, c) column, holds its
// 43 y1 values in registers and writes the 43 outputs; A1 sits in shared memory (warp-wide broadcast).
XM_KERNEL(drb_mix_epilogue) void drb_mix_epilogue(const float* __restrict__ y, const float* __restrict__ a1,
                                            const float* __restrict__ bias, const float* __restrict__ res,
                                            float* __restrict__ out, int B, int N, int cout) {
    __shared__ float a[XM_HYP * XM_HYP];
    for (int i = threadIdx.x; i < XM_HYP * XM_HYP; i += blockDim.x) a[i] = a1[i];
    __syncthreads();
    const long long columns = (long long)B * N * cout;
    const long long ldy = 2LL * cout;
    const long long plane = (long long)N * cout;     // one hypothesis of one sample, in out
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < columns;
         idx += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(idx % cout);
        const long long bn = idx / cout;
        const int n = (int)(bn % N);
        const long long b = bn / N;
        const long long row0 = b * XM_HYP * N + n;   // row of (b, k = 0, n); hypothesis k adds k * N
        float y1[XM_HYP];
#pragma unroll
        for (int j = 0; j < XM_HYP; ++j) y1[j] = y[(row0 + (long long)j * N) * ldy + cout + c];
        const float bc = bias[c];
        const long long o0 = b * XM_HYP * plane + (long long)n * cout + c;
#pragma unroll 1
        for (int k = 0; k < XM_HYP; ++k) {
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < XM_HYP; ++j) acc = fmaf(a[k * XM_HYP + j], y1[j], acc);
            float v = __fadd_rn(__fadd_rn(y[(row0 + (long long)k * N) * ldy + c], acc), bc);
            v = fmaxf(v, 0.0f);
            const long long o = o0 + (long long)k * plane;
            if (res != nullptr) v = __fadd_rn(v, res[o]);
            out[o] = v;
        }
    }
}

// acc[c] (c < nw <= NC) += sum over k = 0 .. K-1, in order (fmaf), of row[k] * w[k * nw + c]: the row
// float32 (row_format XM_ROWS_F32) or a 16-bit mode's values (XM_ROWS_F16, XM_ROWS_BF16: bfloat16 bits), 16-byte aligned and read
// in 16-byte loads (values of the last load past K are skipped).
template <int NC>
__device__ __forceinline__ void xm_row_times(const void* row, int K, int row_format, const float* w, int nw, float* acc) {
    if (row_format == XM_ROWS_F32) {
        const float4* r4 = reinterpret_cast<const float4*>(row);
        for (int k4 = 0; k4 < K; k4 += 4) {
            const float4 q = r4[k4 / 4];
            const float vals[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int k = k4 + e;
                if (k >= K) break;
#pragma unroll
                for (int c = 0; c < NC; ++c)
                    if (c < nw) acc[c] = fmaf(vals[e], w[k * nw + c], acc[c]);
            }
        }
        return;
    }
    const uint4* r8 = reinterpret_cast<const uint4*>(row);
    for (int k8 = 0; k8 < K; k8 += 8) {
        const uint4 q = r8[k8 / 8];
        const unsigned pairs[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const int k = k8 + e;
            if (k >= K) break;
            const float v = xm_widen16((unsigned short)(pairs[e / 2] >> (16 * (e % 2))), row_format == XM_ROWS_BF16);
#pragma unroll
            for (int c = 0; c < NC; ++c)
                if (c < nw) acc[c] = fmaf(v, w[k * nw + c], acc[c]);
        }
    }
}

// y (M, NW) = X (M, K) W (K, NW) for a few columns (NW <= XM_SKINNY_COLS) and X in a 16-bit mode's
// activations (float16, or bfloat16 bits when bf16 != 0; rows ldx elements apart, 16-byte aligned,
// ldx % 8 == 0): the narrow last layer of a deformation block in the fp16 / bf16 modes, which reads
// the 16-bit output of the layer before it. One thread per row, float32 sums over k in order (fmaf),
// W (float32, rows of NW) in shared memory.
XM_KERNEL(skinny_gemm16) void skinny_gemm16(const unsigned short* __restrict__ x, long long ldx, const float* __restrict__ w,
                                         float* __restrict__ y, long long M, int K, int NW, int bf16) {
    __shared__ float ws[XM_SKINNY_K * XM_SKINNY_COLS];
    for (int i = threadIdx.x; i < K * NW; i += blockDim.x) ws[i] = w[i];
    __syncthreads();
    for (long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x; r < M; r += (long long)gridDim.x * blockDim.x) {
        float acc[XM_SKINNY_COLS];
#pragma unroll
        for (int c = 0; c < XM_SKINNY_COLS; ++c) acc[c] = 0.0f;
        xm_row_times<XM_SKINNY_COLS>(x + r * ldx, K, bf16 ? XM_ROWS_BF16 : XM_ROWS_F16, ws, NW, acc);
        for (int c = 0; c < NW; ++c) y[r * NW + c] = acc[c];
    }
}

// End of a deformation reasoning block for one vertex: w = softmax over the K hypotheses of its
// scores s[0], s[stride], ...; new = center + sum_k w_k offsets[k,:].
// out = center + sum_k weight(k) offsets[k,:], the K terms summed in order by fmaf.
template <class Weight>
__device__ __forceinline__ void xm_weighted_move(Weight weight, int K, const float* __restrict__ offsets,
                                                 const float* __restrict__ center, float* __restrict__ out) {
    float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        const float w = weight(k);
        d0 = fmaf(w, offsets[3 * k], d0);
        d1 = fmaf(w, offsets[3 * k + 1], d1);
        d2 = fmaf(w, offsets[3 * k + 2], d2);
    }
    out[0] = __fadd_rn(center[0], d0);
    out[1] = __fadd_rn(center[1], d1);
    out[2] = __fadd_rn(center[2], d2);
}

__device__ __forceinline__ void xm_softmax_move(const float* s, long long stride, int K, const float* __restrict__ offsets,
                                                const float* __restrict__ center, float* __restrict__ out) {
    float m = s[0];
    for (int k = 1; k < K; ++k) m = fmaxf(m, s[k * stride]);
    float total = 0.0f;
    for (int k = 0; k < K; ++k) total = __fadd_rn(total, expf(__fsub_rn(s[k * stride], m)));
    xm_weighted_move([&](int k) { return __fdiv_rn(expf(__fsub_rn(s[k * stride], m)), total); }, K, offsets, center, out);
}

// End of a deformation reasoning block: w = softmax over the K hypotheses of score[b,:,n];
// new[b,n,:] = centers[b,n,:] + sum_k w_k offsets[k,:]. One thread per (b, n).
XM_KERNEL(hypothesis_softmax_update) void hypothesis_softmax_update(const float* __restrict__ score, const float* __restrict__ offsets,
                                                     const float* __restrict__ centers, float* __restrict__ out,
                                                     int B, int K, int N) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)B * N) return;
    const int n = (int)(idx % N);
    const long long b = idx / N;
    xm_softmax_move(score + b * K * N + n, N, K, offsets, centers + 3 * idx, out + 3 * idx);
}

// A deformation reasoning block's narrow last layer (cin -> 1, the hypothesis scores) and its end in
// one pass, per vertex (b, n) and hypothesis k: y0 = X[b,k,n,:] W[:,0], y1 = X[b,k,n,:] W[:,1]
// (float32 fmaf sums over the input columns in order, as skinny_gemm16), the score
// s_k = relu((y0 + sum_j A1[k,j] y1_j) + bias) (drb_mix_epilogue's order), then the softmax over k
// and the moved vertex (xm_softmax_move). X: float32, float16 or bfloat16 bits (row_format: XM_ROWS_*),
// rows ldx elements apart, 16-byte aligned, cin and ldx whole 16-byte loads (cin <= XM_SKINNY_K). A block takes
// XM_SU_VERTS vertices, a thread per (vertex, hypothesis): the vertex's 43 rows are read once.

// Every thread of the block, once y1s[v][k] holds vertex v's y1 of hypothesis k (and this thread's y0):
// the score s_k = relu((y0 + sum_j A1[k,j] y1_j) + bias), then vertex v's softmax over k and its move,
// xm_softmax_move's arithmetic to the bit with its per-hypothesis parts spread over the vertex's threads:
// each thread takes the maximum (fmaxf: any order gives the same) and its own exp(s_k - m), each sums the
// 43 exps in xm_softmax_move's order and divides its own, and thread k = 0 sums the weighted offsets
// (only these in-order sums stay serial, not 43 exps and correctly rounded divisions).
// a: A1 (43 x 43) in shared memory; score: one float per (vertex, hypothesis), used three times over.
__device__ __forceinline__ void xm_score_move(float y0, int v, int k, bool active, long long g, const float* a,
                                              float (*y1s)[XM_HYP], float (*score)[XM_HYP],
                                              const float* __restrict__ bias, const float* __restrict__ offsets,
                                              const float* __restrict__ centers, float* __restrict__ out) {
    __syncthreads();
    float s = 0.0f;
    if (active) {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < XM_HYP; ++j) acc = fmaf(a[k * XM_HYP + j], y1s[v][j], acc);
        s = fmaxf(__fadd_rn(__fadd_rn(y0, acc), bias[0]), 0.0f);
        score[v][k] = s;
    }
    __syncthreads();
    float e = 0.0f;
    if (active) {
        float m = score[v][0];
#pragma unroll
        for (int j = 1; j < XM_HYP; ++j) m = fmaxf(m, score[v][j]);
        e = expf(__fsub_rn(s, m));
    }
    __syncthreads();
    if (active) score[v][k] = e;
    __syncthreads();
    float w = 0.0f;
    if (active) {
        float total = 0.0f;
#pragma unroll
        for (int j = 0; j < XM_HYP; ++j) total = __fadd_rn(total, score[v][j]);
        w = __fdiv_rn(e, total);
    }
    __syncthreads();
    if (active) score[v][k] = w;
    __syncthreads();
    if (active && k == 0) xm_weighted_move([&](int j) { return score[v][j]; }, XM_HYP, offsets, centers + 3 * g, out + 3 * g);
}
XM_KERNEL(drb_score_update) void __launch_bounds__(XM_SU_THREADS) drb_score_update(
    const void* __restrict__ x, long long ldx, int cin, int row_format, const float* __restrict__ w,
    const float* __restrict__ a1, const float* __restrict__ bias, const float* __restrict__ offsets,
    const float* __restrict__ centers, float* __restrict__ out, int B, int N) {
    __shared__ float ws[XM_SKINNY_K * 2];
    __shared__ float a[XM_HYP * XM_HYP];
    __shared__ float y1s[XM_SU_VERTS][XM_HYP];
    __shared__ float score[XM_SU_VERTS][XM_HYP];
    for (int i = threadIdx.x; i < 2 * cin; i += blockDim.x) ws[i] = w[i];
    for (int i = threadIdx.x; i < XM_HYP * XM_HYP; i += blockDim.x) a[i] = a1[i];
    const int v = threadIdx.x / XM_HYP, k = threadIdx.x % XM_HYP;
    const long long g = (long long)blockIdx.x * XM_SU_VERTS + v;   // the vertex, b * N + n
    const bool active = v < XM_SU_VERTS && g < (long long)B * N;
    __syncthreads();
    float y0 = 0.0f;
    if (active) {
        const long long r = ((g / N) * XM_HYP + k) * N + g % N;    // row (b, k, n)
        const void* row = row_format == XM_ROWS_F32 ? (const void*)(static_cast<const float*>(x) + r * ldx)
                                   : (const void*)(static_cast<const unsigned short*>(x) + r * ldx);
        float acc[2] = {0.0f, 0.0f};
        xm_row_times<2>(row, cin, row_format, ws, 2, acc);
        y0 = acc[0];
        y1s[v][k] = acc[1];
    }
    xm_score_move(y0, v, k, active, g, a, y1s, score, bias, offsets, centers, out);
}

// The end of a deformation block after a kernel that computed x5 with the score layer's products in
// its epilogue (wgmma_drb16_chain.cu's chain, wgmma_drb32h.cu's last wide layer), which left each
// hypothesis row's two products (y0, y1) of x5 with the score layer's W in `parts` planes of rows
// (B, 43, N) float2, part_stride float2s apart (the sums over column groups of x5, added here in order):
// the scores, the softmax and the moved vertices as drb_score_update makes them from there. A block
// takes XM_SF_VERTS vertices, a thread per (hypothesis, vertex) with the vertex fastest, so that a
// hypothesis's rows of neighbouring vertices are read in one piece and A1 comes into shared memory
// once for XM_SF_VERTS vertices.
XM_KERNEL(drb_score_finish) void __launch_bounds__(XM_SF_THREADS) drb_score_finish(
    const float2* __restrict__ rows, int parts, long long part_stride, const float* __restrict__ a1,
    const float* __restrict__ bias, const float* __restrict__ offsets, const float* __restrict__ centers,
    float* __restrict__ out, int B, int N) {
    __shared__ float a[XM_HYP * XM_HYP];
    __shared__ float y1s[XM_SF_VERTS][XM_HYP];
    __shared__ float score[XM_SF_VERTS][XM_HYP];
    for (int i = threadIdx.x; i < XM_HYP * XM_HYP; i += blockDim.x) a[i] = a1[i];
    const int k = threadIdx.x / XM_SF_VERTS, v = threadIdx.x % XM_SF_VERTS;
    const long long g = (long long)blockIdx.x * XM_SF_VERTS + v;   // the vertex, b * N + n
    const bool active = k < XM_HYP && g < (long long)B * N;
    float y0 = 0.0f;
    if (active) {
        const long long r = ((g / N) * XM_HYP + k) * N + g % N;   // row (b, k, n)
        float2 y = rows[r];
        for (int p = 1; p < parts; ++p) {
            const float2 more = rows[p * part_stride + r];
            y.x += more.x;
            y.y += more.y;
        }
        y0 = y.x;
        y1s[v][k] = y.y;
    }
    xm_score_move(y0, v, k, active, g, a, y1s, score, bias, offsets, centers, out);
}
