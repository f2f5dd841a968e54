// Hopper tensor-core kernels (sm_90a only: wgmma), float32 in and out:
//   wg_gemm_*      C = act(A B + bias), the large products of a reconstruction;
//   wg_drb_layer_* a whole 192-wide local graph convolution of a deformation reasoning block:
//                  out = relu(X W0 + A1 (X W1) + b) (+ residual), the 43 x 43 mixing done on chip.
//
// The products are those of tc_gemm.cu (3xTF32 for the "fp32" mode, one TF32 pass for "tf32"),
// issued as warpgroup MMAs (wgmma.mma_async m64nNk8), which run at about twice the rate mma.sync
// reaches on an H100/H200. The deformation layer also runs with 16-bit operands ("fp16", "bf16"
// modes: X and W rounded to float16 / bfloat16, m64n64k16 MMAs, float32 accumulation; the mixing,
// bias, ReLU and residual stay float32). Built with NVRTC for sm_90a by xmesh/backends/cupy_backend/hopper/; other GPUs
// use tc_gemm.cu and drb_mix_epilogue.
//
// Operands:
//   A: rows of float32 (row stride lda), read as they are. Each warp loads its fragments from shared
//     memory into registers and splits them there (big = tf32(a), small = a - big).
//   B is given prepared by wg_split_weight: transposed to (Np x Kp) "K-major" rows, already split
//     into big and small TF32 parts, zero-padded to whole tiles. The weights of a layer are prepared
//     once; wgmma reads them straight from shared memory through matrix descriptors.
//
// Tiling: each warpgroup (4 warps) computes 64 rows x BN columns; a block of ROWS / 64 warpgroups
// steps through K in slices of 32 that cp.async streams into a STAGES-deep ring. A slice of B
// is stored as BN rows of 128 bytes in the 128-byte swizzle wgmma expects: 16-byte chunk c of row r
// sits at chunk c ^ (r % 8). The tensor cores add into their float32 accumulator with truncation,
// so in the TF32 modes each slice is summed on its own (the first wgmma of a slice starts from zero)
// and added to the thread's accumulator with rounded FADDs, as in tc_gemm.cu.
#include "kernel_select.cuh"

#define WG_BK 32
#define WG_GEMM_STAGES 4   // ring depths (measured best on an H100)
#define WG_DRB_STAGES 3
#define WG_HYP 43        // hypotheses per vertex (the deformation reasoning block's sample graph)

#include "wgmma_common.cuh"

// Bytes of one element of prepared B; B parts per stage.
__host__ __device__ constexpr int wg_b_bytes(int ops) { return wg_half(ops) ? 2 : 4; }
__host__ __device__ constexpr int wg_b_parts(int ops) { return ops == WG_3XTF32 ? 2 : 1; }
// Floats per A row in shared memory: conflict-free fragment loads (single floats at columns t and
// t + 4 for TF32, float2 pairs at 2t and 2t + 8 for the 16-bit modes).
__host__ __device__ constexpr int wg_a_stride(int ops) { return wg_half(ops) ? 40 : 36; }

// Bytes of one ring stage: B big [+ B small] slices (BN rows of 128 bytes; a 16-bit slice fills 64
// of them), then the A slice: float32 rows of wg_a_stride floats, or (a16: A given in 16 bits, read
// by wgmma from shared memory) rows laid out as B's.
__host__ __device__ constexpr int wg_stage_bytes(int ops, int bn, int rows, bool a16 = false) {
    return wg_b_parts(ops) * bn * 128 + (a16 ? rows * 128 : rows * wg_a_stride(ops) * 4);
}

// Row r of prepared B (ldbt elements per row).
template <int OPS>
__device__ __forceinline__ const float* wg_b_row(const float* b, long r, long ldbt) {
    return reinterpret_cast<const float*>(reinterpret_cast<const char*>(b) + r * ldbt * wg_b_bytes(OPS));
}

// Rows of A for the plain GEMM: rows m0 .. m0 + ROWS - 1 of a row-major matrix.
struct WgMatrixRows {
    using Elem = float;
    const float* A;
    long lda;
    int rows_left;
    __device__ const float* operator()(int r) const { return r < rows_left ? A + (long)r * lda : nullptr; }
    __device__ const float* base() const { return A; }
};

// Rows of A for a deformation block layer: X is (B, 43, N, C) hypothesis-major; the tile holds
// VERTS vertices n0 .. n0 + VERTS - 1 of sample b, tile row r = hypothesis (r / VERTS), vertex (r % VERTS).
// T: float, or unsigned short for X in 16 bits (the 16-bit modes' activations between layers).
template <int VERTS, class T = float>
struct WgHypothesisRows {
    using Elem = T;
    const T* X;       // row (b, 0, n0)
    long ldx, plane;  // elements per row; per hypothesis plane (N * ldx)
    int verts_left;
    __device__ const T* operator()(int r) const {
        const int i = r / VERTS, v = r % VERTS;
        return (i < WG_HYP && v < verts_left) ? X + i * plane + v * ldx : nullptr;
    }
    __device__ const T* base() const { return X; }
};

// 16-byte chunks in a row's K slice of A: 8 float32, or 4 in 16 bits.
template <class Rows>
__host__ __device__ constexpr int wg_row_chunks() { return WG_BK * (int)sizeof(typename Rows::Elem) / 16; }

// A thread's A copies of every K slice of a tile, worked out once per tile: copy i (of the tile's
// 16-byte chunks tid + i * THREADS: row r = chunk / C, elements (16 / size) (chunk % C) .., C the
// chunks of a row's slice) reads elements off[i] + k0 .. from rows.base(), or nothing where
// off[i] < 0 (no such row: the tile's row is never stored, so its shared memory may hold anything).
// A slice then costs an add and a cp.async per chunk instead of the row arithmetic.
template <int ROWS, int C = WG_BK / 4>
struct WgRowPlan {
    static constexpr int COPIES = (ROWS * C) / (ROWS * 2);
    int off[COPIES];
};

template <int ROWS, class Rows>
__device__ __forceinline__ WgRowPlan<ROWS, wg_row_chunks<Rows>()> wg_plan(const Rows& rows, int tid) {
    constexpr int C = wg_row_chunks<Rows>();
    WgRowPlan<ROWS, C> plan;
#pragma unroll
    for (int i = 0; i < WgRowPlan<ROWS, C>::COPIES; ++i) {
        const int idx = tid + i * ROWS * 2;
        const auto* row = rows(idx / C);
        plan.off[i] = row != nullptr ? (int)(row - rows.base()) + (idx % C) * (WG_BK / C) : -1;
    }
    return plan;
}

template <bool VEC, int ROWS, int A_STRIDE, class Rows>
__device__ __forceinline__ void wg_load_a32(unsigned as, const Rows& rows, const WgRowPlan<ROWS>& plan,
                                            const float* __restrict__ Bbig, int K, int k0, int tid);

// Copy the K slice [k0, k0 + 32) of the block's A rows, and of the prepared B parts, into one stage.
// With VEC and a whole slice inside K, A comes through the tile's plan; else (a K tail, single-float
// copies) each chunk works out its row and how many of its floats are inside K.
// The B part of wg_load_stage: the prepared parts' slice [k0, k0 + 32) into the stage's first BN * 128
// bytes (each part), copied by THREADS threads.
template <int OPS, int BN, int THREADS>
__device__ __forceinline__ void wg_load_b(unsigned stage, const float* __restrict__ Bbig,
                                          const float* __restrict__ Bsmall, long ldbt, int k0, int tid) {
    constexpr int ROW_CHUNKS = WG_BK * wg_b_bytes(OPS) / 16;   // 16-byte chunks of a B row's slice
    constexpr int B_CHUNKS = BN * ROW_CHUNKS;
#pragma unroll
    for (int i = 0; i < (B_CHUNKS + THREADS - 1) / THREADS; ++i) {
        const int idx = tid + i * THREADS, r = idx / ROW_CHUNKS, c = idx % ROW_CHUNKS;
        if (B_CHUNKS % THREADS != 0 && idx >= B_CHUNKS) break;
        const unsigned dst = stage + r * 128 + ((c ^ (r & 7)) << 4);
        const long off = ((long)r * ldbt + k0) * wg_b_bytes(OPS) + 16 * c;   // bytes
        wg_copy(dst, reinterpret_cast<const float*>(reinterpret_cast<const char*>(Bbig) + off), 16, 16);
        if (OPS == WG_3XTF32)
            wg_copy(dst + BN * 128, reinterpret_cast<const float*>(reinterpret_cast<const char*>(Bsmall) + off), 16, 16);
    }
}

