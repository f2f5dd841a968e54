// A deformation reasoning block's five wide layers in one kernel, in the 16-bit modes ("fp16",
// "bf16") on Hopper (sm_90a): from X (the local projection's features, cin <= 384 columns) to
//
//     x1 = lc1(X),  x2 = lc2(x1),  x3 = lc3(x2) + x1,  x4 = lc4(x3),  x5 = lc5(x4) + x3,
//     lcN(h) = relu(h W0 + Z W1 + b),  Z = A1 h rounded to the mode's 16 bits,
//
// each layer computed as wgmma_drb16.cu computes it (the same Z, the same wgmmas in the same order,
// the same epilogue), so x5 is that of five wg_drb_reference16 launches bit for bit. There, every layer
// reads its X and residual from global memory and writes its output back (about 120 MB a sample a
// layer at 16 bits), and the first layer (W too large for shared memory beside X) takes tiles of 96
// output columns and reads X twice; here a tile's activations stay in shared memory from x1 to x5,
// X is read once, and W streams through instead: X in, x5 out, and 147 KB a 192-wide layer (the first
// layer's 264 KB at cin 339) of W a tile from L2.
//
// A persistent block (one per multiprocessor) of 4 warpgroups takes tiles blockIdx.x, blockIdx.x +
// gridDim.x, ... of (sample, 4 vertices) (drb16_tile.cuh's rows 4 i + v). Its K slices of 32 columns
// run in one sequence, s0 = ceil(cin / 32) for lc1 and six for each 192-wide layer, 24 + s0 a tile:
//   - one producer thread has the Tensor Memory Accelerator copy lc1's X, 64 columns (two slices) at a
//     time, into buffer Q's three K buffers through the tensor map `xmap` (rows 4 i + v and the 128-byte
//     swizzle come from the map; columns past cin and vertices past N arrive as zeros), three at first
//     and later each into the K buffer of the one three before it (the MMAs done with both its slices),
//     each completing on that K buffer's transaction barrier; the producer warpgroup computes every
//     slice's Z from the layer's input (the X slice for lc1, P for lc2 and lc4, Q for lc3 and lc5) into
//     a ring of two slots;
//   - three MMA warpgroups (64 rows each) stream W (pieces of 32 K rows of W1 or W0 for all 192
//     columns, two a slice, a ring of six: two slices ahead; one thread of theirs copies a slice's two
//     pieces with one bulk copy, which completes on the ring slot's transaction barrier), run m64n192k16
//     wgmmas (Z W1, then the input's W0) onto accumulators that start as the bias, and after a layer's
//     last slice apply the ReLU, add the residual and store the layer's output in 16 bits: lc1 and lc3
//     into P (lc3 over its residual there, each element read and written by the same thread), lc2 and
//     lc4 into Q, lc5 to global memory.
// Q is lc5's input; once lc5's wgmmas are done with it, the producer copies the next tile's X
// there while lc5's epilogue still reads its residual from P (and the next tile's lc1 epilogue,
// which writes P, runs in the same threads after it, element for element).
// Named barriers hand slices over (Z ready, Z slot free, X K buffer free), tell the producer that
// a layer's output is in shared memory or that lc5's input is free, and keep the MMA warpgroups
// together before W pieces are overwritten.
//
// Shared memory (227 KB, the most a block may have): P and Q (three 64-column K buffers each, of 176
// rows of 128 bytes: 172 rows hold hypotheses; the third warpgroup's MMAs read 16 rows past a buffer,
// whose results are never stored), the Z slots (one such buffer, two 32-column halves; its rows 172-175,
// which nothing stores to, hold the transaction barriers of the W ring's three slots and of Q's three K
// buffers as lc1's X), and the W ring (six pieces of 192 rows of 64 bytes with the 64-byte swizzle,
// prepared so by HopperGemm.prepare_chain16 and copied as they are). W and X went in by cp.async before (1536 copies of 16 bytes a slice for W, 768 a slice
// of lc1 for X, through the load/store pipe that the producer's Z also uses).
#include "kernel_select.cuh"
#include "drb16_tile.cuh"

