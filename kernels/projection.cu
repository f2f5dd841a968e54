// The projections (xmesh/backends/cupy_backend/projection.py): stage 1's graph projection and stage 2's
// local projection, each in one launch.
//
// The camera arithmetic uses __fmul_rn/__fadd_rn/__fdiv_rn so the compiler cannot contract it into
// fused multiply-adds: the pixel a point lands in must match the CPU's float32 computation bit for
// bit (xmesh/model/projection.py, _mat3 and _view_pixels).
#include "stage_common.cuh"
#include "bits16.cuh"

#define XM_FOCAL 248.0f
#define XM_CENTER 112.0f
#define XM_MAX_PIXEL 223.0f

// Pixel (h, w) of a camera-0 point in view v. T: one sample's packed transforms
// [from0 (9, [k][j]), origin0 (3), rot (V*9, [v][k][j]), origin (V*3)].
__device__ __forceinline__ void xm_view_pixel(const float* __restrict__ T, int V, int v,
                                              float p0, float p1, float p2, float& h, float& w) {
    const float* F = T;
    const float* o0 = T + 9;
    const float* R = T + 12 + 9 * v;
    const float* ov = T + 12 + 9 * V + 3 * v;
    float d[3];
#pragma unroll
    for (int j = 0; j < 3; ++j) {
        float world = __fadd_rn(__fadd_rn(__fadd_rn(__fmul_rn(p0, F[j]), __fmul_rn(p1, F[3 + j])),
                                          __fmul_rn(p2, F[6 + j])), o0[j]);
        d[j] = __fsub_rn(world, ov[j]);
    }
    float q[3];
#pragma unroll
    for (int j = 0; j < 3; ++j) {
        q[j] = __fadd_rn(__fadd_rn(__fmul_rn(d[0], R[j]), __fmul_rn(d[1], R[3 + j])), __fmul_rn(d[2], R[6 + j]));
    }
    float nz = -q[2];
    h = __fadd_rn(__fmul_rn(XM_FOCAL, __fdiv_rn(-q[1], nz)), XM_CENTER);
    w = __fadd_rn(__fmul_rn(XM_FOCAL, __fdiv_rn(q[0], nz)), XM_CENTER);
    h = fminf(fmaxf(h, 0.0f), XM_MAX_PIXEL);
    w = fminf(fmaxf(w, 0.0f), XM_MAX_PIXEL);
}

// This thread's item of a projection over (sample b, point pt of B*N, channel c of CT): false
// for the threads past the end.
__device__ __forceinline__ bool xm_thread_item(int B, int N, int CT, int& c, long long& pt, int& b) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)B * N * CT) return false;
    c = (int)(idx % CT);
    pt = idx / CT;
    b = (int)(pt / N);
    return true;
}

// Channel c of the maps' concatenation (up to 4 maps): the map it lies in, that map's size and
// channel count, and the channel within it.
__device__ __forceinline__ void xm_pick_map(int c, const float* m0, const float* m1, const float* m2,
                                            const float* m3, int s0, int s1, int s2, int s3,
                                            int c0, int c1, int c2, int c3, const float*& m, int& s,
                                            int& C, int& cc) {
    if (c < c0) { m = m0; s = s0; C = c0; cc = c; return; }
    c -= c0;
    if (c < c1) { m = m1; s = s1; C = c1; cc = c; return; }
    c -= c1;
    if (c < c2 || m3 == nullptr) { m = m2; s = s2; C = c2; cc = c; return; }
    m = m3; s = s3; C = c3; cc = c - c2;
}

// An output element: float32 as it is, or (unsigned short: the 16-bit modes' activations; bf16 says
// which type) rounded to nearest even.
__device__ __forceinline__ void xm_put(float* o, float v, int) { *o = v; }
__device__ __forceinline__ void xm_put(unsigned short* o, float v, int bf16) { *o = xm_round16(v, bf16); }