template <int OPS, bool VEC, int BN, int ROWS, class Rows>
__device__ __forceinline__ void wg_load_stage(unsigned stage, const Rows& rows,
                                              const WgRowPlan<ROWS, wg_row_chunks<Rows>()>& plan,
                                              const float* __restrict__ Bbig, const float* __restrict__ Bsmall,
                                              long ldbt, int K, int k0, int tid) {
    constexpr int THREADS = ROWS * 2;
    constexpr int A_STRIDE = wg_a_stride(OPS);
    wg_load_b<OPS, BN, THREADS>(stage, Bbig, Bsmall, ldbt, k0, tid);
    const unsigned as = stage + wg_b_parts(OPS) * BN * 128;
    if constexpr (sizeof(typename Rows::Elem) == 2) {   // 16-bit A: rows of 128 bytes as B's (64 used)
        static_assert(VEC && (ROWS * 4) % THREADS == 0 && (THREADS / 4) % 8 == 0, "16-bit A copies");
        const int r0 = tid / 4, c = tid % 4;
        const unsigned dst = as + r0 * 128 + ((c ^ (r0 & 7)) << 4);   // + i * (THREADS / 4) rows: same swizzle
        if (k0 + WG_BK <= K) {
            const auto* base = rows.base() + k0;
#pragma unroll
            for (int i = 0; i < WgRowPlan<ROWS, 4>::COPIES; ++i)
                if (plan.off[i] >= 0)
                    wg_copy(dst + i * (THREADS / 4) * 128, reinterpret_cast<const float*>(base + plan.off[i]), 16, 16);
        } else {   // K tail: the chunk's elements inside K, zeros after them
#pragma unroll
            for (int i = 0; i < WgRowPlan<ROWS, 4>::COPIES; ++i) {
                if (plan.off[i] < 0) continue;
                const int left = K - (k0 + 8 * c), n = left <= 0 ? 0 : (left >= 8 ? 8 : left);
                wg_copy(dst + i * (THREADS / 4) * 128,
                        n > 0 ? reinterpret_cast<const float*>(rows.base() + plan.off[i] + k0) : Bbig, 16, 2 * n);
            }
        }
    } else {
        wg_load_a32<VEC, ROWS, A_STRIDE>(as, rows, plan, Bbig, K, k0, tid);
    }
}

// The float32 A part of wg_load_stage: rows of wg_a_stride floats.
template <bool VEC, int ROWS, int A_STRIDE, class Rows>
__device__ __forceinline__ void wg_load_a32(unsigned as, const Rows& rows, const WgRowPlan<ROWS>& plan,
                                            const float* __restrict__ Bbig, int K, int k0, int tid) {
    constexpr int THREADS = ROWS * 2;
    static_assert((ROWS * WG_BK / 4) % THREADS == 0, "A copies must divide evenly");
    if (VEC && k0 + WG_BK <= K) {
        const unsigned dst = as + ((tid / (WG_BK / 4)) * A_STRIDE + (tid % (WG_BK / 4)) * 4) * 4;
        const float* base = rows.base() + k0;
#pragma unroll
        for (int i = 0; i < WgRowPlan<ROWS>::COPIES; ++i)   // chunk tid + i * THREADS: THREADS / 8 rows further on
            if (plan.off[i] >= 0) wg_copy(dst + i * (THREADS / (WG_BK / 4)) * A_STRIDE * 4, base + plan.off[i], 16, 16);
        return;
    }
#pragma unroll
    for (int i = 0; i < (ROWS * WG_BK / 4) / THREADS; ++i) {   // 4 consecutive floats of a row per step
        const int idx = tid + i * THREADS;
        const int r = idx / (WG_BK / 4), col = (idx % (WG_BK / 4)) * 4;
        const float* row = rows(r);
        const int left = row != nullptr ? K - (k0 + col) : 0;   // valid floats from here on
        const unsigned dst = as + (r * A_STRIDE + col) * 4;
        if (VEC) {
            const int n = left <= 0 ? 0 : (left >= 4 ? 4 : left);
            wg_copy(dst, n > 0 ? row + k0 + col : Bbig, 16, 4 * n);
        } else {   // single floats (rows not 16-byte aligned)
#pragma unroll
            for (int e = 0; e < 4; ++e) wg_copy(dst + 4 * e, left > e ? row + k0 + col + e : Bbig, 4, left > e ? 4 : 0);
        }
    }
}

// The ring's hand-offs through transaction barriers instead of a block barrier at each K slice (the
// deformation layer's MMA warpgroups, WG_DRB_RING_BARRIERS): full[s] completes once every MMA thread's
// copies into stage s have landed (cp.async.mbarrier.arrive.noinc: each thread's arrival comes with its
// copies, not when it gets there), empty[s] once every MMA warp is past its wgmmas on it. A warpgroup
// then waits only for its slice's copies and, before it copies into a stage, for that stage to be
// free, so the warpgroups drift apart instead of meeting at every slice. A bit per stage says which
// phase each barrier is in for this thread (a stage's first fill waits for nothing).
struct WgRingBarriers {
    unsigned full, empty;   // shared addresses of full[0] and empty[0] (8 bytes a stage)
    unsigned full_phase, empty_phase, filled;
    __device__ void before_fill(int s) {
        if (filled >> s & 1u) {
            wg_mbar_wait(empty + 8 * s, empty_phase >> s & 1u);
            empty_phase ^= 1u << s;
        } else {
            filled |= 1u << s;
        }
    }
    __device__ void after_fill(int s) {
        asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(full + 8 * s) : "memory");
    }
    __device__ void before_use(int s) {
        wg_mbar_wait(full + 8 * s, full_phase >> s & 1u);
        full_phase ^= 1u << s;
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // the copies visible to wgmma
    }
    __device__ void after_use(int s) {   // after the warpgroup's wgmma.wait_group 0 on the stage
        if ((threadIdx.x & 31) == 0) wg_mbar_arrive(empty + 8 * s);
    }
};

// The first STAGES - 1 slices' copies of a block's K loop (wg_mainloop with PROLOGUE = false expects
// them issued: a persistent deformation-layer block starts the next tile's copies as soon as it has
// staged the current tile).
template <int OPS, bool VEC, int BN, int ROWS, int STAGES, class Rows>
__device__ __forceinline__ void wg_prologue(unsigned ring, const Rows& rows,
                                            const WgRowPlan<ROWS, wg_row_chunks<Rows>()>& plan,
                                            const float* __restrict__ Bbig, const float* __restrict__ Bsmall,
                                            long ldbt, int K, WgRingBarriers* bars = nullptr) {
    constexpr int STAGE = wg_stage_bytes(OPS, BN, ROWS, sizeof(typename Rows::Elem) == 2);
    const int ktiles = (K + WG_BK - 1) / WG_BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ktiles) {
            if (bars != nullptr) bars->before_fill(s);
            wg_load_stage<OPS, VEC, BN, ROWS>(ring + s * STAGE, rows, plan, Bbig, Bsmall, ldbt, K, s * WG_BK,
                                              threadIdx.x);
            if (bars != nullptr) bars->after_fill(s);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    }
}