#define ZC_LAYERS 5                                   // lc1 (cin inputs) and the four 192-wide layers
#define ZC_HIDDEN 4
#define ZC_SLICES 6                                   // 32-column K slices of a 192-wide layer
#define ZC_KBUF_BYTES (176 * 128)                      // one 64-column K buffer of an activation
#define ZC_ACT_BYTES (3 * ZC_KBUF_BYTES)
#define ZC_PIECE_BYTES (ZL_COUT * 64)                  // 32 K rows of W0 or W1, all 192 columns
#define ZC_PIECES 6
#define ZC_SMEM_BYTES (2 * ZC_ACT_BYTES + ZC_KBUF_BYTES + ZC_PIECES * ZC_PIECE_BYTES + 1024)
// registers per thread after setmaxnreg (3 * 144 + 80 = 4 * 128): the MMA loop spans five layers and
// the W copies, so the MMA warpgroups take more than wgmma_drb16.cu's (there 136: 400 bytes of spills)
#define ZC_MMA_REGS 144
#define ZC_PRODUCER_REGS 80

// Named barriers (0 is __syncthreads'): Z slot ready (producer -> MMA), Z slot free (MMA -> producer),
// a layer's output stored (MMA -> producer), the MMA warpgroups' own,
// lc5's input free for the next tile's X (MMA -> producer), an X K buffer free (MMA -> producer: the
// MMAs are done with lc1's K buffer k, k + 3 may go there; ids by k % 3),
// and one of a layer's first output slices stored (MMA -> producer, zc_epilogue).
#define ZC_READY 1                                    // + Z slot (2)
#define ZC_Z_FREE 3                                   // + Z slot (2)
#define ZC_LAYER_DONE 5
#define ZC_MMA 6
#define ZC_INPUT_FREE 8                               // lc5's wgmmas are done with its input
#define ZC_X_FREE 9                                   // + K buffer % 3
#define ZC_OUT 12                                     // + slice (< ZC_EARLY_SLICES): a layer's slice stored
#define ZC_EARLY_SLICES 2                             // the slices so announced (the Z ring's two slots)

// The accumulators' starting value: the layer's bias, so that the wgmmas add the products to it and the
// epilogue has no bias to read. Accumulator column 8 j + 2 t (+ 1) of quad thread t holds output column
// 32 (j / 4) + 8 t + 2 (j % 4) (+ 1) (zl_column), in both of its rows (acc[4 j + 2 h], + 1).
__device__ __forceinline__ void zc_bias_start(float (&acc)[96], const float* __restrict__ bias, int t) {
#pragma unroll
    for (int k = 0; k < ZL_COUT / 32; ++k) {
        const float4 b0 = __ldg(reinterpret_cast<const float4*>(bias + 32 * k + 8 * t));
        const float4 b1 = __ldg(reinterpret_cast<const float4*>(bias + 32 * k + 8 * t + 4));
        const float bk[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
        for (int p = 0; p < 4; ++p)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[4 * (4 * k + p) + e] = bk[2 * p + (e & 1)];
    }
}

// Piece k (output columns 32 k + 8 t .. + 7) of this thread's row h of a layer's output: relu(acc)
// (+ the residual's piece at res, 16 bits), rounded to 16 bits, as four pairs. The accumulator columns of
// quad thread t hold output columns 32 k + 8 t .. + 7 (zl_column): accumulator column 8 (4 k + p) + 2 t and
// the next hold the piece's columns 2 p, 2 p + 1.
template <int OPS, bool RESIDUAL>
__device__ __forceinline__ void zc_piece(const float (&acc)[96], const unsigned char* res, int h, int k,
                                         unsigned (&packed)[4]) {
    uint4 rp = make_uint4(0u, 0u, 0u, 0u);
    if (RESIDUAL) rp = *reinterpret_cast<const uint4*>(res);
    const unsigned rk[4] = {rp.x, rp.y, rp.z, rp.w};
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        float v0 = fmaxf(acc[4 * (4 * k + p) + 2 * h], 0.0f);
        float v1 = fmaxf(acc[4 * (4 * k + p) + 2 * h + 1], 0.0f);
        if (RESIDUAL) {
            v0 = __fadd_rn(v0, wg_widen16<OPS>((unsigned short)(rk[p] & 0xffffu)));
            v1 = __fadd_rn(v1, wg_widen16<OPS>((unsigned short)(rk[p] >> 16)));
        }
        packed[p] = wg_pack<OPS>(v0, v1);
    }
}

