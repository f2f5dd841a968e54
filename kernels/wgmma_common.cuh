// Hopper warpgroup-MMA primitives shared by the wgmma kernels (sm_90a): operand-mode codes,
// cp.async copies, transaction barriers with bulk and tensor-map copies, TF32 splitting and 16-bit
// packing, shared-memory matrix descriptors, the wgmma instructions, the input-side layers' vertex
// tiles, named barriers. Included by every wgmma_*.cu
// (xmesh/backends/cuda_kernels.py expands the include).
#include "bits16.cuh"

// Operand modes (the kernels' template parameter OPS): how A and B enter the tensor cores.
#define WG_3XTF32 3   // big and small TF32 parts, three products: float32 accuracy
#define WG_TF32 1     // one TF32 product
#define WG_F16 16     // float16 operands (B prepared by wg_pack_weight16), one k16 product
#define WG_BF16 17    // bfloat16 operands
__host__ __device__ constexpr bool wg_half(int ops) { return ops == WG_F16 || ops == WG_BF16; }

__device__ __forceinline__ unsigned wg_smem(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void wg_copy(unsigned dst, const float* src, int bytes, int src_bytes) {
    if (bytes == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// Transaction barriers (mbarrier, 8 bytes of shared memory) and bulk copies (the 1D form of the Tensor
// Memory Accelerator's copies): a barrier's phase completes once its arrivals are in and every byte it
// was told to expect has landed. wg_bulk_copy is one arrival that announces `bytes` and the copy of
// them from global to shared memory (both 16-byte aligned, bytes a multiple of 16); the async proxy
// writes them, so wgmmas may read them once the phase is seen complete, with no proxy fence.
__device__ __forceinline__ void wg_mbar_init(unsigned bar, unsigned arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// After the inits, before other threads or the copy engine use the barriers (then a block barrier).
__device__ __forceinline__ void wg_mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival on the barrier that also tells it to expect `bytes` more in this phase.
__device__ __forceinline__ void wg_mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void wg_bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
    wg_mbar_expect_tx(bar, bytes);
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
// A tensor map (CUtensorMap: the Tensor Memory Accelerator's description of a global array, made on
// the host by cuTensorMapEncodeTiled), passed to a kernel by value as a __grid_constant__ parameter.
struct alignas(64) WgTensorMap {
    unsigned long long bits[16];
};
// The box of a rank-3 tensor map at coordinates (c0, c1, c2) (innermost first) into shared memory at dst
// (laid out and swizzled as the map says; elements past the array's ends read as zero): one arrival
// on barrier `bar` that announces the box's `bytes`, and the copy.
__device__ __forceinline__ void wg_tensor_copy_3d(unsigned dst, const WgTensorMap& map, int c0, int c1, int c2,
                                                  unsigned bar, unsigned bytes) {
    wg_mbar_expect_tx(bar, bytes);
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
                 ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
                 : "memory");
}
// One arrival on the barrier (release: this thread's shared-memory writes are seen by whoever waits
// on the phase it completes).
__device__ __forceinline__ void wg_mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Wait until the barrier's phase of the given parity (0 for its 1st, 3rd, ... phase) has completed.
__device__ __forceinline__ void wg_mbar_wait(unsigned bar, unsigned parity) {
    asm volatile("{\n.reg .pred done;\nWG_MBAR_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WG_MBAR_WAIT;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}

// A thread's two rows of A read straight into registers (the training's layer kernels built with
// WG_DRB_DIRECT_A, and kernels/wgmma_rate.cu's measure of them).
struct WgDirectRows {
    const float* row[2];   // the thread's rows g and g + 8 (null: a padding row, read as zeros)
};

// The thread's floats k0 .. k0 + 7 of its two rows; floats past K read as zeros. WHOLE (with VEC): no
// row is null and k0 + 8 <= K, so the loads take no branch.
template <bool VEC, bool WHOLE = false>
__device__ __forceinline__ void wg_direct_load(float (&raw)[2][8], const WgDirectRows& rows, int k0, int K) {
    static_assert(VEC || !WHOLE, "the unchecked loads are 16-byte loads");
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float* p = rows.row[h];
        if (WHOLE || (VEC && p != nullptr && k0 + 8 <= K)) {
            const float4 lo = __ldg(reinterpret_cast<const float4*>(p + k0));
            const float4 hi = __ldg(reinterpret_cast<const float4*>(p + k0 + 4));
            raw[h][0] = lo.x, raw[h][1] = lo.y, raw[h][2] = lo.z, raw[h][3] = lo.w;
            raw[h][4] = hi.x, raw[h][5] = hi.y, raw[h][6] = hi.z, raw[h][7] = hi.w;
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) raw[h][e] = (p != nullptr && k0 + e < K) ? __ldg(p + k0 + e) : 0.0f;
        }
    }
}

// big = x rounded to TF32 (two integer instructions), small = x - big (exact in float32).
template <int OPS>
__device__ __forceinline__ void wg_split(float x, unsigned& big, unsigned& small) {
    big = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    if (OPS == WG_3XTF32) small = __float_as_uint(x - __uint_as_float(big));
}

// Two floats rounded (to nearest even) to float16 or bfloat16 and packed: lo in the low half.
template <int OPS>
__device__ __forceinline__ unsigned wg_pack(float lo, float hi) {
    unsigned d;
    if (OPS == WG_BF16)
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
    else
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

// Matrix descriptor of a K-major B slice in shared memory with the 128-byte swizzle: start address,
// leading byte offset (unused for this layout: 1), stride byte offset 1024 (between 8-row groups).
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3ffffu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

// The same with the 64-byte swizzle: rows of 64 bytes, 512 bytes between 8-row groups (the 16-bit
// chain's and the 3xf16 layer's W pieces, 32 K rows of 16 bits).
__device__ __forceinline__ unsigned long long wg_desc64(unsigned addr) {
    return (unsigned long long)((addr & 0x3ffffu) >> 4) | (1ull << 16) | (32ull << 32) | (2ull << 62);
}

#define WG_F8(i)                                                                                       \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),       \
        "+f"(d[i + 6]), "+f"(d[i + 7])

// d (64 x BN over the warpgroup) = A (64 x 8, registers) B (8 x BN, descriptor) + (accumulate ? d : 0),
// BN = 128, 64 or 96 (the training's weights' gradients)
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

__device__ __forceinline__ void wg_mma(float (&d)[32], const unsigned (&a)[4], unsigned long long desc,
                                       int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %36, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %37, p, 1, 1;\n}\n"
        : WG_F8(0), WG_F8(8), WG_F8(16), WG_F8(24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(accumulate), "l"(desc));
}

// d (64 x 96) with A in registers and B through a descriptor, for the instruction's shape and types
// (SHAPE: "m64n96k8.f32.tf32.tf32" or the 16-bit "m64n96k16.f32.f16.f16") and its trailing
// immediates (IMM: the scales, and for 16-bit B its transpose flag).
#define WG_MMA_N96(SHAPE, IMM)                                                                            \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %52, 0;\n"                                          \
                 "wgmma.mma_async.sync.aligned." SHAPE " "                                              \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
                 "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "  \
                 "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%48, %49, %50, %51}, "    \
                 "%53, p, " IMM ";\n}\n"                                                               \
                 : WG_F8(0), WG_F8(8), WG_F8(16), WG_F8(24), WG_F8(32), WG_F8(40)                         \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(accumulate), "l"(desc))
__device__ __forceinline__ void wg_mma(float (&d)[48], const unsigned (&a)[4], unsigned long long desc,
                                       int accumulate) {
    WG_MMA_N96("m64n96k8.f32.tf32.tf32", "1, 1");
}

// The same for 16-bit operands: A (64 x 16) as 4 registers of packed pairs, B (16 x 64).
#define WG_MMA16(TYPE)                                                                                     \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %36, 0;\n"                                            \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " "                           \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "  \
                 "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, " \
                 "%37, p, 1, 1, 0;\n}\n"                                                                 \
                 : WG_F8(0), WG_F8(8), WG_F8(16), WG_F8(24)                                                \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(accumulate), "l"(desc))
template <int OPS>
__device__ __forceinline__ void wg_mma16(float (&d)[32], const unsigned (&a)[4], unsigned long long desc,
                                         int accumulate) {
    if (OPS == WG_BF16)
        WG_MMA16("bf16");
    else
        WG_MMA16("f16");
}

// The same with A (64 x 16, K-major rows in B's layout) read from shared memory through a descriptor.
#define WG_MMA16_SS(TYPE)                                                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %32, 0;\n"                                            \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " "                           \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "  \
                 "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %33, %34, p, 1, 1, 0, 0;\n}\n" \
                 : WG_F8(0), WG_F8(8), WG_F8(16), WG_F8(24)                                                \
                 : "r"(accumulate), "l"(adesc), "l"(bdesc))