// The K loop of one block: acc (this thread's part of the ROWS x BN tile) = A rows . B columns,
// through a STAGES-deep ring of K slices. TF32 modes sum each slice on its own and add it with FADD
// (float32 rounding, as tc_gemm.cu); the 16-bit modes, whose operands already carry 8-11 bits,
// accumulate the whole K in the tensor cores' accumulator.
// acc[4j + e]: tile row (warp's 16-row slab) + g (+8 for e >= 2), column 8j + 2t (+1 for odd e).
template <int OPS, bool VEC, int BN, int ROWS, int STAGES, class Rows, bool PROLOGUE = true>
__device__ __forceinline__ void wg_mainloop(float (&acc)[BN / 2], unsigned ring, const float* ring_ptr,
                                            const Rows& rows, const WgRowPlan<ROWS, wg_row_chunks<Rows>()>& plan,
                                            const float* __restrict__ Bbig, const float* __restrict__ Bsmall,
                                            long ldbt, int K, WgRingBarriers* bars = nullptr) {
    constexpr bool A16 = sizeof(typename Rows::Elem) == 2;   // A in 16 bits: wgmma reads it from shared memory
    static_assert(!A16 || wg_half(OPS), "16-bit A needs a 16-bit mode");
    constexpr int STAGE = wg_stage_bytes(OPS, BN, ROWS, A16);
    constexpr int A_OFFSET = wg_b_parts(OPS) * BN * 128, A_STRIDE = wg_a_stride(OPS);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = (warp >> 2) * 64 + (warp & 3) * 16;   // this warp's first row in the tile
    const int ktiles = (K + WG_BK - 1) / WG_BK;

    if (PROLOGUE) wg_prologue<OPS, VEC, BN, ROWS, STAGES>(ring, rows, plan, Bbig, Bsmall, ldbt, K, bars);

    float part[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = part[i] = 0.0f;

    for (int kt = 0; kt < ktiles; ++kt) {
        if (bars != nullptr) {
            bars->before_use(kt % STAGES);
        } else {
            asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // copies visible to wgmma
            wg_bar_sync<WG_MMA_BARRIER, ROWS * 2>();   // slice kt is in; every warpgroup is done with slice kt - 1's stage
        }

        // The slice's wgmmas in two halves (K 0-15, 16-31), each issued as soon as its fragments are
        // split or converted; then the copies of slice kt + STAGES - 1 (into slice kt - 1's stage)
        // while they run.
        const unsigned stage = ring + (kt % STAGES) * STAGE;
        const float* as = ring_ptr + ((kt % STAGES) * STAGE + A_OFFSET) / 4 + (row0 + g) * A_STRIDE;
        // TF32: k8 steps s = 0..3, registers rows g / g + 8, columns 8s + t / 8s + t + 4.
        // 16-bit: k16 steps s = 0..1 (a_big[s] packed), columns 16s + 2t, + 1 / 16s + 2t + 8, + 9.
        unsigned a_big[4][4], a_small[4][4];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            if constexpr (A16) {   // this warpgroup's 64 rows of the slice, K 16 * half ..
                if (half == 0) asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
                wg_mma16_ss<OPS>(acc, wg_desc(stage + A_OFFSET + (warp >> 2) * 64 * 128 + 32 * half),
                                 wg_desc(stage + 32 * half), half > 0 || kt > 0);
            } else if constexpr (wg_half(OPS)) {
                const float2 lo = *reinterpret_cast<const float2*>(as + 16 * half + 2 * t);
                const float2 lo8 = *reinterpret_cast<const float2*>(as + 16 * half + 2 * t + 8 * A_STRIDE);
                const float2 hi = *reinterpret_cast<const float2*>(as + 16 * half + 2 * t + 8);
                const float2 hi8 = *reinterpret_cast<const float2*>(as + 16 * half + 2 * t + 8 + 8 * A_STRIDE);
                a_big[half][0] = wg_pack<OPS>(lo.x, lo.y);
                a_big[half][1] = wg_pack<OPS>(lo8.x, lo8.y);
                a_big[half][2] = wg_pack<OPS>(hi.x, hi.y);
                a_big[half][3] = wg_pack<OPS>(hi8.x, hi8.y);
                asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
                wg_mma16<OPS>(acc, a_big[half], wg_desc(stage + 32 * half), half > 0 || kt > 0);
            } else {
#pragma unroll
                for (int s = 2 * half; s < 2 * half + 2; ++s) {
                    wg_split<OPS>(as[8 * s + t], a_big[s][0], a_small[s][0]);
                    wg_split<OPS>(as[8 * s + t + 8 * A_STRIDE], a_big[s][1], a_small[s][1]);
                    wg_split<OPS>(as[8 * s + t + 4], a_big[s][2], a_small[s][2]);
                    wg_split<OPS>(as[8 * s + t + 8 * A_STRIDE + 4], a_big[s][3], a_small[s][3]);
                }
                asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
                for (int s = 2 * half; s < 2 * half + 2; ++s) {
                    const unsigned long long big = wg_desc(stage + 32 * s);
                    wg_mma(part, a_big[s], big, s > 0);
                    if (OPS == WG_3XTF32) {
                        wg_mma(part, a_big[s], wg_desc(stage + BN * 128 + 32 * s), 1);
                        wg_mma(part, a_small[s], big, 1);
                    }
                }
            }
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        const int next = kt + STAGES - 1;
        if (next < ktiles) {
            if (bars != nullptr) bars->before_fill(next % STAGES);
            wg_load_stage<OPS, VEC, BN, ROWS>(ring + (next % STAGES) * STAGE, rows, plan, Bbig, Bsmall, ldbt, K,
                                                 next * WG_BK, tid);
            if (bars != nullptr) bars->after_fill(next % STAGES);
        }
        asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        if (bars != nullptr) bars->after_use(kt % STAGES);
#pragma unroll
        for (int s = 0; s < 4; ++s)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (!A16 && (!wg_half(OPS) || s < 2)) wg_pin(a_big[s][e]);
                if (OPS == WG_3XTF32) wg_pin(a_small[s][e]);
            }
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
            if constexpr (wg_half(OPS)) {   // 16-bit: the tensor cores accumulate the whole K
                wg_pin(acc[i]);
            } else {
                wg_pin(part[i]);
                acc[i] += part[i];
            }
        }
    }
    asm volatile("cp.async.wait_all;\n" ::);
}

// ---------------------------------------------------------------- A in registers, B held
// The training's deformation layers (a module built with WG_DRB_DIRECT_A, for weights prepared with an
// interleaved K) read A from global memory straight into registers and hold every K slice of the
// block's B columns in shared memory for all its tiles (the host launches a multiple of the column
// tiles, so each block keeps one), so that no slice waits on a ring: the warpgroups run apart and the
// layer reads B from L2 once a block instead of once a tile. Thread (g, t) of a warp takes rows g
// and g + 8 of its 16-row slab and floats 8t .. 8t + 7 of each K slice, two 16-byte loads a row;
// wg_interleaved_k orders the prepared weight's K so that these are the columns t and t + 4 of the
// slice's four k8 steps (float 8t + 2s + e of step s, e = 0 for column t, 1 for t + 4).
__host__ __device__ constexpr int wg_interleaved_k(int kk) {
    const int q = kk & ~(WG_BK - 1), s = (kk & (WG_BK - 1)) >> 3, c = kk & 7;
    return q + (c < 4 ? 8 * c + 2 * s : 8 * (c - 4) + 2 * s + 1);
}

// Bytes of one held K slice of B (big and small parts of the block's 64 B columns): slice kt at
// kt * WG_HELD_SLICE.
#define WG_HELD_SLICE (2 * 64 * 128)

// One held K slice's twelve wgmmas (four k8 steps of three products) into part, A's floats split in
// registers (raw: rows g and g + 8, floats 8t .. 8t + 7 of the slice), committed; the fragments are
// left in a_big and a_small, which the wgmmas read until a wait_group retires them.
__device__ __forceinline__ void wg_held_products(float (&part)[32], const float (&raw)[2][8], unsigned stage,
                                                 unsigned (&a_big)[4][4], unsigned (&a_small)[4][4]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int s = 2 * half; s < 2 * half + 2; ++s)
