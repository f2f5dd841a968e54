"""The Hopper kernels' families and their constants, one frozen dataclass each (the values their
``kernels/wgmma_*.cu`` files define; tests/test_kernel_sources.py compares them), and the operand modes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ...kernel_constants import HYPOTHESES

#: The target the Hopper kernels are built for: wgmma exists only there.
ARCH = "sm_90a"
#: The deformation blocks' wide layers' output columns.
WIDE_COLS = 192


@dataclass(frozen=True)
class GemmKernel:
    """The wgmma GEMM (``wg_gemm_*``, kernels/wgmma_gemm.cu): tile of C per block (rows, columns), K
    slice, ring depth, threads; float32 A rows are padded by 4 floats (``a_stride``)."""

    source: str = "wgmma_gemm.cu"
    bm: int = 128
    bn: int = 128
    bk: int = 32
    stages: int = 4
    threads: int = 256

    @property
    def a_stride(self) -> int:
        return self.bk + 4


@dataclass(frozen=True)
class LayerKernel:
    """A deformation block's layer (``wg_drb_layer_*``, kernels/wgmma_gemm.cu): tile rows (4 vertices x 43
    hypotheses, padded), vertices a tile, output columns (the block's 64 B columns are 32 of W0 and the
    same 32 of W1), ring depth, threads (3 MMA warpgroups and an epilogue warpgroup). The input-side
    kernels (the chain, the three-half-products layer) share its vertex tile and block."""

    source: str = "wgmma_gemm.cu"
    rows: int = 192
    vertices: int = 4
    cols: int = 32
    stages: int = 3
    threads: int = 512

    @property
    def staging_bytes(self) -> int:
        """Shared memory after the ring: the y0/y1 tiles (rows of 40 floats), the residual tile (172 rows
        of 32 floats), A1 (43 rows of 44 floats) and the ring's barriers (WG_DRB_STAGING_BYTES)."""
        return (2 * self.rows * 40 + HYPOTHESES * self.vertices * 32 + HYPOTHESES * 44) * 4 + 64

    #: Bytes of one 32-row K slice of a block's paired B columns (big and small parts) held in shared memory
    #: for all its tiles (WG_HELD_SLICE).
    held_slice: int = 2 * 64 * 128

    #: A streamed forward's slots for A's K slices (WG_DRB_SLOTS) and the bytes of one (WG_DRB_SLOT_BYTES:
    #: a tile's 172 rows of 32 floats, rounded up to the 128-byte swizzle's 1024-byte period).
    slots: int = 3
    slot_bytes: int = 22 * 1024

    @property
    def streamed_threads(self) -> int:
        """A streamed forward's threads: a producer warpgroup beside the MMA and epilogue warpgroups."""
        return self.threads + 128

    def held_smem(self, k: int, gradient: bool = False, lean: bool = False, streamed: bool = False) -> int:
        """Shared memory of a block that holds a K of k (WG_DRB_DIRECT_A): every K slice of the block's B
        columns in the ring's place, the slots of a ``streamed`` forward (WG_DRB_STREAMED), the staging
        (the carried gradient's with ``gradient``, the lean one with ``lean`` or ``streamed``) after
        them, and the alignment slack."""
        if gradient:
            staging = self.gradient_staging_bytes
        else:
            staging = self.lean_staging_bytes if lean or streamed else self.staging_bytes
        slots = self.slots * self.slot_bytes if streamed else 0
        return -(-k // GEMM.bk) * self.held_slice + slots + staging + 1024

    @property
    def gradient_staging_bytes(self) -> int:
        """The same for ``wg_drb_layer_3x_v_grad``: the y0/y1 tiles' 172 hypothesis rows, the residual
        and mask tiles, the barriers (WG_DRB_GRADIENT_STAGING_BYTES)."""
        rows = HYPOTHESES * self.vertices
        return (2 * rows * 40 + 2 * rows * 32) * 4 + 64

    @property
    def lean_staging_bytes(self) -> int:
        """The same for a forward without a residual built with WG_DRB_LEAN: the y tiles' 172 hypothesis
        rows of 36 floats and the barriers (WG_DRB_LEAN_STAGING_BYTES), so that a 339-wide layer's
        weight fits beside it."""
        return 2 * HYPOTHESES * self.vertices * 36 * 4 + 64


GEMM = GemmKernel()
DRB_LAYER = LayerKernel()
#: The most dynamic shared memory a block may have on compute capability 9.0.
BLOCK_SMEM_LIMIT = 232448


@dataclass(frozen=True)
class ChainKernel:
    """A deformation block's five wide layers in one kernel (kernels/wgmma_drb16_chain.cu, 16-bit
    modes): the 192-wide layers after the first, their 32-column K slices, the most inputs its first
    layer takes (a block's first layer has 339), and a block's shared memory (two activation buffers
    and the Z slots of 176 rows x 128 bytes per 64 columns, six W pieces of 192 rows x 64 bytes,
    alignment slack: 232448 bytes, all a block may have on compute capability 9.0)."""

    source: str = "wgmma_drb16_chain.cu"
    hidden_layers: int = 4
    k_slices: int = 6
    max_cin: int = 384
    smem: int = (2 * 3 + 1) * 176 * 128 + 6 * WIDE_COLS * 64 + 1024


@dataclass(frozen=True)
class Layer3xf16Kernel:
    """The "fp32" mode's deformation layer as three float16 products (kernels/wgmma_drb32h.cu): the
    mixing on the input side, tiles of 4 vertices by 96 of the 192 output columns (each K slice's
    products summed on their own, for float32's accuracy), W streamed. K slice, tile columns; shared
    memory: three X and two Z slots of 192 rows x 128 bytes (32 float32 columns), four W slots of four
    96 x 32 float16 pieces, the slots' barriers (128 bytes), alignment slack; each W column's
    power-of-two scale puts its largest entry in [2^w_exponent, 2^(w_exponent + 1))."""

    source: str = "wgmma_drb32h.cu"
    k_slice: int = 32
    tile_columns: int = 96
    smem: int = 5 * DRB_LAYER.rows * 128 + 4 * 4 * 96 * 64 + 128 + 1024
    w_exponent: int = 7


CHAIN = ChainKernel()
LAYER_3XF16 = Layer3xf16Kernel()


@dataclass(frozen=True)
class WeightGradientKernel:
    """The training's weights' gradients P = U^T V (kernels/wgmma_wgrad.cu, ``wg_wgrad_n<bn>``): a
    block's U columns (two warpgroups), K slice, threads, ring depth, and the widths of V's columns a
    block takes in each build (m64n<bn>k8). A ring stage holds the raw U and V slices (U's K rows
    padded by 8 floats); two transposed V slices (big and small parts, rows of 128 bytes) sit before
    the ring."""

    source: str = "wgmma_wgrad.cu"
    rows: int = 128
    bk: int = 32
    threads: int = 256
    stages: int = 4
    widths: tuple = (128, 96, 64)

    def width_for(self, columns: int) -> int:
        """The build for V's ``columns``: the width that pads them least, the widest of those (wider
        wgmmas run nearer the tensor cores' rate: 192 columns take 96, 339 take 128)."""
        return min(self.widths, key=lambda bn: (-(-columns // bn) * bn, -bn))

    def stage_bytes(self, bn: int) -> int:
        return self.bk * (self.rows + 8 + bn) * 4

    def split_bytes(self, bn: int) -> int:
        return 2 * bn * 128

    def name(self, bn: int) -> str:
        return f"wg_wgrad_n{bn}"

    def smem(self, bn: int) -> int:
        return self.stages * self.stage_bytes(bn) + 2 * self.split_bytes(bn) + 1024


WEIGHT_GRADIENT = WeightGradientKernel()


class OperandMode(NamedTuple):
    """How a Hopper kernel's products take their operands: ``code`` the WG_* value in
    kernels/wgmma_common.cuh, ``kernel_part`` the kernel-name part, ``tf32_passes`` 3 (3xTF32), 1
    (TF32) or 0 (16-bit operands)."""

    code: int
    kernel_part: str
    tf32_passes: int

    @property
    def is_16bit(self) -> bool:
        """float16 or bfloat16 operands (and, in the deformation layers, 16-bit activations)."""
        return self.tf32_passes == 0


#: Operand modes by name.
OPERANDS = {
    "3xtf32": OperandMode(3, "3x", 3),
    "tf32": OperandMode(1, "1x", 1),
    "fp16": OperandMode(16, "f16", 0),
    "bf16": OperandMode(17, "bf16", 0),
}
#: CUfunction_attribute CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
