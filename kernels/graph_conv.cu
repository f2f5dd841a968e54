// Stage 1's graph convolution after its GEMM and the unpooling (xmesh/backends/cupy_backend/graph_conv.py).
#include "stage_common.cuh"

// Stage-1 unpooling in one pass: out (B, N + E, C) = x (B, N, C) followed by the midpoints
// (x[u] + x[v]) * 0.5 of the E edges (u, v) (int64 pairs), the array-API code's arithmetic. One
// block per output row, its threads over the channels.
XM_KERNEL(unpool_midpoints) void unpool_midpoints(const float* __restrict__ x, const long long* __restrict__ edges,
                                            float* __restrict__ out, int N, int E, int C) {
    const long long row = blockIdx.x;               // b * (N + E) + i
    const int i = (int)(row % (N + E));
    const long long b = row / (N + E);
    const float* xb = x + b * N * (long long)C;
    float* o = out + row * C;
    if (i < N) {
        const float* src = xb + (long long)i * C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = src[c];
    } else {
        const float* pu = xb + edges[2 * (i - N)] * C;
        const float* pv = xb + edges[2 * (i - N) + 1] * C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = __fmul_rn(__fadd_rn(pu[c], pv[c]), 0.5f);
    }
}

// Stage-1 graph convolution with support 0 the identity, after y = x [W0 | W1] (rows of width ldy):
// out[b,i,c] = act((y[b,i,c] + sum_k S1[i,k] y[b,k,off1+c]) + bias[c]), S1 in CSR (int32 indices);
// with res, then the original's residual step out = (out + res[b,i,c]) * 0.5.
XM_KERNEL(csr_gconv) void csr_gconv(const int* __restrict__ indptr, const int* __restrict__ indices,
                                     const float* __restrict__ data, const float* __restrict__ y,
                                     int ldy, int off1, const float* __restrict__ bias,
                                     const float* __restrict__ res, float* __restrict__ out,
                                     int B, int N, int cout, int relu) {
    const long long total = (long long)B * N * cout;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    const int c = (int)(idx % cout);
    const long long row = idx / cout;          // b * N + i
    const int i = (int)(row % N);
    const long long b0 = row - i;              // b * N
    float acc = 0.0f;
    for (int k = indptr[i]; k < indptr[i + 1]; ++k) {
        acc = fmaf(data[k], y[(b0 + indices[k]) * ldy + off1 + c], acc);
    }
    float v = __fadd_rn(__fadd_rn(y[row * ldy + c], acc), bias[c]);
    if (relu) v = fmaxf(v, 0.0f);
    out[idx] = res != nullptr ? __fmul_rn(__fadd_rn(v, res[idx]), 0.5f) : v;
}

// csr_gconv for 4 adjacent columns a thread, with 32-bit indices: the same fmaf chain and adds per
// element (bit for bit csr_gconv's results) from 16-byte loads of y, bias, res and stores of out.
// Needs cout, ldy and off1 multiples of 4, y, bias, res, out 16-byte aligned, B * N * cout < 2^31.
__device__ __forceinline__ float xm_gconv_end(float y0, float acc, float b, const float* res, int e, int relu) {
    float v = __fadd_rn(__fadd_rn(y0, acc), b);
    if (relu) v = fmaxf(v, 0.0f);
    return res != nullptr ? __fmul_rn(__fadd_rn(v, res[e]), 0.5f) : v;
}

XM_KERNEL(csr_gconv_x4) void csr_gconv_x4(const int* __restrict__ indptr, const int* __restrict__ indices,
                                        const float* __restrict__ data, const float* __restrict__ y,
                                        int ldy, int off1, const float* __restrict__ bias,
                                        const float* __restrict__ res, float* __restrict__ out,
                                        int B, int N, int cout, int relu) {
    const int quads = cout >> 2;
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= B * N * quads) return;
    const int row = idx / quads, c = (idx - row * quads) * 4;   // row = b * N + i
    const int i = row % N, b0 = row - i;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int end = __ldg(indptr + i + 1);
    for (int k = __ldg(indptr + i); k < end; ++k) {
        const float a = __ldg(data + k);
        const float4 v = __ldg(reinterpret_cast<const float4*>(y + (size_t)(b0 + __ldg(indices + k)) * ldy + off1 + c));
        acc[0] = fmaf(a, v.x, acc[0]);
        acc[1] = fmaf(a, v.y, acc[1]);
        acc[2] = fmaf(a, v.z, acc[2]);
        acc[3] = fmaf(a, v.w, acc[3]);
    }
    const float4 y0 = __ldg(reinterpret_cast<const float4*>(y + (size_t)row * ldy + c));
    const float4 bc = __ldg(reinterpret_cast<const float4*>(bias + c));
    const float* r = res != nullptr ? res + (size_t)row * cout + c : nullptr;
    float4 o;
    o.x = xm_gconv_end(y0.x, acc[0], bc.x, r, 0, relu);
    o.y = xm_gconv_end(y0.y, acc[1], bc.y, r, 1, relu);
    o.z = xm_gconv_end(y0.z, acc[2], bc.z, r, 2, relu);
    o.w = xm_gconv_end(y0.w, acc[3], bc.w, r, 3, relu);
    *reinterpret_cast<float4*>(out + (size_t)row * cout + c) = o;
}