#pragma unroll
            for (int e = 0; e < 4; ++e)   // registers: row g, g + 8 (column t), then the same at t + 4
                wg_split<WG_3XTF32>(raw[e & 1][2 * s + (e >> 1)], a_big[s][e], a_small[s][e]);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 2 * half; s < 2 * half + 2; ++s) {
            const unsigned long long big = wg_desc(stage + 32 * s);
            wg_mma(part, a_big[s], big, s > 0);
            wg_mma(part, a_big[s], wg_desc(stage + 64 * 128 + 32 * s), 1);
            wg_mma(part, a_small[s], big, 1);
        }
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// wg_mainloop for A in registers and B held (3xTF32, BN = 64): `raw` comes holding the tile's first
// slice and leaves holding the first slice of the tile whose rows are `next` (the block's next tile,
// or zeros; X's first row with WHOLE). Each slice's wgmmas run while the next slice's loads are in
// flight.
template <bool VEC, bool WHOLE>
__device__ __forceinline__ void wg_mainloop_direct(float (&acc)[32], float (&raw)[2][8], unsigned held,
                                                   const WgDirectRows& rows, const WgDirectRows& next, int K) {
    const int t = threadIdx.x & 3;
    const int ktiles = (K + WG_BK - 1) / WG_BK;
    float part[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = part[i] = 0.0f;
#pragma unroll 1
    for (int kt = 0; kt < ktiles; ++kt) {
        unsigned a_big[4][4], a_small[4][4];
        wg_held_products(part, raw, held + kt * WG_HELD_SLICE, a_big, a_small);
        if (kt + 1 < ktiles)
            wg_direct_load<VEC, WHOLE>(raw, rows, (kt + 1) * WG_BK + 8 * t, K);
        else
            wg_direct_load<VEC, WHOLE>(raw, next, 8 * t, K);
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        wg_end_slice(a_big, a_small, part, acc);
    }
}

// A's K slices through shared memory (the held forward built with WG_DRB_STREAMED): the block's
// slices q = 0, 1, ... (its tiles' K slices in order) land in WG_DRB_SLOTS slots of a tile's 172 rows
// of 128 bytes (the Tensor Memory Accelerator's 128-byte swizzle: row r's 16-byte chunk c at chunk
// c ^ (r % 8)), slice q in slot q % WG_DRB_SLOTS. A slot's full barrier completes when its box has
// landed, its empty barrier when every MMA warp has read its fragments. Rows 172-191 of the third
// warpgroup read past the box: their products land in tile rows the epilogue never reads.
#define WG_DRB_SLOTS 3
#define WG_DRB_BOX_BYTES (WG_HYP * WG_DRB_VERTS * 128)   // 172 rows of 32 floats
#define WG_DRB_SLOT_BYTES (22 * 1024)                    // the box, 1024-byte aligned (the swizzle's period)

// This thread's rows g and g + 8 (tile rows r, r + 8), floats 8t .. 8t + 7, of slice q, once its slot
// is full; then the warp's arrival on the slot's empty barrier.
__device__ __forceinline__ void wg_slot_fetch(float (&raw)[2][8], const unsigned char* slots, unsigned full,
                                              unsigned empty, int q, int r) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, s = q % WG_DRB_SLOTS;
    wg_mbar_wait(full + 8 * s, (q / WG_DRB_SLOTS) & 1);
    const unsigned char* slot = slots + s * WG_DRB_SLOT_BYTES;
#pragma unroll
    for (int h = 0; h < 2; ++h) {   // (r + 8 h) % 8 == g
        const unsigned char* row = slot + (r + 8 * h) * 128;
        const float4 lo = *reinterpret_cast<const float4*>(row + (((2 * t) ^ g) << 4));
        const float4 hi = *reinterpret_cast<const float4*>(row + (((2 * t + 1) ^ g) << 4));
        raw[h][0] = lo.x, raw[h][1] = lo.y, raw[h][2] = lo.z, raw[h][3] = lo.w;
        raw[h][4] = hi.x, raw[h][5] = hi.y, raw[h][6] = hi.z, raw[h][7] = hi.w;
    }
    __syncwarp();
    if (lane == 0) wg_mbar_arrive(empty + 8 * s);
}

