"""The wgmma GEMM family (kernels/wgmma_gemm.cu, constants ``families.GEMM``): the launchers' shared
core (kernel loading, weight preparation, the input-side kernels' grid and epilogue operands) and
``C = act(A B + bias)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...cuda_kernels import get_arch_function
from .families import ARCH, DRB_LAYER, GEMM, MAX_DYNAMIC_SHARED_SIZE_BYTES, OPERANDS, WIDE_COLS


def supported(device) -> bool:
    """Whether ``device`` (a ``cupy.cuda.Device``) runs sm_90a code: compute capability exactly 9.0."""
    return str(device.compute_capability) == "90"


def smem_bytes(
    operands: str, bn: int = GEMM.bn, rows: int = GEMM.bm, stages: int = GEMM.stages, a16: bool = False
) -> int:
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
    (``paired``: B = [W0 | W1]) each 64 rows hold 32 columns of W0 and the same 32 of W1.
    ``interleaved``: each 32 columns' K in wg_interleaved_k's order, for the layer kernels that read
    A straight into registers (the training's, built with WG_DRB_DIRECT_A)."""

    big: object
    small: object
    k: int
    n: int
    operands: str
    paired: bool = False
    interleaved: bool = False

    @property
    def passes(self) -> int:
        """TF32 products per K step (3 or 1); 0 in the 16-bit modes."""
        return OPERANDS[self.operands].tf32_passes

    @property
    def small_arg(self):
        """The small part to pass a kernel: ``big`` again for one pass (the kernel then never reads it)."""
        return self.big if self.small is None else self.small


