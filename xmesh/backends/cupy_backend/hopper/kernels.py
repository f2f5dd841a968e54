"""The Hopper kernels' launchers (``HopperGemm``) and weight preparation: the wgmma GEMM and deformation
layer (kernels/wgmma_gemm.cu), the 16-bit chain (wgmma_drb16_chain.cu), the three-half-products layer
(wgmma_drb32h.cu).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import plan
from ...cuda_kernels import get_arch_function
from ...kernel_constants import HYPOTHESES
from .activations import activation_dtype
from .families import ARCH, CHAIN, DRB_LAYER, GEMM, LAYER_3XF16, MAX_DYNAMIC_SHARED_SIZE_BYTES, OPERANDS, WIDE_COLS
from .layouts import chain_piece_index, hypothesis_rows, piece_index, vertex_tile_map


def supported(device) -> bool:
    """Whether ``device`` (a ``cupy.cuda.Device``) runs sm_90a code: compute capability exactly 9.0."""
    return str(device.compute_capability) == "90"


def smem_bytes(operands: str, bn: int = GEMM.bn, rows: int = GEMM.bm, stages: int = GEMM.stages, a16: bool = False) -> int:
    """Dynamic shared memory of one block: the ring of (B big [, B small], A) slices plus alignment
    slack (wg_stage_bytes: B slices take rows of 128 bytes; 16-bit modes pad float32 A rows to 40
    floats; A in 16 bits (``a16``) takes rows of 128 bytes as B)."""
    passes = OPERANDS[operands].tf32_passes
    parts = 2 if passes == 3 else 1
    a_stride = GEMM.a_stride if passes else GEMM.a_stride + 4
    return stages * (parts * bn * 128 + (rows * 128 if a16 else rows * a_stride * 4)) + 1024


@dataclass(frozen=True)
class PreparedWeight:
    """B (k x n) in the Hopper kernels' form for one of :data:`OPERANDS`: ``big`` and ``small`` (None
    but in 3xTF32) of shape (ceil(n/128)*128, ceil(k/32)*32), float32 (uint16 holding float16 or
    bfloat16 bits in the 16-bit modes), row j holding column j of B; for a deformation block layer
    (``paired``: B = [W0 | W1]) each 64 rows hold 32 columns of W0 and the same 32 of W1."""

    big: object
    small: object
    k: int
    n: int
    operands: str
    paired: bool = False

    @property
    def passes(self) -> int:
        """TF32 products per K step (3 or 1); 0 in the 16-bit modes."""
        return OPERANDS[self.operands].tf32_passes

    @property
    def small_arg(self):
        """The small part to pass a kernel: ``big`` again for one pass (the kernel then never reads it)."""
        return self.big if self.small is None else self.small


@dataclass(frozen=True)
class PreparedHalves:
    """A deformation layer's [W0 | W1] (k x 2 * 192, float32) for :meth:`HopperGemm.drb_layer_3xf16`:
    ``stream`` (uint16 holding float16) per 32-row K slice and column group of 96, W1's big and small
    parts, then W0's, each 96 columns x 32 K rows in the kernel's shared-memory form
    (:func:`piece_index`), of W with each output column c multiplied by 2^s_c; ``scale`` (192,)
    float32, 2^-s_c; ``k`` the inputs."""

    stream: object
    scale: object
    k: int


@dataclass(frozen=True)
class PreparedChain:
    """A deformation block's five wide layers for :meth:`HopperGemm.drb_chain16`: ``stream`` the 16-bit
    W pieces (the first layer's ceil(cin / 32) K slices, then 4 layers x 6 K slices; each slice W1's
    then W0's 192 columns x 32 K rows, uint16), ``bias`` (5, 192) float32, ``cin`` the first layer's
    inputs, ``operands`` "fp16" or "bf16"."""

    stream: object
    bias: object
    cin: int
    operands: str



class HopperGemm:
    def __init__(self, cupy):
        self.cupy = cupy
        self.sm_count = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
        self._kernels: dict = {}
        self._split = get_arch_function(GEMM.source, "wg_split_weight", ARCH, ("-std=c++17",))
        self._pack16 = get_arch_function(GEMM.source, "wg_pack_weight16", ARCH, ("-std=c++17",))

    def _kernel(self, name: str, smem: int, prelude: str = "", source: str = GEMM.source):
        kernel = self._kernels.get((name, prelude))
        if kernel is None:
            from cupy_backends.cuda.api import driver

            kernel = get_arch_function(source, name, ARCH, ("-std=c++17",), prelude)
            # > 48 KB of dynamic shared memory needs the opt-in
            driver.funcSetAttribute(kernel.ptr, MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
            self._kernels[(name, prelude)] = kernel
        return kernel

    def prepare(self, b, operands: str = "3xtf32", paired: bool = False) -> PreparedWeight:
        """Transpose, split (or round) and pad a float32 (k, n) matrix with unit column stride for
        ``operands`` (a key of :data:`OPERANDS`); ``paired``: b is [W0 | W1] of a deformation block
        layer (n = 2 cout, cout a multiple of 32)."""
        cp = self.cupy
        if operands not in OPERANDS:
            raise ValueError(f"operands={operands!r}: choose one of {', '.join(OPERANDS)}")
        k, n = b.shape
        if paired and n % (2 * DRB_LAYER.cols):
            raise ValueError(f"a paired weight needs 2 * cout columns with cout a multiple of {DRB_LAYER.cols}, got {n}")
        passes = OPERANDS[operands].tf32_passes
        kp, np_ = -(-k // GEMM.bk) * GEMM.bk, -(-n // GEMM.bn) * GEMM.bn
        total = np_ * kp
        grid, head = (min(-(-total // 256), 4096),), (b, np.int64(b.strides[0] // 4), np.int32(k), np.int32(n),
                                                     np.int32(kp), np.int32(np_))
        pair = np.int32(DRB_LAYER.cols if paired else 0)
        if passes == 0:
            big, small = cp.empty((np_, kp), dtype=cp.uint16), None
            self._pack16(grid, (256,), (*head, np.int32(operands == "bf16"), pair, big))
        else:
            big = cp.empty((np_, kp), dtype=cp.float32)
            small = cp.empty((np_, kp), dtype=cp.float32) if passes == 3 else None
            self._split(grid, (256,), (*head, np.int32(passes), pair, big, big if small is None else small))
        return PreparedWeight(big, small, k, n, operands, paired)

    def __call__(self, a, weight: PreparedWeight, out, bias=None, relu: bool = False):
        """out (m, n) = act(a (m, k) @ B + bias); ``a`` and ``out`` row-strided views with unit column stride."""
        if not weight.passes or weight.paired:
            raise ValueError(f"the Hopper GEMM takes an unpaired TF32 weight, got {weight.operands} (paired={weight.paired})")
        m, k = a.shape
        lda, ldc = a.strides[0] // 4, out.strides[0] // 4
        vec = lda % 4 == 0 and a.data.ptr % 16 == 0
        tiles = -(-m // GEMM.bm) * (weight.big.shape[0] // GEMM.bn)
        name = f"wg_gemm_{OPERANDS[weight.operands].kernel_part}_{'v' if vec else 's'}"
        self._kernel(name, smem_bytes(weight.operands))(
            (tiles,), (GEMM.threads,),
            (a, np.int64(lda), weight.big, weight.small_arg, np.int64(weight.big.shape[1]), out, np.int64(ldc), np.int32(m),
             np.int32(weight.n), np.int32(k), np.uint64(0) if bias is None else bias, np.int32(bool(relu))),
            shared_mem=smem_bytes(weight.operands))
        return out

    def drb_layer(self, x, weight: PreparedWeight, a1, bias, residual=None, mixing: str = "", out16: bool = False):
        """relu(X W0 + A1 (X W1) + bias) (+ residual) for X (B, 43, N, cin) (rows may be padded: see
        :func:`hypothesis_rows`), ``weight`` the
        paired [W0 | W1], a1 (43, 43), bias (cout,), residual (B, 43, N, cout) or None. ``mixing``:
        :func:`mixing_source` of the same A1 to run the kernel built for it (zeros skipped).

        16-bit modes only: ``out16`` stores the output in the mode's 16 bits (:func:`activation_dtype`;
        the sum is rounded once, to nearest even), and the residual must then be given in them too;
        X may be given in them (then ``out16`` is required, and its rows must be 16-byte aligned)."""
        cp = self.cupy
        b, hyp, n, cin = x.shape
        cout = weight.n // 2
        if not weight.paired or hyp != HYPOTHESES or weight.k != cin:
            raise ValueError(f"drb_layer: X {x.shape} does not fit a paired ({weight.k}, {weight.n}) weight")
        if hypothesis_rows(cp, x) is not x:
            raise ValueError(f"drb_layer: X must have evenly spaced rows (strides {x.strides}, {x.dtype})")
        x16 = x.dtype != cp.float32
        if (x16 or out16) and (weight.passes or (x16 and not out16)):
            raise ValueError(f"drb_layer: 16-bit X ({x.dtype}) or output (out16={out16}) needs a 16-bit mode "
                             f"(weight {weight.operands}) and a 16-bit output")
        act = activation_dtype(cp, weight.operands) if out16 else cp.dtype(cp.float32)
        if x16 and x.dtype != act:
            raise ValueError(f"drb_layer: X is {x.dtype}, the {weight.operands} activations are {act}")
        ldx = x.strides[2] // x.itemsize
        if residual is not None:   # the kernel copies its rows in 16-byte pieces
            if out16 and residual.dtype != act:
                raise ValueError(f"drb_layer: with out16 the residual must be {act}, got {residual.dtype}")
            residual = cp.ascontiguousarray(residual, dtype=act)
            if residual.shape != (b, hyp, n, cout) or residual.data.ptr % 16:
                raise ValueError(f"drb_layer: residual {residual.shape} must be ({b}, {hyp}, {n}, {cout}), 16-byte aligned")
        out = cp.empty((b, hyp, n, cout), dtype=act)
        vec = ldx % (8 if x16 else 4) == 0 and x.data.ptr % 16 == 0
        if x16 and not vec:
            raise ValueError(f"drb_layer: 16-bit X needs 16-byte aligned rows (a multiple of 8 elements), got {ldx}")
        smem = smem_bytes(weight.operands, 2 * DRB_LAYER.cols, DRB_LAYER.rows, DRB_LAYER.stages, a16=x16) + DRB_LAYER.staging_bytes
        tiles = b * -(-n // DRB_LAYER.vertices) * (cout // DRB_LAYER.cols)
        blocks = min(tiles, self.sm_count)   # persistent blocks, one per multiprocessor
        code, part, _ = OPERANDS[weight.operands]
        if mixing:   # a module for one A1 holds one mode's kernels (WG_DRB_OPS)
            mixing += f"#define WG_DRB_OPS {code}\n"
        io = "_h16" if x16 else ("_v" if vec else "_s") + ("_o16" if out16 else "")
        self._kernel(f"wg_drb_layer_{part}{io}", smem, mixing, DRB_LAYER.source)(
            (blocks,), (DRB_LAYER.threads,),
            (x, np.int64(ldx), np.int32(cin), weight.big, weight.small_arg, np.int64(weight.big.shape[1]), a1, bias,
             np.uint64(0) if residual is None else residual, out, np.int32(n), np.int32(cout), np.int32(tiles)),
            shared_mem=smem)
        return out

    def column_group_grid(self, b: int, n: int, columns: int) -> tuple:
        """Tiles and persistent blocks of an input-side layer whose tiles are 4 vertices by ``columns`` of
        the 192 output columns: a block's column group is blockIdx.x % (192 / columns), so the grid is
        a multiple of the group count (at most one block per multiprocessor)."""
        groups = WIDE_COLS // columns
        tiles = b * -(-n // DRB_LAYER.vertices) * groups
        return tiles, min(tiles, self.sm_count - self.sm_count % groups)

    def input_side_epilogue_operands(self, name: str, residual, bias, shape: tuple, dtype, align: int):
        """The residual (``shape`` in ``dtype``, or None) as a contiguous array starting ``align``-byte
        aligned (the input-side kernels' epilogues read it in pieces of that size), and the bias as
        contiguous float32 (192,); ValueError naming ``name`` and what is wrong otherwise."""
        cp = self.cupy
        if residual is not None:
            if residual.dtype != dtype or residual.shape != shape:
                raise ValueError(f"{name}: residual must be {shape} {dtype}, got {residual.shape} {residual.dtype}")
            residual = cp.ascontiguousarray(residual)
            if residual.data.ptr % align:
                raise ValueError(f"{name}: the residual must start {align}-byte aligned, got address "
                                 f"{residual.data.ptr:#x}")
        bias = cp.ascontiguousarray(bias, dtype=cp.float32)
        if bias.shape != (WIDE_COLS,):
            raise ValueError(f"{name}: bias must be ({WIDE_COLS},), got {bias.shape}")
        return residual, bias

    def prepare_chain16(self, first: PreparedWeight, weights, biases) -> PreparedChain:
        """The W stream and biases of :meth:`drb_chain16` from a block's five wide layers: ``first`` the
        first layer's unpaired 16-bit [W0 | W1] (:meth:`prepare` with ``paired=False``, cin <= 384
        inputs, 2 x 192 outputs), ``weights`` the four 192-wide layers' (192 x 384, the same mode),
        ``biases`` the five (192,) biases. The stream holds, per layer and 32-row K slice, W1's then
        W0's rows for all 192 columns in the kernel's shared-memory form (:func:`chain_piece_index`;
        the first layer's K rows past cin are the zeros :meth:`prepare` pads with)."""
        cp = self.cupy
        weights = tuple(weights)
        modes = {w.operands for w in (first,) + weights}
        if (len(weights) != CHAIN.hidden_layers or len(modes) != 1 or first.passes
                or any(w.paired or w.k != WIDE_COLS or w.n != 2 * WIDE_COLS for w in weights)
                or first.paired or first.n != 2 * WIDE_COLS or not 0 < first.k <= CHAIN.max_cin):
            raise ValueError(f"prepare_chain16: needs a first layer's unpaired 16-bit (cin <= {CHAIN.max_cin}, "
                             f"{2 * WIDE_COLS}) weight and {CHAIN.hidden_layers} unpaired ({WIDE_COLS}, {2 * WIDE_COLS}) weights, all "
                             f"of one 16-bit mode, got {[(w.k, w.n, w.operands, w.paired) for w in (first,) + weights]}")
        first_slices = -(-first.k // 32)   # prepare pads K to a multiple of 32 with zeros
        parts = [cp.take(first.big.reshape(-1), cp.asarray(chain_piece_index(first.big.shape[1], first_slices)))]
        index = cp.asarray(chain_piece_index(WIDE_COLS))   # a 192-wide layer's big is (384, 192): k = 192 is a whole K tile
        parts += [cp.take(w.big.reshape(-1), index) for w in weights]
        stream = cp.concatenate([part.reshape(-1) for part in parts])
        bias = cp.stack([cp.ascontiguousarray(b, dtype=cp.float32).reshape(-1) for b in biases])
        if bias.shape != (CHAIN.hidden_layers + 1, WIDE_COLS):
            raise ValueError(f"prepare_chain16: needs {CHAIN.hidden_layers + 1} biases of ({WIDE_COLS},), got {bias.shape}")
        return PreparedChain(cp.ascontiguousarray(stream), cp.ascontiguousarray(bias), first.k, first.operands)

    def drb_chain16(self, x, chain: PreparedChain, mixing: str, score_weight=None):
        """A deformation block's five wide layers in one kernel (kernels/wgmma_drb16_chain.cu), in a
        16-bit mode: x1 = lc1(X), x2 = lc2(x1), x3 = lc3(x2) + x1, x4 = lc4(x3), x5 = lc5(x4) + x3,
        each layer as the one-layer reference computes it (x5 equals five calls of tests/drb16_reference.py's
        reference_layer16 bit for bit),
        with the activations kept in shared memory. X (B, 43, N, cin) in :func:`activation_dtype` (see
        :func:`plan.chain_takes`), ``chain`` from :meth:`prepare_chain16`, ``mixing``:
        :func:`mixing_source` of A1. Returns x5 (B, 43, N, 192) in the same type.

        With ``score_weight`` (the block's score layer's float32 W, (192, 2): columns W0, W1), x5 is
        never written: the kernel returns each row's x5 W (B, 43, N, 2) float32 instead, summed in
        float32 from x5's 16-bit values (the products the score layer mixes and adds)."""
        cp = self.cupy
        act = activation_dtype(cp, chain.operands)
        if not mixing or not plan.chain_takes(x, chain.cin) or x.dtype != act:
            raise ValueError(f"drb_chain16: X {x.shape} {x.dtype} (strides {x.strides}) with "
                             f"{'a' if mixing else 'no'} mixing source: needs a 16-byte aligned (B, {HYPOTHESES}, N, "
                             f"{chain.cin}) {act} array ({chain.operands}) with rows a multiple of 8 elements apart, "
                             f"and mixing_source(A1)")
        b, _, n, _ = x.shape
        tiles = b * -(-n // DRB_LAYER.vertices)
        head = (vertex_tile_map(x, 64), x, np.int64(x.strides[2] // 2), np.int32(chain.cin), chain.stream, chain.bias)
        if score_weight is None:
            out = cp.empty((b, HYPOTHESES, n, WIDE_COLS), dtype=act)
            name, args = f"wg_drb_chain_{OPERANDS[chain.operands].kernel_part}", head + (out,)
        else:
            if score_weight.shape != (WIDE_COLS, 2):
                raise ValueError(f"drb_chain16: the score layer's weight must be ({WIDE_COLS}, 2), got {score_weight.shape}")
            out = cp.empty((b, HYPOTHESES, n, 2), dtype=cp.float32)
            name = f"wg_drb_chain_score_{OPERANDS[chain.operands].kernel_part}"
            args = head + (cp.ascontiguousarray(score_weight, dtype=cp.float32), out)
        self._kernel(name, CHAIN.smem, mixing, CHAIN.source)((min(tiles, self.sm_count),), (DRB_LAYER.threads,),
                                                     args + (np.int32(n), np.int32(tiles)), shared_mem=CHAIN.smem)
        return out

    def prepare_halves(self, w) -> PreparedHalves:
        """[W0 | W1] (k, 2 x 192) float32 for :meth:`drb_layer_3xf16`: each output column c (W0's and W1's
        column c together) scaled by the power of two 2^s_c that puts its largest magnitude in [2^7,
        2^8) (exact), split into float16 big = fp16(w) and small = fp16(w - big), laid out as
        :class:`PreparedHalves` says (K rows past k zero)."""
        cp = self.cupy
        w = cp.ascontiguousarray(w, dtype=cp.float32)
        if w.ndim != 2 or w.shape[1] != 2 * WIDE_COLS or not 0 < w.shape[0]:
            raise ValueError(f"prepare_halves: needs a (k, {2 * WIDE_COLS}) [W0 | W1], got {w.shape}")
        k = w.shape[0]
        largest = cp.maximum(cp.abs(w[:, :WIDE_COLS]).max(axis=0), cp.abs(w[:, WIDE_COLS:]).max(axis=0))
        # a NaN or infinity anywhere in w makes its column's largest magnitude one (192 values read back
        # here, instead of a whole-array reduction, whose CUB kernels cost seconds to compile on first use)
        if not np.isfinite(cp.asnumpy(largest)).all():
            raise ValueError("prepare_halves: the weight has non-finite entries")
        _, exponent = cp.frexp(largest)   # largest = m 2^exponent, m in [0.5, 1)
        shift = cp.where(largest > 0, LAYER_3XF16.w_exponent + 1 - exponent, 0).astype(cp.int32)
        scaled = cp.ldexp(w, cp.concatenate([shift, shift])[None, :])
        big = scaled.astype(cp.float16)
        small = (scaled - big.astype(cp.float32)).astype(cp.float16)
        slices = -(-k // LAYER_3XF16.k_slice)

        def k_major(part):   # (2 x 192, 32 slices): row c holds column c of [W0 | W1], zeros past k
            rows = cp.zeros((2 * WIDE_COLS, LAYER_3XF16.k_slice * slices), dtype=cp.uint16)
            rows[:, :k] = part.view(cp.uint16).T
            return rows.reshape(-1)

        index = cp.asarray(piece_index(LAYER_3XF16.k_slice * slices, slices, LAYER_3XF16.tile_columns))   # (slice, group, W1 / W0, n, 4, 8)
        stream = cp.stack([cp.take(k_major(big), index), cp.take(k_major(small), index)], axis=3)
        scale = cp.ldexp(cp.ones(WIDE_COLS, dtype=cp.float32), -shift).astype(cp.float32)
        return PreparedHalves(cp.ascontiguousarray(stream.reshape(-1)), scale, k)

    def drb_layer_3xf16(self, x, halves: PreparedHalves, bias, residual=None, mixing: str = "", score_weight=None):
        """The "fp32" mode's deformation layer as three float16 products (kernels/wgmma_drb32h.cu):
        relu(X W0 + Z W1 + bias) (+ residual), Z = A1 X in float32, each product of float32 operands
        taken as big big + big small + small big of their float16 parts (W's columns scaled by powers
        of two, undone in the epilogue), each 32-column K slice's products summed in the tensor cores
        and added in float32; tiles of 96 output columns.
        X float32 (B, 43, N, k) (see :func:`plan.layer_3xf16_takes`), ``halves`` from :meth:`prepare_halves`,
        residual (B, 43, N, 192) float32 or None, ``mixing``: :func:`mixing_source` of A1. Returns
        (B, 43, N, 192) float32.

        With ``score_weight`` (a block's score layer's float32 W, (192, 2): columns W0, W1), the output
        is never written: the kernel returns each row's products with W over each of the two 96-column
        groups, (2, B, 43, N, 2) float32 (float32 sums of the output's float32 values; the two groups
        added in order give x W)."""
        cp = self.cupy
        if not plan.layer_3xf16_takes(x, halves.k, mixing):
            raise ValueError(f"drb_layer_3xf16: X {x.shape} ({x.dtype}, strides {x.strides}) with "
                             f"{'a' if mixing else 'no'} mixing source: needs a 16-byte aligned float32 "
                             f"(B, {HYPOTHESES}, N, {halves.k}) array with rows a multiple of 4 floats apart, "
                             f"and mixing_source(A1)")
        b, _, n, cin = x.shape
        residual, bias = self.input_side_epilogue_operands("drb_layer_3xf16", residual, bias, (b, HYPOTHESES, n, WIDE_COLS),
                                                        cp.dtype(cp.float32), 16)
        tiles, blocks = self.column_group_grid(b, n, LAYER_3XF16.tile_columns)
        head = (vertex_tile_map(x, LAYER_3XF16.k_slice), np.int32(cin), halves.stream, halves.scale, bias,
                np.uint64(0) if residual is None else residual)
        if score_weight is None:
            out = cp.empty((b, HYPOTHESES, n, WIDE_COLS), dtype=cp.float32)
            name, args = "wg_drb_layer_3xf16", head + (out,)
        else:
            if score_weight.shape != (WIDE_COLS, 2):
                raise ValueError(f"drb_layer_3xf16: the score layer's weight must be ({WIDE_COLS}, 2), got {score_weight.shape}")
            out = cp.empty((WIDE_COLS // LAYER_3XF16.tile_columns, b, HYPOTHESES, n, 2), dtype=cp.float32)
            name = "wg_drb_layer_3xf16_score"
            args = head + (cp.ascontiguousarray(score_weight, dtype=cp.float32), out, np.int64(b * HYPOTHESES * n))
        self._kernel(name, LAYER_3XF16.smem, mixing, LAYER_3XF16.source)((blocks,), (DRB_LAYER.threads,), args + (np.int32(n), np.int32(tiles)),
                                                    shared_mem=LAYER_3XF16.smem)
        return out