// A layer's epilogue for this thread's two rows: relu(acc) (+ the residual in buffer A, a_buf),
// rounded to 16 bits, into shared buffer dst (A or B) or, for the last layer, to global memory: one
// 16-byte piece of the row per k (zc_piece), chunk 4 (k % 2) + t of K buffer k / 2. The pieces go out
// in column order (k outer) and, into shared memory, each of the first ZC_EARLY_SLICES 32-column
// slices is announced as soon as it is stored (barrier ZC_OUT + k): the producer makes the next
// layer's first Z slices from them while the rest of the epilogue runs.
template <int OPS, bool RESIDUAL, bool GLOBAL_OUT>
__device__ __forceinline__ void zc_epilogue(const float (&acc)[96], unsigned char* a_buf, unsigned char* dst,
                                            unsigned short* __restrict__ out, long plane, long b, int n0, int N,
                                            int wg, int warp, int g, int t) {
#pragma unroll
    for (int k = 0; k < ZL_COUT / 32; ++k) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = wg * 64 + (warp & 3) * 16 + g + 8 * h, i = r / ZL_VERTS, v = r % ZL_VERTS;
            if (i < ZL_HYP && n0 + v < N) {
                const unsigned s = (k / 2) * ZC_KBUF_BYTES + r * 128 + (((4 * (k % 2) + t) ^ (r & 7)) << 4);
                unsigned packed[4];
                zc_piece<OPS, RESIDUAL>(acc, a_buf + s, h, k, packed);
                const uint4 piece = make_uint4(packed[0], packed[1], packed[2], packed[3]);
                if (GLOBAL_OUT)
                    *reinterpret_cast<uint4*>(out + (b * ZL_HYP + i) * plane + (long)(n0 + v) * ZL_COUT + 8 * t + 32 * k) = piece;
                else
                    *reinterpret_cast<uint4*>(dst + s) = piece;
            }
        }
        if (!GLOBAL_OUT && k < ZC_EARLY_SLICES) wg_bar_arrive(ZC_OUT + k, ZL_THREADS);
    }
}