// wg_mainloop_direct with A's slices from the slots: `raw` comes holding slice q's fragments and leaves
// holding the next tile's first (slice q + ktiles), q advanced past the tile; the producer warpgroup
// refills the slots.
__device__ __forceinline__ void wg_mainloop_streamed(float (&acc)[32], float (&raw)[2][8], unsigned held,
                                                     const unsigned char* slots, unsigned full, unsigned empty,
                                                     int& q, int total, int ktiles, int r) {
    float part[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = part[i] = 0.0f;
#pragma unroll 1
    for (int kt = 0; kt < ktiles; ++kt, ++q) {
        unsigned a_big[4][4], a_small[4][4];
        wg_held_products(part, raw, held + kt * WG_HELD_SLICE, a_big, a_small);
        if (q + 1 < total) wg_slot_fetch(raw, slots, full, empty, q + 1, r);
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        wg_end_slice(a_big, a_small, part, acc);
    }
}

// The ring, aligned to 1024 bytes (the 128-byte swizzle repeats every 1024 bytes).
#define WG_RING                                                                                        \
    extern __shared__ float4 wg_shared[];                                                             \
    const unsigned raw = wg_smem(wg_shared);                                                          \
    const unsigned ring = (raw + 1023u) & ~1023u;                                                     \
    float* ring_ptr = reinterpret_cast<float*>(reinterpret_cast<char*>(wg_shared) + (ring - raw));

// ---------------------------------------------------------------- C = act(A B + bias)
// 128 x 128 tiles, 2 warpgroups. Dynamic shared memory: WG_GEMM_STAGES * wg_stage_bytes(P, 128, 128) + 1024.
template <int OPS, bool VEC>
__device__ __forceinline__ void wg_gemm(const float* __restrict__ A, long lda, const float* __restrict__ Bbig,
                                        const float* __restrict__ Bsmall, long ldbt, float* __restrict__ C,
                                        long ldc, int M, int N, int K, const float* __restrict__ bias, int relu) {
    WG_RING
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tiles_n = (N + 127) / 128;
    const int m0 = (int)(blockIdx.x / tiles_n) * 128, n0 = (int)(blockIdx.x % tiles_n) * 128;
    float acc[64];
    const WgMatrixRows rows{A + (long)m0 * lda, lda, M - m0};
    wg_mainloop<OPS, VEC, 128, 128, WG_GEMM_STAGES>(acc, ring, ring_ptr, rows, wg_plan<128>(rows, threadIdx.x),
                                                    Bbig + (long)n0 * ldbt,
                                                       Bsmall + (long)n0 * ldbt, ldbt, K);

    const int row0 = (warp >> 2) * 64 + (warp & 3) * 16;
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

#define WG_GEMM_KERNEL(NAME, OPS, VEC)                                                                 \
    XM_KERNEL(NAME) void __launch_bounds__(256) NAME(                                                      \
        const float* A, long lda, const float* Bbig, const float* Bsmall, long ldbt, float* C, long ldc,  \
        int M, int N, int K, const float* bias, int relu) {                                              \
        wg_gemm<OPS, VEC>(A, lda, Bbig, Bsmall, ldbt, C, ldc, M, N, K, bias, relu);                    \
    }

// Names: wg_gemm_<passes>x_<v: 16-byte copies of A (lda % 4 == 0, A 16-byte aligned) | s: single floats>
#ifndef WG_MIX_SPARSE   // a module built for one A1 (below) holds only the deformation-layer kernels
WG_GEMM_KERNEL(wg_gemm_3x_v, WG_3XTF32, true)
WG_GEMM_KERNEL(wg_gemm_3x_s, WG_3XTF32, false)
WG_GEMM_KERNEL(wg_gemm_1x_v, WG_TF32, true)
WG_GEMM_KERNEL(wg_gemm_1x_s, WG_TF32, false)
#endif

// ---------------------------------------------------------------- a deformation block layer
// out[b,i,n,c] = relu((y0[b,i,n,c] + sum_j A1[i,j] y1[b,j,n,c]) + bias[c]) (+ res[b,i,n,c]), where
// y0 = X W0 and y1 = X W1 (X: (B, 43, N, cin), out and res: (B, 43, N, cout)), the same arithmetic as
// tc_gemm + drb_mix_epilogue. A tile is WG_DRB_VERTS = 4 vertices (172 of its 192 rows) and 32
// output columns c0 .. c0 + 31: its 64 B columns are W0's and W1's columns c0 .. c0 + 31 (the weight
// is prepared with wg_split_weight's pairing).
//
// A block is warp-specialized: three MMA warpgroups run the tile's K loop, put y0 and y1 into the
// shared staging tiles and go on to the next tile; the epilogue warpgroup meanwhile mixes the tile
// staged before, a thread per (vertex, column) going through the 43 hypotheses, and writes it
// out; it copies the tile's residuals into shared memory (cp.async) before it waits for the tile. They hand the staging over through two named barriers (WG_STAGING_FULL, WG_STAGING_FREE),
// so the mixing, the residual loads and the stores run beside the next tile's tensor-core work.
// setmaxnreg gives the MMA warpgroups the registers the epilogue warpgroup does not need.
//
// Two ways to mix. By default A1 comes as a kernel argument and every sum runs over j = 0..42.
// With WG_MIX_SPARSE defined, the module was built for one A1 (hopper.mixing_source puts
// wg_mix_sparse before this file): the sums skip A1's zeros (the template's A1 has 367 of 1849
// entries) and its values are immediates. Skipping the zero terms of an fmaf chain leaves every
// result bit for bit as the dense sum gives it.
//
// A module built with WG_DRB_ACTIVATION defined (the training's forward) takes one more argument,
// `activation` (or null): in float32 it also gets the values before the residual, so a skip
// connection's ReLU output, its backward's mask, is kept while the sum goes on to the next layer.
//
// A module built with WG_DRB_LINEAR defined leaves the ReLU out: X W0 + A1 (X W1) + b, which with
// X = dZ, [W0^T | W1^T] and A1^T is the layer's input gradient in the training's backward pass.
// WG_DRB_GRADIENT (with WG_DRB_LINEAR and WG_MIX_SPARSE) builds wg_drb_layer_3x_v_grad, which carries
// that gradient on through the layer before: dz = out where its ReLU output (mask) is positive, written
// to dy[.., :cout], A1^T dz to dy[.., cout:] and dz summed over the hypotheses to sums (B, N, cout),
// the sums of epilogues_cupy.relu_gradient_mixed in its order; out itself only where asked (not null).
// It takes no bias: +0.0 is added in its place, the values of a zero bias.
// Its staging drops A1 and the tiles' padding rows and holds the mask's tile beside the residual's.
#define WG_DRB_VERTS 4
#define WG_DRB_ROWS 192
#define WG_DRB_MMA_THREADS (2 * WG_DRB_ROWS)             // 3 MMA warpgroups
#define WG_DRB_HANDOVER_THREADS (WG_DRB_MMA_THREADS + 128)   // + the epilogue warpgroup: the staging's barriers
#ifdef WG_DRB_STREAMED   // + a producer warpgroup, one thread of which copies A's slices
#define WG_DRB_THREADS (WG_DRB_HANDOVER_THREADS + 128)
#else
#define WG_DRB_THREADS WG_DRB_HANDOVER_THREADS
#endif
#ifdef WG_DRB_STREAMED
#define WG_DRB_MMA_REGS 128   // 3 * 128 + 72 + 24 = 5 * 96, the registers a 640-thread block starts with
#define WG_DRB_EPILOGUE_REGS 72
#define WG_DRB_PRODUCER_REGS 24
#else
#define WG_DRB_MMA_REGS 144                              // 3 * 144 + 80 = 4 * 128 registers per thread
#define WG_DRB_EPILOGUE_REGS 80
#endif
#define WG_Y_STRIDE_FULL 40   // floats per row of the y tiles in shared memory: conflict-free float2 stores
#define WG_Y_STRIDE_LEAN 36   // the lean staging's (two-way conflicts on those stores, 5.5 KB less a block)
#define WG_A1_STRIDE 44

// Shared memory after the ring: the y0 and y1 tiles (WG_DRB_ROWS rows of WG_Y_STRIDE_FULL floats
// each), the residual tile (WG_DRB_TILE_ROWS rows of 32 floats) and A1 (43 rows of WG_A1_STRIDE floats);
// WG_DRB_GRADIENT's: the y tiles' WG_DRB_TILE_ROWS rows, the residual's and the mask's tiles. A module
// built with WG_DRB_LEAN (a forward without a residual whose held weight leaves room for no more: the
// block's first layer) stages the y tiles' WG_DRB_TILE_ROWS rows alone, WG_Y_STRIDE_LEAN floats apart.
#define WG_DRB_TILE_ROWS (WG_HYP * WG_DRB_VERTS)   // the tile's rows that hold hypotheses (172 of 192)
// Either ends with the ring's barriers (WgRingBarriers: full and empty, 8 bytes each a stage).
#define WG_DRB_BARRIER_BYTES 64
#define WG_DRB_STAGING_BYTES ((2 * WG_DRB_ROWS * WG_Y_STRIDE_FULL + WG_DRB_TILE_ROWS * 32 + WG_HYP * WG_A1_STRIDE) * 4 + WG_DRB_BARRIER_BYTES)
#define WG_DRB_GRADIENT_STAGING_BYTES ((2 * WG_DRB_TILE_ROWS * WG_Y_STRIDE_FULL + 2 * WG_DRB_TILE_ROWS * 32) * 4 + WG_DRB_BARRIER_BYTES)
#define WG_DRB_LEAN_STAGING_BYTES (2 * WG_DRB_TILE_ROWS * WG_Y_STRIDE_LEAN * 4 + WG_DRB_BARRIER_BYTES)
#if defined(WG_DRB_DIRECT_A) && !defined(WG_DRB_GRADIENT) && !(defined(WG_DRB_OPS) && WG_DRB_OPS == WG_3XTF32)
#error "WG_DRB_DIRECT_A (A in registers, B held) needs the 3xTF32 mode's module (WG_DRB_OPS 3)"
#endif
#if defined(WG_DRB_STREAMED) && !(defined(WG_DRB_DIRECT_A) && defined(WG_DRB_LEAN) && !defined(WG_DRB_GRADIENT))
#error "WG_DRB_STREAMED streams A to a held forward: it needs WG_DRB_DIRECT_A and WG_DRB_LEAN's staging"
#endif
#ifdef WG_DRB_GRADIENT
#if !defined(WG_DRB_LINEAR) || !defined(WG_MIX_SPARSE)
#error "WG_DRB_GRADIENT carries the input gradient: it needs WG_DRB_LINEAR and one A1's WG_MIX_SPARSE"
#endif
#define WG_Y_ROWS WG_DRB_TILE_ROWS
#define WG_Y_STRIDE WG_Y_STRIDE_FULL
#define WG_DRB_THIS_STAGING_BYTES WG_DRB_GRADIENT_STAGING_BYTES
#define WG_DRB_CARRIES true
#elif defined(WG_DRB_LEAN)
#if !defined(WG_MIX_SPARSE)
#error "WG_DRB_LEAN stages no A1: it needs one A1's WG_MIX_SPARSE"
#endif
#define WG_Y_ROWS WG_DRB_TILE_ROWS
#define WG_Y_STRIDE WG_Y_STRIDE_LEAN
#define WG_DRB_THIS_STAGING_BYTES WG_DRB_LEAN_STAGING_BYTES
#define WG_DRB_CARRIES false
#else
#define WG_Y_ROWS WG_DRB_ROWS
#define WG_Y_STRIDE WG_Y_STRIDE_FULL
#define WG_DRB_THIS_STAGING_BYTES WG_DRB_STAGING_BYTES
#define WG_DRB_CARRIES false
#endif

// Activations in and out (the kernels' template parameter IO): WG_IO_F32 X, out and residual float32;
// the 16-bit modes also store their layers' outputs (and so read the residual) in 16 bits, from a
// float32 X (WG_IO_TO16: the block's first layer, which reads the local projection) or a 16-bit X
// (WG_IO_16: the layers after it; wgmma then reads X from shared memory as it reads B).
#define WG_IO_F32 0
#define WG_IO_TO16 1
#define WG_IO_16 2
template <bool HALF> struct WgActivation { using type = float; };
template <> struct WgActivation<true> { using type = unsigned short; };

// A persistent block (the host launches one per multiprocessor) takes tiles blockIdx.x,
// blockIdx.x + gridDim.x, ... of (sample, vertex tile, column tile), columns fastest. The next
// tile's first copies start as soon as a tile is staged.
template <int OPS, bool VEC, int IO>
__device__ __forceinline__ void wg_drb_layer(const float* __restrict__ Xf, long ldx, int cin, const float* __restrict__ Bbig,
                                             const float* __restrict__ Bsmall, long ldbt,
                                             const float* __restrict__ a1, const float* __restrict__ bias,
                                             const float* __restrict__ res_f, float* __restrict__ out_f, int N,
                                             int cout, int tiles, const float* __restrict__ mask = nullptr,
                                             float* __restrict__ dy = nullptr, float* __restrict__ sums = nullptr,
                                             float* __restrict__ activation = nullptr,
                                             const WgTensorMap* xmap = nullptr) {
    static_assert(IO == WG_IO_F32 || wg_half(OPS), "16-bit activations belong to the 16-bit modes");
    using XT = typename WgActivation<IO == WG_IO_16>::type;   // X's elements
    using OT = typename WgActivation<IO != WG_IO_F32>::type;  // out's and the residual's
    const XT* __restrict__ X = reinterpret_cast<const XT*>(Xf);
    const OT* __restrict__ res = reinterpret_cast<const OT*>(res_f);
    OT* __restrict__ out = reinterpret_cast<OT*>(out_f);
    WG_RING
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int col_tiles = cout / 32, vert_tiles = (N + WG_DRB_VERTS - 1) / WG_DRB_VERTS;
#ifdef WG_DRB_DIRECT_A   // the held B slices in the ring's place
    const unsigned held = ring;
    float* y0s = ring_ptr + (cin + WG_BK - 1) / WG_BK * WG_HELD_SLICE / 4;
#ifdef WG_DRB_STREAMED   // A's slots between the held slices and the staging
    const unsigned char* slots = reinterpret_cast<const unsigned char*>(y0s);
    y0s += WG_DRB_SLOTS * WG_DRB_SLOT_BYTES / 4;
#endif
#else
    float* y0s = ring_ptr + WG_DRB_STAGES * wg_stage_bytes(OPS, 64, WG_DRB_ROWS, IO == WG_IO_16) / 4;
#endif
    float* y1s = y0s + WG_Y_ROWS * WG_Y_STRIDE;
    float* r_s = y1s + WG_Y_ROWS * WG_Y_STRIDE;
    float* m_s = r_s + WG_DRB_TILE_ROWS * 32;   // WG_DRB_GRADIENT's mask tile
#ifndef WG_MIX_SPARSE
    float* a1s = r_s + WG_DRB_TILE_ROWS * 32;
    for (int i = threadIdx.x; i < WG_HYP * WG_HYP; i += WG_DRB_THREADS)
        a1s[(i / WG_HYP) * WG_A1_STRIDE + i % WG_HYP] = a1[i];
#endif
    const unsigned full = wg_smem(y0s) + WG_DRB_THIS_STAGING_BYTES - WG_DRB_BARRIER_BYTES;
    const unsigned empty = full + 8 * WG_DRB_STAGES;
#ifdef WG_DRB_STREAMED
    constexpr unsigned copies = 1;   // a slot's box, one copy
    static_assert(WG_DRB_SLOTS <= WG_DRB_STAGES, "the slots' barriers are the ring's");
#else
    constexpr unsigned copies = WG_DRB_MMA_THREADS;   // every MMA thread's copies
#endif
    if (threadIdx.x == 0) {
        for (int s = 0; s < WG_DRB_STAGES; ++s) {
            wg_mbar_init(full + 8 * s, copies);
            wg_mbar_init(empty + 8 * s, WG_DRB_MMA_THREADS / 32);   // every MMA warp done with the stage
        }
        wg_mbar_init_fence();
    }
    __syncthreads();
    // tile -> sample b, first vertex n0, first output column c0
    auto origin = [&](int tile, long& b, int& n0, int& c0) {
        c0 = (tile % col_tiles) * 32;
        n0 = ((tile / col_tiles) % vert_tiles) * WG_DRB_VERTS;
        b = tile / ((long)col_tiles * vert_tiles);
    };

#ifdef WG_DRB_STREAMED
    const int ktiles = (cin + WG_BK - 1) / WG_BK;
    const int total = (tiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x * ktiles;   // the block's slices
    if (threadIdx.x >= WG_DRB_HANDOVER_THREADS) {   // ---- the producer warpgroup
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(WG_DRB_PRODUCER_REGS));
        if (threadIdx.x == WG_DRB_HANDOVER_THREADS)   // slice q's box into slot q % WG_DRB_SLOTS once it is free
            for (int q = 0; q < total; ++q) {
                const int s = q % WG_DRB_SLOTS;
                if (q >= WG_DRB_SLOTS) wg_mbar_wait(empty + 8 * s, (q / WG_DRB_SLOTS - 1) & 1);
                long b;
                int n0, c0;
                origin((int)blockIdx.x + q / ktiles * (int)gridDim.x, b, n0, c0);
                wg_tensor_copy_3d(wg_smem(slots) + s * WG_DRB_SLOT_BYTES, *xmap, q % ktiles * WG_BK, n0,
                                  (int)(b * WG_HYP), full + 8 * s, WG_DRB_BOX_BYTES);
            }
        return;
    }
#endif
    if (threadIdx.x < WG_DRB_MMA_THREADS) {   // ---- MMA warpgroups
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(WG_DRB_MMA_REGS));
        const long plane_in = (long)N * ldx;
        const int g = lane >> 2, t = lane & 3;
        const int row0 = (warp >> 2) * 64 + (warp & 3) * 16;
        using Rows = WgHypothesisRows<WG_DRB_VERTS, XT>;
        auto tile_rows = [&](long b, int n0) {
            return Rows{X + b * WG_HYP * plane_in + (long)n0 * ldx, ldx, plane_in, N - n0};
        };
#ifdef WG_DRB_DIRECT_A
        static_assert(OPS == WG_3XTF32 && IO == WG_IO_F32, "A in registers: the 3xTF32 float32 layers");
        // A forward's whole K slices of 16-byte aligned rows (the 192-wide layers): the loads take no
        // branch, a padding row (or one past the last tile) reading X's first row instead of zeros. Its
        // products land in tile rows the epilogue never reads (rows past the 172 hypothesis rows,
        // vertices past N), each output row depending on its own A row alone. The carried gradient's
        // kernel measured no faster so (7.58-7.69 ms against 7.44-7.46 at batch 32) and the lean
        // module (339 inputs) has no whole slices: both keep the checked loads.
        float raw[2][8];
#ifdef WG_DRB_STREAMED
        int q = 0;   // the slice whose fragments raw holds
#else
#if defined(WG_DRB_LEAN)
        constexpr bool whole = false;
#else
        const bool whole = !WG_DRB_CARRIES && VEC && cin % WG_BK == 0;
#endif
        auto direct_rows = [&](int tile) {   // the thread's rows of a tile (none past the last tile)
            WgDirectRows r{{nullptr, nullptr}};
            if (tile < tiles) {
                long b;
                int n0, c0;
                origin(tile, b, n0, c0);
                r.row[0] = tile_rows(b, n0)(row0 + g);
                r.row[1] = tile_rows(b, n0)(row0 + g + 8);
            }
            if (whole)
                for (int h = 0; h < 2; ++h)
                    if (r.row[h] == nullptr) r.row[h] = reinterpret_cast<const float*>(X);
            return r;
        };
        WgDirectRows rows_now = direct_rows(blockIdx.x);
        wg_direct_load<VEC>(raw, rows_now, 8 * t, cin);
#endif
        {   // every K slice of the block's B columns, once
            long b;
            int n0, c0;
            origin(blockIdx.x, b, n0, c0);
            for (int kt = 0; kt * WG_BK < cin; ++kt)
                wg_load_b<OPS, 64, WG_DRB_MMA_THREADS>(held + kt * WG_HELD_SLICE, wg_b_row<OPS>(Bbig, 2 * c0, ldbt),
                                                       wg_b_row<OPS>(Bsmall, 2 * c0, ldbt), ldbt, kt * WG_BK,
                                                       threadIdx.x);
            asm volatile("cp.async.commit_group;\n" ::);
            asm volatile("cp.async.wait_all;\n" ::);
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // the copies visible to wgmma
            wg_bar_sync<WG_MMA_BARRIER, WG_DRB_MMA_THREADS>();
        }
#ifdef WG_DRB_STREAMED
        if (total > 0) wg_slot_fetch(raw, slots, full, empty, 0, row0 + g);
#endif
#else
        WgRingBarriers bars{full, empty, 0u, 0u, 0u};
        WgRowPlan<WG_DRB_ROWS, wg_row_chunks<Rows>()> plan;   // of the tile whose copies are under way
        auto start_copies = [&](int tile) {
            long b;
            int n0, c0;
            origin(tile, b, n0, c0);
            plan = wg_plan<WG_DRB_ROWS>(tile_rows(b, n0), threadIdx.x);
            wg_prologue<OPS, VEC, 64, WG_DRB_ROWS, WG_DRB_STAGES>(ring, tile_rows(b, n0), plan,
                                                                  wg_b_row<OPS>(Bbig, 2 * c0, ldbt),
                                                                  wg_b_row<OPS>(Bsmall, 2 * c0, ldbt), ldbt, cin, &bars);
        };
        start_copies(blockIdx.x);
#endif
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            long b;
            int n0, c0;
            origin(tile, b, n0, c0);
            float acc[32];
#if defined(WG_DRB_STREAMED)
            wg_mainloop_streamed(acc, raw, held, slots, full, empty, q, total, ktiles, row0 + g);
#elif defined(WG_DRB_DIRECT_A)
            const WgDirectRows rows_next = direct_rows(tile + gridDim.x);
            if (whole)   // whole implies VEC; WHOLE = VEC keeps the unreached VEC = false form compiling
                wg_mainloop_direct<VEC, VEC>(acc, raw, held, rows_now, rows_next, cin);
            else
                wg_mainloop_direct<VEC, false>(acc, raw, held, rows_now, rows_next, cin);
            rows_now = rows_next;
#else
            wg_mainloop<OPS, VEC, 64, WG_DRB_ROWS, WG_DRB_STAGES, Rows, false>(
                acc, ring, ring_ptr, tile_rows(b, n0), plan, wg_b_row<OPS>(Bbig, 2 * c0, ldbt),
                wg_b_row<OPS>(Bsmall, 2 * c0, ldbt), ldbt, cin, &bars);
#endif
            // Every MMA warpgroup is past its last wgmma (the ring is free) and the epilogue warpgroup
            // is done with the previous tile: stage y0 (tile columns 0..31) and y1 (32..63), hand the
            // tile over, start the next tile's copies.
            wg_bar_sync<WG_STAGING_FREE, WG_DRB_HANDOVER_THREADS>();
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    if (WG_Y_ROWS < WG_DRB_ROWS && row0 + g + 8 * h >= WG_Y_ROWS) continue;   // padding rows
                    float* dst = (j < 4 ? y0s : y1s) + (row0 + g + 8 * h) * WG_Y_STRIDE + 8 * (j & 3) + 2 * t;
                    *reinterpret_cast<float2*>(dst) = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
                }
            wg_bar_arrive<WG_STAGING_FULL, WG_DRB_HANDOVER_THREADS>();
#ifndef WG_DRB_DIRECT_A
            if (tile + (int)gridDim.x < tiles) start_copies(tile + gridDim.x);
#endif
        }
    } else {   // ---- the epilogue warpgroup: thread (vertex v, column c) of each staged tile
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(WG_DRB_EPILOGUE_REGS));
        const long plane_out = (long)N * cout;
        const int et = threadIdx.x - WG_DRB_MMA_THREADS;
        const int v = et >> 5, c = lane;
        const unsigned rs = wg_smem(r_s);
        wg_bar_arrive<WG_STAGING_FREE, WG_DRB_HANDOVER_THREADS>();   // the staging starts free
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            long b;
            int n0, c0;
            origin(tile, b, n0, c0);
            const long o0 = b * WG_HYP * plane_out + (long)n0 * cout + c0;   // (hypothesis 0, vertex n0, column c0)
            // The tile's residuals into r_s (row i * 4 + v, 32 floats) and WG_DRB_GRADIENT's mask into
            // m_s, while the MMA runs.
            constexpr bool GRADIENT = WG_DRB_CARRIES;
            const bool staged = res != nullptr || GRADIENT;
            if (staged) {
                wg_bar_sync<WG_EPILOGUE_BARRIER, 128>();   // every epilogue thread is done with the previous tile's
                constexpr int CHUNKS = 32 * (int)sizeof(OT) / 16;   // of a residual row's 32 columns
                for (int q = et; q < WG_DRB_TILE_ROWS * CHUNKS; q += 128) {
                    const int r = q / CHUNKS, chunk = q % CHUNKS, i = r / WG_DRB_VERTS, rv = r % WG_DRB_VERTS;
                    const bool in = n0 + rv < N;
                    const long at = o0 + i * plane_out + (long)rv * cout + (16 / sizeof(OT)) * chunk;
                    if (res != nullptr)
                        wg_copy(rs + r * 32 * sizeof(OT) + chunk * 16,
                                reinterpret_cast<const float*>(in ? res + at : res), 16, in ? 16 : 0);
                    if (GRADIENT)
                        wg_copy(rs + (WG_DRB_TILE_ROWS * 32 + r * 32) * 4 + chunk * 16, in ? mask + at : mask, 16,
                                in ? 16 : 0);
                }
                asm volatile("cp.async.commit_group;\n" ::);
            }
            const float bc = GRADIENT ? 0.0f : bias[c0 + c];   // the gradient's bias: +0, as a zero one's
            wg_bar_sync<WG_STAGING_FULL, WG_DRB_HANDOVER_THREADS>();
            if (staged) {
                asm volatile("cp.async.wait_all;\n" ::);
                wg_bar_sync<WG_EPILOGUE_BARRIER, 128>();
            }
            if (n0 + v < N) {
                float y1[WG_HYP];
#pragma unroll
                for (int j = 0; j < WG_HYP; ++j) y1[j] = y1s[(j * WG_DRB_VERTS + v) * WG_Y_STRIDE + c];
                OT* dst = out + o0 + (long)v * cout + c;
                // WG_DRB_GRADIENT's dy row (b, hypothesis 0, vertex n0 + v) of 2 cout floats, column c0 + c
                float* dyv = GRADIENT ? dy + 2 * (o0 - c0 + (long)v * cout) + c0 + c : nullptr;
                float dz_sum = 0.0f;
#pragma unroll
                for (int i = 0; i < WG_HYP; ++i) {
#ifdef WG_MIX_SPARSE
                    const float mix = wg_mix_sparse(i, y1);
#else
                    float mix = 0.0f;   // over j = 0..42 in order
#pragma unroll
                    for (int j4 = 0; j4 < WG_HYP; j4 += 4) {   // A1 read 4 at a time (rows of 44 floats, 16-byte aligned)
                        const float4 a = *reinterpret_cast<const float4*>(a1s + i * WG_A1_STRIDE + j4);
                        mix = fmaf(a.x, y1[j4], mix);
                        if (j4 + 1 < WG_HYP) mix = fmaf(a.y, y1[j4 + 1], mix);
                        if (j4 + 2 < WG_HYP) mix = fmaf(a.z, y1[j4 + 2], mix);
                        if (j4 + 3 < WG_HYP) mix = fmaf(a.w, y1[j4 + 3], mix);
                    }
#endif
                    float val = __fadd_rn(__fadd_rn(y0s[(i * WG_DRB_VERTS + v) * WG_Y_STRIDE + c], mix), bc);
#ifndef WG_DRB_LINEAR
                    val = fmaxf(val, 0.0f);
#endif
                    if constexpr (IO == WG_IO_F32) {
                        if (activation != nullptr) activation[o0 + (long)v * cout + c + i * plane_out] = val;
                        if (res != nullptr) val = __fadd_rn(val, r_s[(i * WG_DRB_VERTS + v) * 32 + c]);
                        if (!GRADIENT || out != nullptr) dst[i * plane_out] = val;
                        if constexpr (GRADIENT) {   // dz for the layer before, kept in y0's place for its mixing
                            const float dz = m_s[(i * WG_DRB_VERTS + v) * 32 + c] > 0.0f ? val : 0.0f;
                            dyv[i * 2 * plane_out] = dz;
                            y0s[(i * WG_DRB_VERTS + v) * WG_Y_STRIDE + c] = dz;
                            dz_sum += dz;
                        }
                    } else {   // residual and output in the mode's 16 bits, the sum in float32
                        if (res != nullptr)
                            val = __fadd_rn(val, wg_widen16<OPS>(reinterpret_cast<const OT*>(r_s)[(i * WG_DRB_VERTS + v) * 32 + c]));
                        dst[i * plane_out] = (OT)(wg_pack<OPS>(val, 0.0f) & 0xffffu);
                    }
                }
#ifdef WG_DRB_GRADIENT
#pragma unroll
                for (int j = 0; j < WG_HYP; ++j) y1[j] = y0s[(j * WG_DRB_VERTS + v) * WG_Y_STRIDE + c];
#pragma unroll
                for (int i = 0; i < WG_HYP; ++i) dyv[i * 2 * plane_out + cout] = wg_mix_sparse(i, y1);
                sums[(b * N + n0 + v) * (long)cout + c0 + c] = dz_sum;
#endif
            }
            if (tile + (int)gridDim.x < tiles) wg_bar_arrive<WG_STAGING_FREE, WG_DRB_HANDOVER_THREADS>();
        }
    }
}