// max, mean and std = sqrt(mean((x - mean)^2) + 1e-6) of one channel over the views, summing left to
// right like NumPy's reduction over a leading axis, dividing by V. NV: the views at compile time, or
// 0 for V at run time (loops over XM_MAX_VIEWS, the views past V predicated off).
template <int NV>
__device__ __forceinline__ void xm_pool_views(const float* vals, int V, float& mx, float& mean, float& sd) {
    constexpr int MAXV = NV ? NV : XM_MAX_VIEWS;
    mx = vals[0];
    float sum = vals[0];
#pragma unroll
    for (int v = 1; v < MAXV; ++v) {
        if (NV || v < V) {
            mx = fmaxf(mx, vals[v]);
            sum = __fadd_rn(sum, vals[v]);
        }
    }
    mean = __fdiv_rn(sum, (float)V);
    const float d0 = __fsub_rn(vals[0], mean);
    float ss = __fmul_rn(d0, d0);
#pragma unroll
    for (int v = 1; v < MAXV; ++v) {
        if (NV || v < V) {
            const float d = __fsub_rn(vals[v], mean);
            ss = __fadd_rn(ss, __fmul_rn(d, d));
        }
    }
    sd = __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)V), 1e-6f));
}

// Pool channel c of point pt over the V views (max, mean, std = sqrt(var + 1e-6)) and write it to the
// point's output row [coords(3), max(CT), mean(CT), std(CT)] (rows ldo floats apart); the first 3 channels' threads also
// copy the point p.
template <class OT = float>
__device__ __forceinline__ void xm_pool_store(const float* vals, int V, OT* __restrict__ out, long long ldo,
                                              long long pt, int CT, int c, const float* __restrict__ p,
                                              int bf16 = 0) {
    float mx, mean, sd;
    xm_pool_views<0>(vals, V, mx, mean, sd);
    OT* o = out + pt * ldo;
    xm_put(o + 3 + c, mx, bf16);
    xm_put(o + 3 + CT + c, mean, bf16);
    xm_put(o + 3 + 2 * CT + c, sd, bf16);
    if (c < 3) xm_put(o + c, p[c], bf16);
}

// Stage 1's gather rule: the pixel of a map of size s (stride r = 224 / s, given) that view v of sample
// b reads at image position (h, w), as an index into the stacked (B*MV, s, s) maps. Indices truncate
// h / r and w / r; with the quirk the view index is divided by r too (every view reads view 0's maps).
__device__ __forceinline__ long long xm_stage1_pixel(float h, float w, int s, int r, int v, int b, int MV, int quirk) {
    const float rf = (float)r;
    const int ih = (int)__fdiv_rn(h, rf), iw = (int)__fdiv_rn(w, rf);
    const int src = quirk ? v / r : v;
    return ((long long)(b * MV + src) * s + ih) * s + iw;   // MV views' maps a sample
}

// Stage 1: one thread per (sample b, point n, channel c of the 4 concatenated maps).
// coords (B,N,3); tf (B, 12+12V); maps m_i (B*MV, s_i, s_i, C_i): the first MV views of each sample
// (all V, or with the quirk only view 0, the one it reads); out (B, N, 3 + 3*CT), rows ldo apart.
XM_KERNEL(graph_projection) void graph_projection(
    const float* __restrict__ coords, const float* __restrict__ tf,
    const float* __restrict__ m0, const float* __restrict__ m1,
    const float* __restrict__ m2, const float* __restrict__ m3,
    int s0, int s1, int s2, int s3, int c0, int c1, int c2, int c3,
    int B, int N, int V, int quirk, int MV, float* __restrict__ out, long long ldo) {
    const int CT = c0 + c1 + c2 + c3;
    int c, b;
    long long pt;
    if (!xm_thread_item(B, N, CT, c, pt, b)) return;
    const float* p = coords + pt * 3;
    const float p0 = p[0], p1 = p[1], p2 = p[2];
    const float* T = tf + (long long)b * (12 + 12 * V);

    const float* m;
    int s, C, cc;
    xm_pick_map(c, m0, m1, m2, m3, s0, s1, s2, s3, c0, c1, c2, c3, m, s, C, cc);
    const int r = 224 / s;

    float vals[XM_MAX_VIEWS];
#pragma unroll
    for (int v = 0; v < XM_MAX_VIEWS; ++v) {
        if (v < V) {
            float h, w;
            xm_view_pixel(T, V, v, p0, p1, p2, h, w);
            vals[v] = __ldg(m + xm_stage1_pixel(h, w, s, r, v, b, MV, quirk) * C + cc);
        } else {
            vals[v] = 0.0f;
        }
    }
    xm_pool_store(vals, V, out, ldo, pt, CT, c, p);
}