// lc5's epilogue when the block's score layer follows in the same kernel (zc_chain's SCORE): x5 =
// relu(acc) + x3, rounded to 16 bits as zc_epilogue rounds it, is never stored; each row's two
// products with the score layer's float32 W (192 x 2, rows [w0 w1]), y0 = x5 W[:, 0] and y1 = x5 W[:, 1],
// go to rows_out[(b, i, n)] as a float2 instead (8 bytes a row in place of 384). Float32 sums: each
// thread's 48 columns in order by fmaf, then the quad's four partial sums. Every thread of a quad
// takes part in the sums (rows past the tile's last hypothesis or vertex compute junk, never stored).
template <int OPS>
__device__ __forceinline__ void zc_epilogue_score(const float (&acc)[96], const float* __restrict__ score_w,
                                                  const unsigned char* a_buf, float2* __restrict__ rows_out, long b,
                                                  int n0, int N, int wg, int warp, int g, int t) {
    float y0[2] = {0.0f, 0.0f}, y1[2] = {0.0f, 0.0f};   // the two rows' sums
#pragma unroll
    for (int k = 0; k < ZL_COUT / 32; ++k) {
        float4 w[4];   // W[c][0], W[c][1], W[c + 1][0], W[c + 1][1] for columns c = 32 k + 8 t + 2 p: read once for both rows
        const float4* wk = reinterpret_cast<const float4*>(score_w + 2 * (32 * k + 8 * t));
#pragma unroll
        for (int p = 0; p < 4; ++p) w[p] = __ldg(wk + p);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = wg * 64 + (warp & 3) * 16 + g + 8 * h;
            const unsigned s = (k / 2) * ZC_KBUF_BYTES + r * 128 + (((4 * (k % 2) + t) ^ (r & 7)) << 4);
            unsigned packed[4];
            zc_piece<OPS, true>(acc, a_buf + s, h, k, packed);
#pragma unroll
            for (int p = 0; p < 4; ++p) {
                const float x0 = wg_widen16<OPS>((unsigned short)(packed[p] & 0xffffu));
                const float x1 = wg_widen16<OPS>((unsigned short)(packed[p] >> 16));
                y0[h] = fmaf(x0, w[p].x, y0[h]);
                y1[h] = fmaf(x0, w[p].y, y1[h]);
                y0[h] = fmaf(x1, w[p].z, y0[h]);
                y1[h] = fmaf(x1, w[p].w, y1[h]);
            }
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = wg * 64 + (warp & 3) * 16 + g + 8 * h, i = r / ZL_VERTS, v = r % ZL_VERTS;
        float s0 = y0[h], s1 = y1[h];
        s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
        s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
        s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
        s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
        if (t == 0 && i < ZL_HYP && n0 + v < N) rows_out[(b * ZL_HYP + i) * (long)N + n0 + v] = make_float2(s0, s1);
    }
}

// The K buffer that holds K slice ks of a layer's input, in half ks % 2 of it: lc1's X in Q's half-buffer
// ks % 6, x1 and x3 (lc2, lc4) in P, x2 and x4 (lc3, lc5) in Q. The producer's Z and X copies and the
// MMAs' descriptors all take it from here.
__device__ __forceinline__ unsigned zc_input_kbuf(int layer, int ks, unsigned p_smem, unsigned q_smem) {
    return layer == 0 ? q_smem + (ks % 6 / 2) * ZC_KBUF_BYTES : (layer % 2 ? p_smem : q_smem) + (ks / 2) * ZC_KBUF_BYTES;
}