#ifdef WG_DRB_ACTIVATION
#define WG_DRB_ACTIVATION_PARAM , float* activation
#define WG_DRB_ACTIVATION_VALUE activation
#else
#define WG_DRB_ACTIVATION_PARAM
#define WG_DRB_ACTIVATION_VALUE nullptr
#endif
#define WG_DRB_KERNEL(NAME, OPS, VEC, IO)                                                              \
    XM_KERNEL(NAME) void __launch_bounds__(WG_DRB_THREADS, 1) NAME(                                        \
        const float* X, long ldx, int cin, const float* Bbig, const float* Bsmall, long ldbt,              \
        const float* a1,                                                                                  \
        const float* bias, const float* res, float* out, int N, int cout, int tiles WG_DRB_ACTIVATION_PARAM) { \
        wg_drb_layer<OPS, VEC, IO>(X, ldx, cin, Bbig, Bsmall, ldbt, a1, bias, res, out, N, cout, tiles,  \
                                   nullptr, nullptr, nullptr, WG_DRB_ACTIVATION_VALUE);                  \
    }

// Names: wg_drb_layer_<3x | 1x | f16 | bf16>_<v: ldx % 4 == 0, X 16-byte aligned | s>, and in the
// 16-bit modes ..._<v | s>_o16 (WG_IO_TO16) and ..._h16 (WG_IO_16: ldx % 8 == 0, X 16-byte aligned).
// A module built with WG_DRB_OPS defined (the hopper package puts it in the prelude) holds that mode's
// alone; one built with WG_DRB_GRADIENT, wg_drb_layer_3x_v_grad alone.
#ifdef WG_DRB_GRADIENT
XM_KERNEL(wg_drb_layer_3x_v_grad) void __launch_bounds__(WG_DRB_THREADS, 1) wg_drb_layer_3x_v_grad(
    const float* X, long ldx, int cin, const float* Bbig, const float* Bsmall, long ldbt, const float* res,
    const float* mask, float* out, float* dy, float* sums, int N, int cout, int tiles) {
    wg_drb_layer<WG_3XTF32, true, WG_IO_F32>(X, ldx, cin, Bbig, Bsmall, ldbt, nullptr, nullptr, res, out, N, cout,
                                             tiles, mask, dy, sums);
}
#elif defined(WG_DRB_STREAMED)   // X also through a tensor map of boxes of 32 columns x 4 vertices x 43 hypotheses
XM_KERNEL(wg_drb_layer_3x_v_streamed) void __launch_bounds__(WG_DRB_THREADS, 1) wg_drb_layer_3x_v_streamed(
    const __grid_constant__ WgTensorMap xmap, const float* X, long ldx, int cin, const float* Bbig,
    const float* Bsmall, long ldbt, const float* a1, const float* bias, const float* res, float* out, int N,
    int cout, int tiles WG_DRB_ACTIVATION_PARAM) {
    wg_drb_layer<WG_3XTF32, true, WG_IO_F32>(X, ldx, cin, Bbig, Bsmall, ldbt, a1, bias, res, out, N, cout, tiles,
                                             nullptr, nullptr, nullptr, WG_DRB_ACTIVATION_VALUE, &xmap);
}
#else
#if !defined(WG_DRB_OPS) || WG_DRB_OPS == WG_3XTF32
WG_DRB_KERNEL(wg_drb_layer_3x_v, WG_3XTF32, true, WG_IO_F32)
WG_DRB_KERNEL(wg_drb_layer_3x_s, WG_3XTF32, false, WG_IO_F32)
#endif
#if !defined(WG_DRB_OPS) || WG_DRB_OPS == WG_TF32
WG_DRB_KERNEL(wg_drb_layer_1x_v, WG_TF32, true, WG_IO_F32)
WG_DRB_KERNEL(wg_drb_layer_1x_s, WG_TF32, false, WG_IO_F32)
#endif
#if !defined(WG_DRB_OPS) || WG_DRB_OPS == WG_F16
WG_DRB_KERNEL(wg_drb_layer_f16_v, WG_F16, true, WG_IO_F32)
WG_DRB_KERNEL(wg_drb_layer_f16_s, WG_F16, false, WG_IO_F32)
WG_DRB_KERNEL(wg_drb_layer_f16_v_o16, WG_F16, true, WG_IO_TO16)
WG_DRB_KERNEL(wg_drb_layer_f16_s_o16, WG_F16, false, WG_IO_TO16)
WG_DRB_KERNEL(wg_drb_layer_f16_h16, WG_F16, true, WG_IO_16)
#endif
#if !defined(WG_DRB_OPS) || WG_DRB_OPS == WG_BF16
WG_DRB_KERNEL(wg_drb_layer_bf16_v, WG_BF16, true, WG_IO_F32)
WG_DRB_KERNEL(wg_drb_layer_bf16_s, WG_BF16, false, WG_IO_F32)
WG_DRB_KERNEL(wg_drb_layer_bf16_v_o16, WG_BF16, true, WG_IO_TO16)
WG_DRB_KERNEL(wg_drb_layer_bf16_s_o16, WG_BF16, false, WG_IO_TO16)
WG_DRB_KERNEL(wg_drb_layer_bf16_h16, WG_BF16, true, WG_IO_16)
#endif
#endif   // WG_DRB_GRADIENT