// Stage 1 with every map's channel count a multiple of 4 (the CNN's 64, 128, 256, 512): a block takes
// XM_GP_POINTS points; each (point, view)'s pixel offset in the 4 maps is computed once into shared
// memory, then a thread per (point, 4 channels) gathers 16 bytes per view and pools them. The same
// pixel arithmetic and pooling as graph_projection, so the same bits; 32-bit offsets (the host checks
// that every map holds fewer than 2^31 elements).
XM_KERNEL(graph_projection_tiled) void __launch_bounds__(XM_GP_THREADS) graph_projection_tiled(
    const float* __restrict__ coords, const float* __restrict__ tf,
    const float* __restrict__ m0, const float* __restrict__ m1,
    const float* __restrict__ m2, const float* __restrict__ m3,
    int s0, int s1, int s2, int s3, int c0, int c1, int c2, int c3,
    int B, int N, int V, int quirk, int MV, float* __restrict__ out, long long ldo) {
    __shared__ int offsets[XM_GP_POINTS][XM_MAX_VIEWS][4];   // (point, view, map): the pixel's first element
    const int CT = c0 + c1 + c2 + c3, groups = CT / 4;
    const long long total = (long long)B * N, first = (long long)blockIdx.x * XM_GP_POINTS;
    for (int i = threadIdx.x; i < XM_GP_POINTS * V; i += blockDim.x) {
        const int j = i / V, v = i % V;
        const long long pt = first + j;
        if (pt >= total) continue;
        const int b = (int)(pt / N);
        const float* p = coords + pt * 3;
        float h, w;
        xm_view_pixel(tf + (long long)b * (12 + 12 * V), V, v, p[0], p[1], p[2], h, w);
        const int sizes[4] = {s0, s1, s2, s3}, chans[4] = {c0, c1, c2, c3};
#pragma unroll
        for (int k = 0; k < 4; ++k)
            offsets[j][v][k] = (int)(xm_stage1_pixel(h, w, sizes[k], 224 / sizes[k], v, b, MV, quirk) * chans[k]);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < XM_GP_POINTS * groups; i += blockDim.x) {
        const int j = i / groups, c = 4 * (i % groups);
        const long long pt = first + j;
        if (pt >= total) break;   // i only grows: every later item is past the end too
        const int k = c < c0 ? 0 : (c < c0 + c1 ? 1 : (c < c0 + c1 + c2 ? 2 : 3));   // channel c's map
        const float* m;
        int s, C, cc;
        xm_pick_map(c, m0, m1, m2, m3, s0, s1, s2, s3, c0, c1, c2, c3, m, s, C, cc);
        float vals[4][XM_MAX_VIEWS];
#pragma unroll
        for (int v = 0; v < XM_MAX_VIEWS; ++v) {
            float4 q = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (v < V) q = __ldg(reinterpret_cast<const float4*>(m + offsets[j][v][k] + cc));
            vals[0][v] = q.x;
            vals[1][v] = q.y;
            vals[2][v] = q.z;
            vals[3][v] = q.w;
        }
        const float* p = coords + pt * 3;
#pragma unroll
        for (int e = 0; e < 4; ++e) xm_pool_store(vals[e], V, out, ldo, pt, CT, c + e, p);
    }
}