// SCORE: lc5's epilogue is zc_epilogue_score's (score_w, rows_out) instead of x5 to `out`.
template <int OPS, bool SCORE>
__device__ __forceinline__ void zc_chain(const WgTensorMap& xmap, const unsigned short* __restrict__ X, long ldx, int cin,
                                         const unsigned short* __restrict__ W, const float* __restrict__ bias,
                                         unsigned short* __restrict__ out, const float* __restrict__ score_w,
                                         float2* __restrict__ rows_out, int N, int tiles) {
    extern __shared__ float4 zc_shared[];
    const unsigned raw = wg_smem(zc_shared);
    const unsigned base = (raw + 1023u) & ~1023u;
    unsigned char* base_ptr = reinterpret_cast<unsigned char*>(zc_shared) + (base - raw);
    // P, Q, Z, W ring: the buffers MMAs read past (P, Q, Z: 16 rows) are followed by another
    const unsigned p_smem = base, q_smem = base + ZC_ACT_BYTES, z_smem = base + 2 * ZC_ACT_BYTES;
    const unsigned w_smem = z_smem + ZC_KBUF_BYTES;
    const unsigned w_full = z_smem + ZL_TILE_ROWS * 128;   // + 8 s: W ring slot s's barrier (slices q, q % 3 == s)
    const unsigned x_full = w_full + 8 * ZC_PIECES / 2;    // + 8 j: Q's K buffer j's as lc1's X (K buffers k, k % 3 == j)
    if (threadIdx.x == 0) {
        for (int s = 0; s < ZC_PIECES / 2; ++s) wg_mbar_init(w_full + 8 * s, 1);
        for (int j = 0; j < 3; ++j) wg_mbar_init(x_full + 8 * j, 1);
        wg_mbar_init_fence();
    }
    __syncthreads();
    const int first_slices = (cin + ZL_BK - 1) / ZL_BK, per_tile = first_slices + ZC_HIDDEN * ZC_SLICES;
    const int x_kbufs = (first_slices + 1) / 2;   // lc1's 64-column K buffers
    // the parity of the phase each of Q's K buffers (as lc1's X) completes next: bit j, flipped by every wait
    unsigned x_parity = 0;
    auto wait_x = [&](int kb) {
        wg_mbar_wait(x_full + 8 * (kb % 3), (x_parity >> (kb % 3)) & 1u);
        x_parity ^= 1u << (kb % 3);
    };
    const int my_tiles = tiles > (int)blockIdx.x ? (tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int total = my_tiles * per_tile;   // K slices this block runs
    const long plane_x = (long)N * ldx, plane = (long)N * ZL_COUT;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    if (threadIdx.x >= ZL_MMA_THREADS) {   // ---- producer: X slices in, Z slices out
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(ZC_PRODUCER_REGS));
        const int et = threadIdx.x - ZL_MMA_THREADS, v = warp - ZL_MMA_THREADS / 32;
        int q = 0;
        for (int t = 0; t < my_tiles; ++t) {
            long b;
            int n0;
            wg_vertex_origin<ZL_VERTS>((int)blockIdx.x + t * (int)gridDim.x, N, b, n0);
            // lc1's K buffer kb (X's columns 64 kb .., slices 2 kb and 2 kb + 1) into its place in Q
            // (zc_input_kbuf: K buffer kb % 3, whose barrier is x_full's kb % 3), by thread et == 0
            auto load_kbuf = [&](int kb) {
                if (et == 0)
                    wg_tensor_copy_3d(zc_input_kbuf(0, 2 * kb, p_smem, q_smem), xmap, 64 * kb, n0, (int)(b * ZL_HYP),
                                      x_full + 8 * (kb % 3), ZL_TILE_ROWS * 128);
            };
            if (t > 0) wg_bar_sync(ZC_INPUT_FREE, ZL_THREADS);   // the last tile's lc5 wgmmas are done with Q
            for (int kb = 0; kb < 3 && kb < x_kbufs; ++kb) load_kbuf(kb);
            if (t + 1 < my_tiles && et < ZL_HYP) {   // the next tile's X into L2: hypothesis et's rows are contiguous
                long nb;
                int nn0;
                wg_vertex_origin<ZL_VERTS>((int)blockIdx.x + (t + 1) * (int)gridDim.x, N, nb, nn0);
                const int verts = N - nn0 < ZL_VERTS ? N - nn0 : ZL_VERTS;
                zl_prefetch_l2(X + (nb * ZL_HYP + et) * plane_x + (long)nn0 * ldx,
                               (unsigned)(((verts - 1) * ldx + (cin + 7) / 8 * 8) * 2));
            }
#pragma unroll 1
            for (int layer = 0; layer < ZC_LAYERS; ++layer) {
                const int slices = layer ? ZC_SLICES : first_slices;
#pragma unroll 1
                for (int ks = 0; ks < slices; ++ks, ++q) {
                    // the previous layer's output slice ks is in shared memory: the first ones as the
                    // epilogue stores them, the rest once it is done
                    if (layer > 0 && ks < ZC_EARLY_SLICES) wg_bar_sync(ZC_OUT + ks, ZL_THREADS);
                    if (layer > 0 && ks == ZC_EARLY_SLICES) wg_bar_sync(ZC_LAYER_DONE, ZL_THREADS);
                    // Z of the slice's input (zc_input_kbuf) goes to slot q % 2
                    if (layer == 0 && ks % 2 == 0) wait_x(ks / 2);   // the slice's K buffer is in
                    const unsigned src = zc_input_kbuf(layer, ks, p_smem, q_smem);
                    if (q >= 2) wg_bar_sync(ZC_Z_FREE + q % 2, ZL_THREADS);
                    if (n0 + v < N)
                        zl_mix_slice_column<OPS>(base_ptr + (src - base), 32 * (ks % 2) + lane, base_ptr + (z_smem - base),
                                                 32 * (q % 2) + lane, v);
                    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                    wg_bar_arrive(ZC_READY + q % 2, ZL_THREADS);
                    // after slice 2 k + 3's Z: K buffer k + 3 into K buffer k's place (the MMAs arrived for it at
                    // their slice 2 k + 2, done with both of k's slices; three slices before k + 3's first)
                    if (layer == 0 && ks % 2 == 1 && ks >= 3 && (ks - 3) / 2 + 3 < x_kbufs) {
                        wg_bar_sync(ZC_X_FREE + (ks - 3) / 2 % 3, ZL_THREADS);
                        load_kbuf((ks - 3) / 2 + 3);
                    }
                }
            }
        }
    } else {   // ---- MMA warpgroups
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(ZC_MMA_REGS));
        const int wg = warp >> 2, g = lane >> 2, t4 = lane & 3;
        const int pieces_per_tile = 2 * per_tile;   // the W stream repeats every tile
        int w_piece = 0;                            // 2 q mod pieces_per_tile for the q issue_w takes next
        // slice q's W pieces (W1 then W0: pieces 2 q, 2 q + 1 of the stream, side by side in W and in the
        // ring) into ring slots 2q % 6, (2q + 1) % 6: one bulk copy by thread 0, completing phase q / 3 of
        // slot q % 3's barrier; none past the end. Called by every MMA thread for q = 0, 1, 2, ... in turn
        // (w_piece steps along: no division by the run-time tile length)
        auto issue_w = [&](int q) {
            if (q < total && threadIdx.x == 0)
                wg_bulk_copy(w_smem + ((2 * q) % ZC_PIECES) * ZC_PIECE_BYTES, W + (long)w_piece * (ZC_PIECE_BYTES / 2),
                             2 * ZC_PIECE_BYTES, w_full + 8 * (q % 3));
            w_piece = w_piece + 2 == pieces_per_tile ? 0 : w_piece + 2;
        };
        issue_w(0);
        issue_w(1);
        int q = 0;
        unsigned char* p_buf = base_ptr + (p_smem - base);
        unsigned char* q_buf = base_ptr + (q_smem - base);
        for (int tile = blockIdx.x, t = 0; tile < tiles; tile += gridDim.x, ++t) {
            long b;
            int n0;
            wg_vertex_origin<ZL_VERTS>(tile, N, b, n0);
#pragma unroll 1
            for (int layer = 0; layer < ZC_LAYERS; ++layer) {
                float acc[96];
                zc_bias_start(acc, bias + layer * ZL_COUT, t4);
                const int slices = layer ? ZC_SLICES : first_slices;
                const unsigned rows = wg * 64 * 128;   // this warpgroup's rows
#pragma unroll 1
                for (int ks = 0; ks < slices; ++ks, ++q) {
                    wg_mbar_wait(w_full + 8 * (q % 3), (q / 3) & 1);   // slice q's W pieces are in
                    if (layer == 0 && ks % 2 == 0) wait_x(ks / 2);       // lc1's X slice is in (the producer saw it land)
                    wg_bar_sync(ZC_READY + q % 2, ZL_THREADS);        // and Z's slice
                    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
                    const unsigned w1 = w_smem + ((2 * q) % ZC_PIECES) * ZC_PIECE_BYTES;
                    const unsigned w0 = w_smem + ((2 * q + 1) % ZC_PIECES) * ZC_PIECE_BYTES;
                    const unsigned zs = z_smem + rows + 64 * (q % 2);
#pragma unroll
                    for (int kk = 0; kk < 2; ++kk)
                        zl_mma<OPS>(acc, wg_desc(zs + 32 * kk), wg_desc64(w1 + 32 * kk), 1);
                    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
                    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");   // slice q - 1's products are done
                    // done with lc1's K buffer ks / 2 - 1 (both its slices): K buffer ks / 2 + 2 may go there
                    if (layer == 0 && ks % 2 == 0 && ks >= 2 && ks / 2 + 2 < x_kbufs)
                        wg_bar_arrive(ZC_X_FREE + (ks / 2 - 1) % 3, ZL_THREADS);
                    wg_bar_sync(ZC_MMA, ZL_MMA_THREADS);                                 // ... in every warpgroup
                    issue_w(q + 2);   // into slice q - 1's slots
                    const unsigned xs = zc_input_kbuf(layer, ks, p_smem, q_smem) + rows + 64 * (ks % 2);
#pragma unroll
                    for (int kk = 0; kk < 2; ++kk) zl_mma<OPS>(acc, wg_desc(xs + 32 * kk), wg_desc64(w0 + 32 * kk), 1);
                    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
                    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");   // slice q's Z products are done
                    if (q + 2 < total) wg_bar_arrive(ZC_Z_FREE + q % 2, ZL_THREADS);
                }
                asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
                for (int i = 0; i < 96; ++i) wg_pin(acc[i]);
                // lc5's input is where the next tile's X goes: the producer fills it while this epilogue runs
                if (layer == ZC_LAYERS - 1 && t + 1 < my_tiles) wg_bar_arrive(ZC_INPUT_FREE, ZL_THREADS);
                if (layer == 0 || layer == 1 || layer == 3)   // x1 into P, x2 and x4 into Q
                    zc_epilogue<OPS, false, false>(acc, p_buf, layer ? q_buf : p_buf, out, plane, b, n0, N, wg, warp, g, t4);
                else if (layer == 2)                          // x3 = lc3(x2) + x1 over x1 in P
                    zc_epilogue<OPS, true, false>(acc, p_buf, p_buf, out, plane, b, n0, N, wg, warp, g, t4);
                else if (SCORE)                               // x5 = lc5(x4) + x3 into the score layer's products
                    zc_epilogue_score<OPS>(acc, score_w, p_buf, rows_out, b, n0, N, wg, warp, g, t4);
                else                                          // x5 = lc5(x4) + x3 to global memory
                    zc_epilogue<OPS, true, true>(acc, p_buf, q_buf, out, plane, b, n0, N, wg, warp, g, t4);
                if (layer < ZC_LAYERS - 1) {
                    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // the next layer's wgmmas read it
                    wg_bar_arrive(ZC_LAYER_DONE, ZL_THREADS);
                }
            }
        }
    }
}

