// The 16-bit deformation layers' vertex tile (kernels/wgmma_drb16.cu: one layer a launch;
// wgmma_drb16_chain.cu: a block's five wide layers in one): 4 vertices x 43 hypotheses as rows
// 4 i + v of 128-byte swizzled rows of 64 16-bit columns, three MMA warpgroups of 64 rows and a producer
// warpgroup that makes Z = A1 X a 32-column slice at a time; W's output columns in zl_column's order.
#include "wgmma_common.cuh"

#ifndef WG_MIX_SPARSE
#error "the 16-bit deformation layers need wg_mix_column (hopper.mixing_source) put before them"
#endif

#define ZL_HYP 43
#define ZL_VERTS 4
#define ZL_ROWS 192                       // 3 MMA warpgroups x 64 rows; 172 hold hypotheses
#define ZL_TILE_ROWS (ZL_HYP * ZL_VERTS)
#define ZL_COUT 192                       // output columns of the layer (one tile's CT: 192, or 96 for cin > 192)
#define ZL_BK 32                          // X columns per K slice
#define ZL_THREADS 512
#define ZL_MMA_THREADS 384
#define ZL_MMA_REGS 136                   // registers per thread after setmaxnreg: 3 * 136 + 96 <= 4 * 128
#define ZL_PRODUCER_REGS 96

// d (64 x CT over the warpgroup) += A (64 x 16) B (16 x CT), both from shared memory (descriptors).
#define ZL_MMA192(TYPE)                                                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %96, 0;\n"                                          \
                 "wgmma.mma_async.sync.aligned.m64n192k16.f32." TYPE "." TYPE " {"                       \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "  \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "  \
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "  \
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"  \
                 "}, %97, %98, p, 1, 1, 0, 0;\n}\n"                                                      \
                 : WG_F8(0), WG_F8(8), WG_F8(16), WG_F8(24), WG_F8(32), WG_F8(40), WG_F8(48), WG_F8(56),  \
                   WG_F8(64), WG_F8(72), WG_F8(80), WG_F8(88)                                            \
                 : "r"(accumulate), "l"(adesc), "l"(bdesc))
#define ZL_MMA96(TYPE)                                                                                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %48, 0;\n"                                          \
                 "wgmma.mma_async.sync.aligned.m64n96k16.f32." TYPE "." TYPE " {"                        \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "  \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"  \
                 "}, %49, %50, p, 1, 1, 0, 0;\n}\n"                                                      \
                 : WG_F8(0), WG_F8(8), WG_F8(16), WG_F8(24), WG_F8(32), WG_F8(40)                         \
                 : "r"(accumulate), "l"(adesc), "l"(bdesc))
template <int OPS>
__device__ __forceinline__ void zl_mma(float (&d)[96], unsigned long long adesc, unsigned long long bdesc, int accumulate) {
    if (OPS == WG_BF16)
        ZL_MMA192("bf16");
    else
        ZL_MMA192("f16");
}
template <int OPS>
__device__ __forceinline__ void zl_mma(float (&d)[48], unsigned long long adesc, unsigned long long bdesc, int accumulate) {
    if (OPS == WG_BF16)
        ZL_MMA96("bf16");
    else
        ZL_MMA96("f16");
}

// Bring bytes [p, p + bytes) into L2 (a bulk prefetch: p 16-byte aligned, bytes a multiple of 16).
__device__ __forceinline__ void zl_prefetch_l2(const void* p, unsigned bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}

// The output column (of a tile's CT) that accumulator column f holds: W's columns go into shared memory
// in this order, so that thread t of a quad, whose accumulators hold columns 8 j + 2 t, + 1 (j <
// CT / 8), holds output columns 32 k + 8 t .. 32 k + 8 t + 7 (k < CT / 32): its residual and output
// move in 16-byte pieces, a quad's four side by side (64 bytes of a row). Each output element keeps
// its sum over K, so the results are those of the unpermuted columns, bit for bit.
__device__ __forceinline__ int zl_column(int f) {
    const int j = f >> 3, t = (f >> 1) & 3;
    return 32 * (j >> 2) + 8 * t + 2 * (j & 3) + (f & 1);
}

// Byte offset of 16-bit element k (0..63) of row r in a buffer of 128-byte swizzled rows.
__device__ __forceinline__ unsigned zl_offset(int r, int k) {
    return r * 128 + ((((k >> 3) ^ (r & 7))) << 4) + (k & 7) * 2;
}

// Z = A1 X for one column of a 32-column slice and one vertex v of the tile: rows 4 i + v (i < 43) of
// src, column ks (0..63) of its 128-byte rows, mixed as the float32 fmaf chains of wg_mix_column and
// rounded to the mode's 16 bits into the same rows of dst, column kd. Rows of even and odd i differ in
// their swizzle ((4 i + v) % 8 = v + 4 (i % 2)), so two offsets serve all 43.
template <int OPS>
__device__ __forceinline__ void zl_mix_slice_column(const unsigned char* src, int ks, unsigned char* dst, int kd, int v) {
    const unsigned even = zl_offset(v, ks), odd = zl_offset(v + 4, ks) - 512;
    const unsigned even_d = zl_offset(v, kd), odd_d = zl_offset(v + 4, kd) - 512;
    float m[ZL_HYP];
#pragma unroll
    for (int i = 0; i < ZL_HYP; ++i) m[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < ZL_HYP; ++j)   // a column of A1 at a time: 43 independent chains
        wg_mix_column(j, wg_widen16<OPS>(*reinterpret_cast<const unsigned short*>(src + 512 * j + (j % 2 ? odd : even))), m);
#pragma unroll
    for (int i = 0; i < ZL_HYP; ++i)
        *reinterpret_cast<unsigned short*>(dst + 512 * i + (i % 2 ? odd_d : even_d)) = (unsigned short)(wg_pack<OPS>(m[i], 0.0f) & 0xffffu);
}