// The original's bilinear rule at view v of point (p0, p1, p2) on a zero-padded (s+1)^2 map: the
// pixel indices within that one map (ix * (s+1) + iy) of the four corners q11, q21, q12, q22 and
// their weights. x1 = floor, x2 = ceil, so a point on a pixel row has zero weight on both (the quirk).
// (The tiled local projection keeps the corners as float offsets within a sample's maps instead.)
struct XmBilinear {
    int i11, i21, i12, i22;
    float w11, w21, w12, w22;
};

// The map stride 224 / s as float32, as the original computes it.
__device__ __forceinline__ float xm_map_stride(int s) { return (float)(224.0 / (double)s); }

// The rule at pixel (h, w) of the view on a map of size s and stride rf = xm_map_stride(s).
__device__ __forceinline__ XmBilinear xm_bilinear_at(float h, float w, int s, float rf) {
    const int sp = s + 1;
    const float x = __fdiv_rn(h, rf);
    const float y = __fdiv_rn(w, rf);
    const float x1 = floorf(x), x2 = ceilf(x);
    const float y1 = floorf(y), y2 = ceilf(y);
    const float wx1 = __fsub_rn(x2, x), wx2 = __fsub_rn(x, x1);
    const float wy1 = __fsub_rn(y2, y), wy2 = __fsub_rn(y, y1);
    const int ix1 = (int)x1, ix2 = (int)x2, iy1 = (int)y1, iy2 = (int)y2;
    XmBilinear r;
    r.i11 = ix1 * sp + iy1;
    r.i21 = ix2 * sp + iy1;
    r.i12 = ix1 * sp + iy2;
    r.i22 = ix2 * sp + iy2;
    r.w11 = __fmul_rn(wx1, wy1);
    r.w21 = __fmul_rn(wx2, wy1);
    r.w12 = __fmul_rn(wx1, wy2);
    r.w22 = __fmul_rn(wx2, wy2);
    return r;
}

__device__ __forceinline__ XmBilinear xm_bilinear(const float* __restrict__ T, int V, int v, int s,
                                                  float p0, float p1, float p2) {
    float h, w;
    xm_view_pixel(T, V, v, p0, p1, p2, h, w);
    return xm_bilinear_at(h, w, s, xm_map_stride(s));
}

// W consecutive channels at the four corners q[0..3] (q11, q21, q12, q22), interpolated: W = 4 is
// one 16-byte load per corner.
template <int W>
__device__ __forceinline__ void xm_lerp_corners(const float* const (&q)[4], const XmBilinear& r, float (&f)[W]) {
    float v[4][W];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        if constexpr (W == 4) {
            const float4 g = __ldg(reinterpret_cast<const float4*>(q[t]));
            v[t][0] = g.x, v[t][1] = g.y, v[t][2] = g.z, v[t][3] = g.w;
        } else {
#pragma unroll
            for (int j = 0; j < W; ++j) v[t][j] = __ldg(q[t] + j);
        }
    }
#pragma unroll
    for (int j = 0; j < W; ++j) {
        float s = __fmul_rn(v[0][j], r.w11);
        s = __fadd_rn(s, __fmul_rn(v[1][j], r.w21));
        s = __fadd_rn(s, __fmul_rn(v[2][j], r.w12));
        f[j] = __fadd_rn(s, __fmul_rn(v[3][j], r.w22));
    }
}

// The same from channel 0 at map pixel `pixel0` (pixels C floats apart).
template <int W>
__device__ __forceinline__ void xm_lerp_taps(const float* __restrict__ m, long long pixel0, int C,
                                             const XmBilinear& r, float (&f)[W]) {
    const float* const q[4] = {m + (pixel0 + r.i11) * C, m + (pixel0 + r.i21) * C,
                               m + (pixel0 + r.i12) * C, m + (pixel0 + r.i22) * C};
    xm_lerp_corners<W>(q, r, f);
}