template <int OPS>
__device__ __forceinline__ void wg_mma16_ss(float (&d)[32], unsigned long long adesc, unsigned long long bdesc,
                                            int accumulate) {
    if (OPS == WG_BF16)
        WG_MMA16_SS("bf16");
    else
        WG_MMA16_SS("f16");
}

// A 16-bit value of the mode (float16, or bfloat16 for WG_BF16) as float32 (exact); wg_pack rounds back.
template <int OPS>
__device__ __forceinline__ float wg_widen16(unsigned short h) {
    return xm_widen16(h, OPS == WG_BF16);
}

// Vertex tile -> sample b, first vertex n0, for tiles of VERTS vertices running over each sample's N
// vertices in turn (the input-side deformation layers).
template <int VERTS>
__device__ __forceinline__ void wg_vertex_origin(int vertex_tile, int N, long& b, int& n0) {
    const int vert_tiles = (N + VERTS - 1) / VERTS;
    b = vertex_tile / vert_tiles;
    n0 = (vertex_tile % vert_tiles) * VERTS;
}

// Named barriers (bar.sync waits, bar.arrive does not): 0 is __syncthreads'; the K loop's is among
// the block's MMA warpgroups only (the whole block for the GEMM); a deformation layer's MMA and
// epilogue warpgroups hand the staged tile over through two more.
#define WG_MMA_BARRIER 1
#define WG_STAGING_FREE 2
#define WG_STAGING_FULL 3
#define WG_EPILOGUE_BARRIER 4
template <int ID, int COUNT>
__device__ __forceinline__ void wg_bar_sync() { asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "n"(COUNT) : "memory"); }
template <int ID, int COUNT>
__device__ __forceinline__ void wg_bar_arrive() { asm volatile("bar.arrive %0, %1;\n" ::"n"(ID), "n"(COUNT) : "memory"); }
// The same with the barrier chosen at run time (a ring slot's barrier).
__device__ __forceinline__ void wg_bar_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void wg_bar_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Keep a register's value (and its liveness) pinned at this point: wgmma reads its register
// operands and writes its accumulators asynchronously, until wgmma.wait_group.
__device__ __forceinline__ void wg_pin(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void wg_pin(unsigned& x) { asm volatile("" : "+r"(x)::"memory"); }

// A 3xTF32 slice's A fragments kept live up to here (its wgmmas read them until a wait_group retires them).
__device__ __forceinline__ void wg_pin_fragments(unsigned (&big)[4][4], unsigned (&small)[4][4]) {
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            wg_pin(big[s][e]);
            wg_pin(small[s][e]);
        }
}

// The end of a 3xTF32 K slice whose A fragments came from registers, after its wgmma.wait_group 0: the
// fragments kept live until here (the wgmmas read them asynchronously), and the slice's own sum added
// to the thread's accumulator with rounded FADDs.
template <int N>
__device__ __forceinline__ void wg_end_slice(unsigned (&big)[4][4], unsigned (&small)[4][4], float (&part)[N],
                                             float (&acc)[N]) {
    wg_pin_fragments(big, small);
#pragma unroll
    for (int i = 0; i < N; ++i) {
        wg_pin(part[i]);
        acc[i] += part[i];
    }
}