def _prepared_shape(k: int, n: int) -> tuple[int, int, tuple]:
    """A prepared (k, n) weight's padded rows and columns (Kp, Np: whole K slices and B tiles) and the
    grid of its preparing kernels (a grid-stride loop of 256 threads a block over Np * Kp)."""
    kp, np_ = -(-k // GEMM.bk) * GEMM.bk, -(-n // GEMM.bn) * GEMM.bn
    return kp, np_, (min(-(-(np_ * kp) // 256), 4096),)


class HopperCore:
    """What every Hopper family's launcher uses, and the GEMM (a base of :class:`HopperGemm`)."""

    def __init__(self, cupy):
        self.cupy = cupy
        self.sm_count = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
        self._kernels: dict = {}
        self._split = get_arch_function(GEMM.source, "wg_split_weight", ARCH, ("-std=c++17",))
        self._pack16 = get_arch_function(GEMM.source, "wg_pack_weight16", ARCH, ("-std=c++17",))
        self._split_pair = None  # the training's (prepare_pair), built at its first call

    def _kernel(self, name: str, smem: int, prelude: str = "", source: str = GEMM.source):
        """The kernel, allowed ``smem`` bytes of dynamic shared memory (or the most a call asked for)."""
        entry = self._kernels.get((name, prelude))
        if entry is None:
            entry = self._kernels[(name, prelude)] = [
                get_arch_function(source, name, ARCH, ("-std=c++17",), prelude),
                0,
            ]
        if smem > entry[1]:
            from cupy_backends.cuda.api import driver

            # > 48 KB of dynamic shared memory needs the opt-in
            driver.funcSetAttribute(entry[0].ptr, MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
            entry[1] = smem
        return entry[0]

    def prepare(self, b, operands: str = "3xtf32", paired: bool = False) -> PreparedWeight:
        """Transpose, split (or round) and pad a float32 (k, n) matrix with unit column stride for
        ``operands`` (a key of :data:`OPERANDS`); ``paired``: b is [W0 | W1] of a deformation block
        layer (n = 2 cout, cout a multiple of 32)."""
        cp = self.cupy
        if operands not in OPERANDS:
            raise ValueError(f"operands={operands!r}: choose one of {', '.join(OPERANDS)}")
        k, n = b.shape
        if paired and n % (2 * DRB_LAYER.cols):
            raise ValueError(
                f"a paired weight needs 2 * cout columns with cout a multiple of {DRB_LAYER.cols}, got {n}"
            )
        passes = OPERANDS[operands].tf32_passes
        kp, np_, grid = _prepared_shape(k, n)
        head = (b, np.int64(b.strides[0] // 4), np.int32(k), np.int32(n), np.int32(kp), np.int32(np_))
        pair = np.int32(DRB_LAYER.cols if paired else 0)
        if passes == 0:
            big, small = cp.empty((np_, kp), dtype=cp.uint16), None
            self._pack16(grid, (256,), (*head, np.int32(operands == "bf16"), pair, big))
        else:
            big = cp.empty((np_, kp), dtype=cp.float32)
            small = cp.empty((np_, kp), dtype=cp.float32) if passes == 3 else None
            self._split(grid, (256,), (*head, np.int32(passes), pair, big, big if small is None else small))
        return PreparedWeight(big, small, k, n, operands, paired)

    def prepare_pair(self, w0, w1, interleaved: bool = False) -> PreparedWeight:
        """:meth:`prepare`'s 3xTF32 paired weight of a deformation layer from its W0 and W1 (k, cout) apart,
        in one launch: each half's columns zero-padded to a multiple of ``DRB_LAYER.cols``. W0 and W1 are
        float32 views of one layout (a transposed view is read in place). ``interleaved``: K in the order of
        the layer kernel that holds the weight and reads A straight into registers (``holds_weight``)."""
        cp = self.cupy
        if w0.shape != w1.shape or w0.strides != w1.strides or w0.dtype != cp.float32 or w1.dtype != cp.float32:
            raise ValueError(f"a paired weight's halves differ: {w0.shape} {w0.dtype} and {w1.shape} {w1.dtype}")
        k, cout = w0.shape
        width = -(-cout // DRB_LAYER.cols) * DRB_LAYER.cols
        kp, np_, grid = _prepared_shape(k, 2 * width)
        big, small = cp.empty((np_, kp), dtype=cp.float32), cp.empty((np_, kp), dtype=cp.float32)
        if self._split_pair is None:
            self._split_pair = get_arch_function(GEMM.source, "wg_split_pair", ARCH, ("-std=c++17",))
        self._split_pair(
            grid,
            (256,),
            (
                w0,
                w1,
                np.int64(w0.strides[0] // 4),
                np.int64(w0.strides[1] // 4),
                np.int32(k),
                np.int32(cout),
                np.int32(width),
                np.int32(kp),
                np.int32(np_),
                np.int32(DRB_LAYER.cols),
                np.int32(interleaved),
                big,
                small,
            ),
        )
        return PreparedWeight(big, small, k, 2 * width, "3xtf32", True, interleaved=interleaved)

    def __call__(self, a, weight: PreparedWeight, out, bias=None, relu: bool = False):
        """out (m, n) = act(a (m, k) @ B + bias); ``a`` and ``out`` row-strided views with unit column stride."""
        if not weight.passes or weight.paired:
            raise ValueError(
                f"the Hopper GEMM takes an unpaired TF32 weight, got {weight.operands} (paired={weight.paired})"
            )
        m, k = a.shape
        lda, ldc = a.strides[0] // 4, out.strides[0] // 4
        vec = lda % 4 == 0 and a.data.ptr % 16 == 0
        tiles = -(-m // GEMM.bm) * (weight.big.shape[0] // GEMM.bn)
        name = f"wg_gemm_{OPERANDS[weight.operands].kernel_part}_{'v' if vec else 's'}"
        self._kernel(name, smem_bytes(weight.operands))(
            (tiles,),
            (GEMM.threads,),
            (
                a,
                np.int64(lda),
                weight.big,
                weight.small_arg,
                np.int64(weight.big.shape[1]),
                out,
                np.int64(ldc),
                np.int32(m),
                np.int32(weight.n),
                np.int32(k),
                np.uint64(0) if bias is None else bias,
                np.int32(bool(relu)),
            ),
            shared_mem=smem_bytes(weight.operands),
        )
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
                raise ValueError(
                    f"{name}: the residual must start {align}-byte aligned, got address {residual.data.ptr:#x}"
                )
        bias = cp.ascontiguousarray(bias, dtype=cp.float32)
        if bias.shape != (WIDE_COLS,):
            raise ValueError(f"{name}: bias must be ({WIDE_COLS},), got {bias.shape}")
        return residual, bias