// Stage 2, any channel counts: one thread per (sample b, point n, channel c of the 3 concatenated maps).
// points (B,n,3); maps m_i zero-padded (B*V, s_i+1, s_i+1, C_i); out (B, n, 3 + 3*CT), rows ldo apart.
XM_KERNEL(local_projection) void local_projection(
    const float* __restrict__ points, const float* __restrict__ tf,
    const float* __restrict__ m0, const float* __restrict__ m1, const float* __restrict__ m2,
    int s0, int s1, int s2, int c0, int c1, int c2, int B, int N, int V, float* __restrict__ out, long long ldo) {
    const int CT = c0 + c1 + c2;
    int c, b;
    long long pt;
    if (!xm_thread_item(B, N, CT, c, pt, b)) return;
    const float* p = points + pt * 3;
    const float* T = tf + (long long)b * (12 + 12 * V);
    const float* m;
    int s, C, cc;
    xm_pick_map(c, m0, m1, m2, nullptr, s0, s1, s2, 0, c0, c1, c2, 0, m, s, C, cc);
    float vals[XM_MAX_VIEWS];
#pragma unroll
    for (int v = 0; v < XM_MAX_VIEWS; ++v) {
        vals[v] = 0.0f;
        if (v < V) {
            float f[1];
            xm_lerp_taps<1>(m + cc, (long long)(b * V + v) * (s + 1) * (s + 1), C,
                            xm_bilinear(T, V, v, s, p[0], p[1], p[2]), f);
            vals[v] = f[0];
        }
    }
    xm_pool_store(vals, V, out, ldo, pt, CT, c, p);
}

// Stage 2 for channel counts that are multiples of 4 (maps 16-byte aligned, rows of ldo elements a
// multiple of 16 bytes); its float32 rows (XM_ROWS_F32) are bit-identical to the one above. A block takes XM_LP_POINTS consecutive points:
// it works out each point's pixel once per view and its bilinear corners once per (view, map) in
// shared memory (as 32-bit offsets within the sample's views of that map, so a sample's views of one
// map must stay below 2^31 floats), then each thread keeps one group of 4 channels (so one map: its
// pointers and sizes are worked out once) and takes that group for a point of every round: 16-byte
// gathers and pooling into the point's row in shared memory; the block's
// rows, contiguous in `out` as in shared memory, go out in coalesced 16-byte stores (zeros in the padding past 3 + 3*CT).
// NV: the views at compile time (3, the model's), or 0 for V at run time (up to XM_MAX_VIEWS), whose
// loops then run over XM_MAX_VIEWS with the views past V predicated off.
// OUT: XM_ROWS_F32 (float rows, the rule above to the bit) or, in the 16-bit modes, XM_ROWS_F16 /
// XM_ROWS_BF16 (16-bit rows, xm_lerp4_fma and xm_pool16's arithmetic).
// Dynamic shared memory: XM_LP_POINTS * (ldo * sizeof(OT) + 3 * V * sizeof(XmBilinear)).
// Launched with XM_LP_THREADS threads (7 warps: 8 points x 28 four-channel groups a round, 4 rounds
// for the model's 112 channels).

template <int OUT> struct XmOutType { typedef unsigned short type; };
template <> struct XmOutType<XM_ROWS_F32> { typedef float type; };

// The 16-bit modes compute the rule above in plain float32 arithmetic: the corners' products summed
// by fused multiply-adds, the mean and the variance as sums times 1/V, an approximate square root
// (sqrt.approx, about 2^-23 relative). Each value then lies within a few float32 ulps of the exact
// rule's, far below the one rounding to 16 bits that follows (2^-11 relative for float16, 2^-8 for
// bfloat16), which therefore gives the same bits except for values within those ulps of a rounding
// boundary (tests/test_cupy_backend.py bounds them). The exact rule's correctly rounded divisions and
// square root, each with its slow-path branch, took two thirds of the kernel's instructions.
__device__ __forceinline__ float xm_sqrt_approx(float x) {
    float r;
    asm("sqrt.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}

// 4 channels at the corners q (q11, q21, q12, q22), interpolated with fused multiply-adds.
__device__ __forceinline__ void xm_lerp4_fma(const float* const (&q)[4], const XmBilinear& r, float (&f)[4]) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(q[0]));
    const float4 b = __ldg(reinterpret_cast<const float4*>(q[1]));
    const float4 c = __ldg(reinterpret_cast<const float4*>(q[2]));
    const float4 d = __ldg(reinterpret_cast<const float4*>(q[3]));
    f[0] = fmaf(d.x, r.w22, fmaf(c.x, r.w12, fmaf(b.x, r.w21, a.x * r.w11)));
    f[1] = fmaf(d.y, r.w22, fmaf(c.y, r.w12, fmaf(b.y, r.w21, a.y * r.w11)));
    f[2] = fmaf(d.z, r.w22, fmaf(c.z, r.w12, fmaf(b.z, r.w21, a.z * r.w11)));
    f[3] = fmaf(d.w, r.w22, fmaf(c.w, r.w12, fmaf(b.w, r.w21, a.w * r.w11)));
}

