// The 'SAME' convolutions that do not run in tc_gemm.cu (xmesh/backends/cupy_backend/convolution.py):
// direct float32 sums for few input channels, and im2col for a GEMM.
#include "stage_common.cuh"

// 'SAME' convolution of NHWC float32 x with few input channels (the CNNs' first layer, 3 -> 16, whose
// 27-wide K leaves the tensor-core kernels idle): direct float32 sums. A block per output row (blockIdx.x
// = oy, blockIdx.y = image) holds `weights` (kh*kw*C, cout) in dynamic shared memory; its threads
// take (output pixel, 4 output channels) along the row, so consecutive threads store consecutive
// 16-byte pieces. The sum runs over (ky, kx, c) in order from 0 (taps in the zero padding skipped),
// then + bias and the ReLU. cout a multiple of 4, out 16-byte aligned.
XM_KERNEL(conv_direct_x4) void conv_direct_x4(const float* __restrict__ x, const float* __restrict__ weights,
                                          const float* __restrict__ bias, float* __restrict__ out, int H, int W,
                                          int C, int kh, int kw, int stride, int Wo, int pad_top, int pad_left,
                                          int cout, int relu) {
    extern __shared__ __align__(16) float xm_conv_w[];
    for (int i = threadIdx.x; i < kh * kw * C * cout; i += blockDim.x) xm_conv_w[i] = weights[i];
    __syncthreads();
    const int oy = blockIdx.x, n = blockIdx.y, groups = cout / 4;
    const float* image = x + (long long)n * H * W * C;
    float4* row = reinterpret_cast<float4*>(out + ((long long)n * gridDim.x + oy) * Wo * cout);
    for (int t = threadIdx.x; t < Wo * groups; t += blockDim.x) {
        const int ox = t / groups, g = t - ox * groups;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int ky = 0; ky < kh; ++ky) {
            const int iy = oy * stride - pad_top + ky;
            if (iy < 0 || iy >= H) continue;
            for (int kx = 0; kx < kw; ++kx) {
                const int ix = ox * stride - pad_left + kx;
                if (ix < 0 || ix >= W) continue;
                const float* px = image + (iy * W + ix) * C;
                const float* wk = xm_conv_w + (ky * kw + kx) * C * cout + 4 * g;
                for (int c = 0; c < C; ++c) {
                    const float v = __ldg(px + c);
                    const float4 wv = *reinterpret_cast<const float4*>(wk + c * cout);
                    acc.x = fmaf(v, wv.x, acc.x);
                    acc.y = fmaf(v, wv.y, acc.y);
                    acc.z = fmaf(v, wv.z, acc.z);
                    acc.w = fmaf(v, wv.w, acc.w);
                }
            }
        }
        if (bias != nullptr) {
            acc.x = __fadd_rn(acc.x, bias[4 * g]);
            acc.y = __fadd_rn(acc.y, bias[4 * g + 1]);
            acc.z = __fadd_rn(acc.z, bias[4 * g + 2]);
            acc.w = __fadd_rn(acc.w, bias[4 * g + 3]);
        }
        if (relu) {
            acc.x = fmaxf(acc.x, 0.0f);
            acc.y = fmaxf(acc.y, 0.0f);
            acc.z = fmaxf(acc.z, 0.0f);
            acc.w = fmaxf(acc.w, 0.0f);
        }
        row[t] = acc;
    }
}

