// The 16-bit deformation layers' vertex tile (kernels/wgmma_drb16.cu: one layer a launch;
// wgmma_drb16_chain.cu: a block's five wide layers in one): 4 vertices x 43 hypotheses as rows
// 4 i + v of 128-byte swizzled rows of 64 16-bit columns, three MMA warpgroups of 64 rows and a producer
// warpgroup that makes Z = A1 X a 32-column slice at a time; W's output columns in zl_column's order.
#include "wgmma_common.cuh"

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

// Z = A1 X for one 32-column slice and one vertex v of the tile, on the tensor cores, by one warp:
// rows 4 i + v (i < 43) of the K buffer at shared address src, its 16-byte chunks c0 .. c0 + 3 (of
// eight a 128-byte swizzled row), into the same rows of dst, chunks d0 .. d0 + 3, rounded to the mode's
// 16 bits. A1 runs as a 48 x 48 matrix of the mode's 16 bits (zero past 43; a1: this lane's A fragments
// of mma.m16n8k16, tile (m, k) in a1[4 (3 m + k) ..], made by hopper.mixing_fragments), X's slice as
// its B operand (ldmatrix.trans: K rows past 42 read row 42, which the zero columns cancel), float32
// sums; Z's rows past 42 go to row ZL_SCRATCH_ROW, which no MMA result that is kept reads.
#define ZL_SCRATCH_ROW (ZL_TILE_ROWS + 1)
#ifndef ZL_MIX_NT
#define ZL_MIX_NT 4
#endif
template <int OPS>
__device__ __forceinline__ void zl_mma_16816(float (&c)[4], const unsigned* a, unsigned b0, unsigned b1) {
    if (OPS == WG_BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <int OPS>
__device__ __forceinline__ void zl_mix_slice(const unsigned (&a1)[36], unsigned src, int c0, unsigned dst, int d0,
                                             int v, int lane) {
    // ldmatrix row addresses: lane l gives K row l (x4: rows 0..31) and K row 32 + l % 16 (x2);
    // stmatrix: output row l (x4) and 32 + l % 16 (x2)
    const int k0 = 4 * lane + v, k1 = 4 * min(32 + (lane & 15), ZL_HYP - 1) + v;
    const int o1 = 32 + (lane & 15);
    const int r0 = 4 * lane + v, r1 = o1 < ZL_HYP ? 4 * o1 + v : ZL_SCRATCH_ROW;
#pragma unroll
    for (int n0 = 0; n0 < 4; n0 += ZL_MIX_NT) {   // ZL_MIX_NT 8-column tiles at a time: independent sums
        unsigned b[ZL_MIX_NT][6];
        float c[ZL_MIX_NT][3][4];
#pragma unroll
        for (int j = 0; j < ZL_MIX_NT; ++j) {
            const int n = n0 + j;
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(b[j][0]), "=r"(b[j][1]), "=r"(b[j][2]), "=r"(b[j][3])
                         : "r"(src + k0 * 128 + (((c0 + n) ^ (k0 & 7)) << 4)) : "memory");
            asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                         : "=r"(b[j][4]), "=r"(b[j][5]) : "r"(src + k1 * 128 + (((c0 + n) ^ (k1 & 7)) << 4)) : "memory");
#pragma unroll
            for (int m = 0; m < 3; ++m)
#pragma unroll
                for (int e = 0; e < 4; ++e) c[j][m][e] = 0.0f;
        }
#pragma unroll
        for (int k = 0; k < 3; ++k)
#pragma unroll
            for (int j = 0; j < ZL_MIX_NT; ++j)
#pragma unroll
                for (int m = 0; m < 3; ++m) zl_mma_16816<OPS>(c[j][m], &a1[4 * (3 * m + k)], b[j][2 * k], b[j][2 * k + 1]);
#pragma unroll
        for (int j = 0; j < ZL_MIX_NT; ++j) {
            const int n = n0 + j;
            asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                         ::"r"(dst + r0 * 128 + (((d0 + n) ^ (r0 & 7)) << 4)),
                         "r"(wg_pack<OPS>(c[j][0][0], c[j][0][1])), "r"(wg_pack<OPS>(c[j][0][2], c[j][0][3])),
                         "r"(wg_pack<OPS>(c[j][1][0], c[j][1][1])), "r"(wg_pack<OPS>(c[j][1][2], c[j][1][3])) : "memory");
            asm volatile("stmatrix.sync.aligned.m8n8.x2.shared.b16 [%0], {%1, %2};\n"
                         ::"r"(dst + r1 * 128 + (((d0 + n) ^ (r1 & 7)) << 4)),
                         "r"(wg_pack<OPS>(c[j][2][0], c[j][2][1])), "r"(wg_pack<OPS>(c[j][2][2], c[j][2][3])) : "memory");
        }
    }
}

// This lane's A1 fragments for zl_mix_slice from hopper.mixing_fragments' array (9 tiles x 32 lanes x 4).
__device__ __forceinline__ void zl_load_mixing(const uint4* __restrict__ frag, int lane, unsigned (&a1)[36]) {
#pragma unroll
    for (int j = 0; j < 9; ++j) {
        const uint4 u = __ldg(frag + 32 * j + lane);
        a1[4 * j] = u.x;
        a1[4 * j + 1] = u.y;
        a1[4 * j + 2] = u.z;
        a1[4 * j + 3] = u.w;
    }
}