// Two values rounded to nearest even float16 (bf16 = false) or bfloat16 as one 32-bit word, lo at the
// lower address (cvt's packed forms on compute capability 8.0 and later).
template <bool BF16>
__device__ __forceinline__ unsigned xm_pack16x2(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
    unsigned d;
    if constexpr (BF16) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
    }
    return d;
#else
    return (unsigned)xm_round16(lo, BF16) | ((unsigned)xm_round16(hi, BF16) << 16);
#endif
}

// v[0..3] rounded to 16 bits into p[0..3], p at an element 3 mod 4 of a 16-byte aligned row (a 4-channel
// group's place in one of a row's sections, after the 3 coordinates): p[1], p[2] as one 32-bit store.
template <bool BF16>
__device__ __forceinline__ void xm_put4_16(unsigned short* p, const float (&v)[4]) {
    const unsigned first = xm_pack16x2<BF16>(v[0], v[3]);
    p[0] = (unsigned short)first;
    *reinterpret_cast<unsigned*>(p + 1) = xm_pack16x2<BF16>(v[1], v[2]);
    p[3] = (unsigned short)(first >> 16);
}

// max, mean and std = sqrt(var + 1e-6) of each of 4 channels over the views (vals[channel][view]),
// rounded to the mode's 16 bits into o[3 + j], o[3 + CT + j], o[3 + 2 CT + j] (o 16-byte aligned, CT a
// multiple of 4).
template <int OUT, int NV>
__device__ __forceinline__ void xm_pool16(const float (&vals)[4][NV ? NV : XM_MAX_VIEWS], int V, float inv_v,
                                          unsigned short* __restrict__ o, int CT) {
    constexpr int MAXV = NV ? NV : XM_MAX_VIEWS;
    float mx[4], mean[4], sd[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        float sum = vals[j][0];
        mx[j] = vals[j][0];
#pragma unroll
        for (int v = 1; v < MAXV; ++v) {
            if (NV || v < V) {
                mx[j] = fmaxf(mx[j], vals[j][v]);
                sum += vals[j][v];
            }
        }
        mean[j] = sum * inv_v;
        float d = vals[j][0] - mean[j];
        float ss = d * d;
#pragma unroll
        for (int v = 1; v < MAXV; ++v) {
            if (NV || v < V) {
                d = vals[j][v] - mean[j];
                ss = fmaf(d, d, ss);
            }
        }
        sd[j] = xm_sqrt_approx(fmaf(ss, inv_v, 1e-6f));
    }
    constexpr bool bf16 = OUT == XM_ROWS_BF16;
    xm_put4_16<bf16>(o + 3, mx);
    xm_put4_16<bf16>(o + 3 + CT, mean);
    xm_put4_16<bf16>(o + 3 + 2 * CT, sd);
}