// conv_direct_x4 for one shape known at compile time (C inputs, K x K taps, stride 1, COUT outputs: the
// CNNs' first layer, 3 -> 16 in 3 x 3): a thread per output pixel takes all COUT channels, so each input
// value is loaded once (not once per 4 outputs) and the loops unroll; the sums run in conv_direct_x4's
// order, so the bits are its bits. A block per output row, Wo threads or more.
template <int C, int K, int COUT>
__device__ __forceinline__ void xm_conv_direct_fixed(const float* __restrict__ x, const float* __restrict__ weights,
                                                     const float* __restrict__ bias, float* __restrict__ out, int H,
                                                     int W, int Wo, int pad_top, int pad_left, int relu) {
    __shared__ __align__(16) float w[K * K * C * COUT];
    for (int i = threadIdx.x; i < K * K * C * COUT; i += blockDim.x) w[i] = weights[i];
    __syncthreads();
    const int oy = blockIdx.x, n = blockIdx.y, ox = threadIdx.x;
    if (ox >= Wo) return;
    const float* image = x + (long long)n * H * W * C;
    float acc[COUT];
#pragma unroll
    for (int o = 0; o < COUT; ++o) acc[o] = 0.0f;
#pragma unroll
    for (int ky = 0; ky < K; ++ky) {
        const int iy = oy - pad_top + ky;
        if (iy < 0 || iy >= H) continue;
#pragma unroll
        for (int kx = 0; kx < K; ++kx) {
            const int ix = ox - pad_left + kx;
            if (ix < 0 || ix >= W) continue;
            const float* px = image + (iy * W + ix) * C;
#pragma unroll
            for (int c = 0; c < C; ++c) {
                const float v = __ldg(px + c);
                const float4* wk = reinterpret_cast<const float4*>(w + ((ky * K + kx) * C + c) * COUT);
#pragma unroll
                for (int o4 = 0; o4 < COUT / 4; ++o4) {
                    const float4 wv = wk[o4];
                    acc[4 * o4] = fmaf(v, wv.x, acc[4 * o4]);
                    acc[4 * o4 + 1] = fmaf(v, wv.y, acc[4 * o4 + 1]);
                    acc[4 * o4 + 2] = fmaf(v, wv.z, acc[4 * o4 + 2]);
                    acc[4 * o4 + 3] = fmaf(v, wv.w, acc[4 * o4 + 3]);
                }
            }
        }
    }
    float4* dst = reinterpret_cast<float4*>(out + (((long long)n * gridDim.x + oy) * Wo + ox) * COUT);
#pragma unroll
    for (int o4 = 0; o4 < COUT / 4; ++o4) {
        float r[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            r[j] = bias != nullptr ? __fadd_rn(acc[4 * o4 + j], bias[4 * o4 + j]) : acc[4 * o4 + j];
            if (relu) r[j] = fmaxf(r[j], 0.0f);
        }
        dst[o4] = make_float4(r[0], r[1], r[2], r[3]);
    }
}

XM_KERNEL(conv_direct_c3_k3_n16) void conv_direct_c3_k3_n16(const float* __restrict__ x, const float* __restrict__ weights,
                                                 const float* __restrict__ bias, float* __restrict__ out, int H,
                                                 int W, int Wo, int pad_top, int pad_left, int relu) {
    xm_conv_direct_fixed<3, 3, 16>(x, weights, bias, out, H, W, Wo, pad_top, pad_left, relu);
}

// im2col for NHWC input with TensorFlow 'SAME' zero padding: cols (N*Ho*Wo, kh*kw*C), rows in NHW
// order, columns in (ky, kx, c) order (matching a [kh,kw,cin,cout] kernel reshaped to (kh*kw*cin, cout)).
XM_KERNEL(im2col_nhwc) void im2col_nhwc(const float* __restrict__ x, float* __restrict__ cols,
                                       int N, int H, int W, int C, int kh, int kw, int stride,
                                       int Ho, int Wo, int pad_top, int pad_left) {
    const long long K = (long long)kh * kw * C;
    const long long total = (long long)N * Ho * Wo * K;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long row = i / K;
        const int col = (int)(i - row * K);
        const int c = col % C;
        const int kx = (col / C) % kw;
        const int ky = col / (C * kw);
        const int ox = (int)(row % Wo);
        const long long t = row / Wo;
        const int oy = (int)(t % Ho);
        const int n = (int)(t / Ho);
        const int iy = oy * stride - pad_top + ky;
        const int ix = ox * stride - pad_left + kx;
        float v = 0.0f;
        if (iy >= 0 && iy < H && ix >= 0 && ix < W) {
            v = __ldg(x + (((long long)n * H + iy) * W + ix) * C + c);
        }
        cols[i] = v;
    }
}

// The backward of im2col_nhwc: dx (N, H, W, C) = for each input element, the sum of the cols entries
// of the taps (ky, kx) that read it, in increasing (ky, kx) from zero (the order and values of the
// training's array-API col2im, which adds the taps one after another into a zeroed padded array).
XM_KERNEL(col2im_nhwc) void col2im_nhwc(const float* __restrict__ cols, float* __restrict__ dx,
                                       int N, int H, int W, int C, int kh, int kw, int stride,
                                       int Ho, int Wo, int pad_top, int pad_left) {
    const long long K = (long long)kh * kw * C;
    const long long total = (long long)N * H * W * C;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(i % C);
        long long t = i / C;
        const int ix = (int)(t % W);
        t /= W;
        const int iy = (int)(t % H);
        const long long n = t / H;
        float v = 0.0f;
        for (int ky = 0; ky < kh; ++ky) {
            const int y = iy + pad_top - ky;   // oy * stride for the output row that reads it
            if (y < 0 || y % stride != 0 || y / stride >= Ho) continue;
            for (int kx = 0; kx < kw; ++kx) {
                const int x = ix + pad_left - kx;
                if (x < 0 || x % stride != 0 || x / stride >= Wo) continue;
                v += cols[((n * Ho + y / stride) * Wo + x / stride) * K + (ky * kw + kx) * C + c];
            }
        }
        dx[i] = v;
    }
}