#define ZC_KERNEL(NAME, OPS)                                                                                  \
    XM_KERNEL(NAME) void __launch_bounds__(ZL_THREADS, 1) NAME(                                                 \
        const __grid_constant__ WgTensorMap xmap, const unsigned short* X, long ldx, int cin, const unsigned short* W, \
        const float* bias, unsigned short* out, int N, int tiles) {                                             \
        zc_chain<OPS, false>(xmap, X, ldx, cin, W, bias, out, nullptr, nullptr, N, tiles);                    \
    }
ZC_KERNEL(wg_drb_chain_f16, WG_F16)
ZC_KERNEL(wg_drb_chain_bf16, WG_BF16)

// The same with the block's score layer's two products in lc5's epilogue: rows_out (B, 43, N) float2.
#define ZC_SCORE_KERNEL(NAME, OPS)                                                                            \
    XM_KERNEL(NAME) void __launch_bounds__(ZL_THREADS, 1) NAME(                                                 \
        const __grid_constant__ WgTensorMap xmap, const unsigned short* X, long ldx, int cin, const unsigned short* W, \
        const float* bias, const float* score_w, float2* rows_out, int N, int tiles) {                          \
        zc_chain<OPS, true>(xmap, X, ldx, cin, W, bias, nullptr, score_w, rows_out, N, tiles);                \
    }
ZC_SCORE_KERNEL(wg_drb_chain_score_f16, WG_F16)
ZC_SCORE_KERNEL(wg_drb_chain_score_bf16, WG_BF16)