template <int OUT, int NV>
__device__ __forceinline__ void xm_local_projection_tiled(
    const float* __restrict__ points, const float* __restrict__ tf,
    const float* __restrict__ m0, const float* __restrict__ m1, const float* __restrict__ m2,
    int s0, int s1, int s2, int c0, int c1, int c2, int B, int N, int V,
    typename XmOutType<OUT>::type* __restrict__ out, long long ldo) {
    typedef typename XmOutType<OUT>::type OT;
    constexpr int MAXV = NV ? NV : XM_MAX_VIEWS;
    constexpr int bf16 = OUT == XM_ROWS_BF16;
    const int nv = NV ? NV : V;
    extern __shared__ __align__(16) unsigned char xm_lp_smem[];
    OT* rows = reinterpret_cast<OT*>(xm_lp_smem);                                   // [point][ldo]
    XmBilinear* taps = reinterpret_cast<XmBilinear*>(xm_lp_smem + XM_LP_POINTS * ldo * sizeof(OT));  // [point][view][map]
    __shared__ float xm_point[XM_LP_POINTS][3];
    __shared__ int xm_sample[XM_LP_POINTS];
    const int CT = c0 + c1 + c2, width = 3 + 3 * CT, quads = CT / 4;
    const long long first = (long long)blockIdx.x * XM_LP_POINTS;
    const int count = (int)min((long long)XM_LP_POINTS, (long long)B * N - first);
    const int pad = (int)ldo - width;
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
        xm_sample[i] = (int)((first + i) / N);
#pragma unroll
        for (int j = 0; j < 3; ++j) xm_point[i][j] = points[(first + i) * 3 + j];
        for (int j = 0; j < pad; ++j) rows[i * ldo + width + j] = OT(0);
    }
    __syncthreads();
    // a thread per (point, view): the pixel once, then the three maps' corners
    const float rf0 = xm_map_stride(s0), rf1 = xm_map_stride(s1), rf2 = xm_map_stride(s2);
    for (int t = threadIdx.x; t < count * nv; t += blockDim.x) {
        const int i = t / nv, v = t - i * nv;
        float h, w;
        xm_view_pixel(tf + (long long)xm_sample[i] * (12 + 12 * V), V, v, xm_point[i][0], xm_point[i][1],
                      xm_point[i][2], h, w);
        const XmBilinear r[3] = {xm_bilinear_at(h, w, s0, rf0), xm_bilinear_at(h, w, s1, rf1),
                                 xm_bilinear_at(h, w, s2, rf2)};
        const int sizes[3] = {s0, s1, s2}, chans[3] = {c0, c1, c2};
#pragma unroll
        for (int level = 0; level < 3; ++level) {   // corners as offsets (floats) within the sample's maps
            const int C = chans[level], view0 = v * (sizes[level] + 1) * (sizes[level] + 1) * C;
            XmBilinear o = r[level];
            o.i11 = view0 + o.i11 * C, o.i21 = view0 + o.i21 * C, o.i12 = view0 + o.i12 * C, o.i22 = view0 + o.i22 * C;
            if constexpr (OUT != XM_ROWS_F32) {   // in 16-byte units (C is a multiple of 4)
                o.i11 >>= 2, o.i21 >>= 2, o.i12 >>= 2, o.i22 >>= 2;
            }
            taps[3 * t + level] = o;
        }
    }
    __syncthreads();
    // a thread per group of 4 channels, for points i0, i0 + step, ... (more groups than threads:
    // groups q, q + blockDim.x, ... for every point)
    const int per_round = (int)blockDim.x / quads;
    const int q_first = per_round ? (int)threadIdx.x % quads : (int)threadIdx.x;
    const int q_step = per_round ? quads : (int)blockDim.x;
    const int i0 = per_round ? (int)threadIdx.x / quads : 0;
    const int i_step = per_round ? per_round : 1;
    if (i0 < max(per_round, 1)) {
        for (int q = q_first; q < quads; q += q_step) {
            const int c = 4 * q;
            const int level = c < c0 ? 0 : (c < c0 + c1 ? 1 : 2);
            const float* m;
            int s, C, cc;
            xm_pick_map(c, m0, m1, m2, nullptr, s0, s1, s2, 0, c0, c1, c2, 0, m, s, C, cc);
            const int sample_floats = nv * (s + 1) * (s + 1) * C;   // a sample's views of this map
            const float inv_v = 1.0f / (float)nv;   // the 16-bit modes' 1/V (folded for NV = 3)
            for (int i = i0; i < count; i += i_step) {
                const float* ms = m + cc + (long long)xm_sample[i] * sample_floats;
                float vals[4][MAXV];
#pragma unroll
                for (int v = 0; v < MAXV; ++v) {
                    float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    if (NV || v < V) {
                        const XmBilinear r = taps[(i * nv + v) * 3 + level];
                        if constexpr (OUT == XM_ROWS_F32) {
                            const float* const q[4] = {ms + r.i11, ms + r.i21, ms + r.i12, ms + r.i22};
                            xm_lerp_corners<4>(q, r, f);
                        } else {   // offsets in 16-byte units from the point's float4 base
                            const float4* const q4 = reinterpret_cast<const float4*>(ms);
                            const float* const q[4] = {
                                reinterpret_cast<const float*>(q4 + (unsigned)r.i11), reinterpret_cast<const float*>(q4 + (unsigned)r.i21),
                                reinterpret_cast<const float*>(q4 + (unsigned)r.i12), reinterpret_cast<const float*>(q4 + (unsigned)r.i22)};
                            xm_lerp4_fma(q, r, f);
                        }
                    }
#pragma unroll
                    for (int j = 0; j < 4; ++j) vals[j][v] = f[j];
                }
                OT* o = rows + i * ldo;
                if constexpr (OUT == XM_ROWS_F32) {
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        float mx, mean, sd;
                        xm_pool_views<NV>(vals[j], V, mx, mean, sd);
                        xm_put(o + 3 + c + j, mx, bf16);
                        xm_put(o + 3 + CT + c + j, mean, bf16);
                        xm_put(o + 3 + 2 * CT + c + j, sd, bf16);
                    }
                } else {
                    xm_pool16<OUT, NV>(vals, V, inv_v, o + c, CT);
                }
                if (c == 0) {
#pragma unroll
                    for (int j = 0; j < 3; ++j) xm_put(o + j, xm_point[i][j], bf16);
                }
            }
        }
    }
    __syncthreads();
    const int chunks = count * (int)(ldo * sizeof(OT) / 16);
    uint4* dst = reinterpret_cast<uint4*>(out + first * ldo);
    for (int t = threadIdx.x; t < chunks; t += blockDim.x) dst[t] = reinterpret_cast<const uint4*>(rows)[t];
}