// Prepared B's row j holds column wg_weight_column(j) of B (K x N): j itself, or with pair > 0
// (B = [W0 | W1], N = 2 * cout) row j of tile j / (2 pair) holds W0's (first half of the tile) or
// W1's (second half) column (j / (2 pair)) * pair + j % pair.
__device__ __forceinline__ int wg_weight_column(int j, int N, int pair) {
    if (pair == 0) return j;
    const int tile = j / (2 * pair), w = j % (2 * pair);
    return tile * pair + (w % pair) + (w >= pair ? N / 2 : 0);
}

// big[i] = x's TF32 high part, and small[i] its remainder where the operands keep one (3xTF32).
__device__ __forceinline__ void wg_store_split(float x, long long i, bool keep_small, float* __restrict__ big,
                                               float* __restrict__ small) {
    unsigned hi, lo;
    wg_split<WG_3XTF32>(x, hi, lo);
    big[i] = __uint_as_float(hi);
    if (keep_small) small[i] = __uint_as_float(lo);
}

// Prepare B (K x N, row stride ldb) for the TF32 modes: big[j][k] = tf32(B[k][col(j)]) and (passes 3)
// small[j][k] = B[k][col(j)] - big[j][k], as (Np x Kp) rows with zeros past N and K.
XM_KERNEL(wg_split_weight) void wg_split_weight(const float* __restrict__ B, long ldb, int K, int N, int Kp, int Np,
                                           int passes, int pair, float* __restrict__ big,
                                           float* __restrict__ small) {
    const long long total = (long long)Np * Kp;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int j = (int)(i / Kp), k = (int)(i % Kp), n = wg_weight_column(j, N, pair);
        wg_store_split((n < N && k < K) ? B[(long)k * ldb + n] : 0.0f, i, passes == 3, big, small);
    }
}