#define XM_LP_BODY(OUT)                                                                                       \
    if (V == 3)                                                                                            \
        xm_local_projection_tiled<OUT, 3>(points, tf, m0, m1, m2, s0, s1, s2, c0, c1, c2, B, N, V, out, ldo);  \
    else                                                                                                   \
        xm_local_projection_tiled<OUT, 0>(points, tf, m0, m1, m2, s0, s1, s2, c0, c1, c2, B, N, V, out, ldo);

XM_KERNEL(local_projection_tiled) void __launch_bounds__(XM_LP_THREADS, 4)
local_projection_tiled(const float* points, const float* tf, const float* m0, const float* m1, const float* m2, int s0,
                       int s1, int s2, int c0, int c1, int c2, int B, int N, int V, float* out, long long ldo) {
    XM_LP_BODY(XM_ROWS_F32)
}

// The 16-bit modes' projection: out in the mode's activation type (float16, or bfloat16 bits when bf16
// != 0), each value xm_pool16's, rounded once to nearest even: what the deformation layer's 16-bit
// operands round its X to.
XM_KERNEL(local_projection_tiled_o16) void __launch_bounds__(XM_LP_THREADS, 4)
local_projection_tiled_o16(const float* points, const float* tf, const float* m0, const float* m1, const float* m2,
                           int s0, int s1, int s2, int c0, int c1, int c2, int B, int N, int V, unsigned short* out,
                           long long ldo, int bf16) {
    if (bf16) {
        XM_LP_BODY(XM_ROWS_BF16)
    } else {
        XM_LP_BODY(XM_ROWS_F16)
    }
}