// The same for a deformation layer's paired weight from W0 and W1 apart, each K x cout with element
// (k, c) at k * sk + c * sc (a transposed view reads in place): B = [W0 | 0 | W1 | 0] with each half
// `width` columns (cout up to the next multiple of the pairing), N = 2 width; with `interleave`, K in
// wg_interleaved_k's order (the layer kernels built with WG_DRB_DIRECT_A).
XM_KERNEL(wg_split_pair) void wg_split_pair(const float* __restrict__ W0, const float* __restrict__ W1, long sk, long sc,
                                            int K, int cout, int width, int Kp, int Np, int pair, int interleave,
                                            float* __restrict__ big, float* __restrict__ small) {
    const long long total = (long long)Np * Kp;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int j = (int)(i / Kp), kk = (int)(i % Kp), n = wg_weight_column(j, 2 * width, pair);
        const int k = interleave ? wg_interleaved_k(kk) : kk;
        const bool second = n >= width;
        const int c = second ? n - width : n;
        const float x = (n < 2 * width && c < cout && k < K) ? (second ? W1 : W0)[(long)k * sk + (long)c * sc] : 0.0f;
        wg_store_split(x, i, true, big, small);
    }
}

// The same for the 16-bit modes: out[j][k] = B[k][col(j)] rounded to nearest even float16 (bf16 = 0)
// or bfloat16 (bf16 = 1), as (Np x Kp) 16-bit elements.
XM_KERNEL(wg_pack_weight16) void wg_pack_weight16(const float* __restrict__ B, long ldb, int K, int N, int Kp, int Np,
                                            int bf16, int pair, unsigned short* __restrict__ out) {
    const long long total = (long long)Np * Kp;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int j = (int)(i / Kp), k = (int)(i % Kp), n = wg_weight_column(j, N, pair);
        const float x = (n < N && k < K) ? B[(long)k * ldb + n] : 0.0f;
        const unsigned packed = bf16 ? wg_pack<WG_BF16>(x, 0.0f) : wg_pack<WG_F16>(x, 0.0f);
        out[i] = (unsigned short)(packed & 0xffffu);
    }
}
