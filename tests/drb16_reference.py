"""The 16-bit chain's bit-exact reference: one deformation layer per launch (kernels/wgmma_drb16.cu).

The 16-bit modes run a deformation block's five wide layers as one kernel (HopperGemm.drb_chain16,
kernels/wgmma_drb16_chain.cu). That kernel computes each layer exactly as this one-layer kernel does,
so five calls of :func:`reference_layer16` must give the chain's x5 bit for bit
(tests/test_drb16_chain.py); this layer is itself checked against float64
(tests/test_drb16_reference.py). No precision mode runs it: it lives here, beside its tests.

    out = relu(X W0 + Z W1 + b) (+ res),   Z = A1 X rounded to the mode's 16 bits.
"""

from __future__ import annotations

import numpy as np

from xmesh.backends.cupy_backend.hopper import CHAIN, DRB_LAYER, OPERANDS, WIDE_COLS, activation_dtype, hypothesis_rows
from xmesh.backends.kernel_constants import HYPOTHESES

SOURCE = "wgmma_drb16.cu"
#: the largest cin whose W0 and W1 stay in shared memory with all 192 output columns in one tile;
#: up to CHAIN.max_cin inputs a tile takes 96 of them (the _n96 kernels: a block's first layer, cin 339)
WHOLE_TILE_MAX_CIN = 192
#: shared memory: W0 and W1 (up to 192 x 192 each), two X buffers and one Z buffer of 192 rows x 128
#: bytes, the bias, alignment slack
SMEM = (2 * (WHOLE_TILE_MAX_CIN // 64) + 2 + 1) * DRB_LAYER.rows * 128 + WIDE_COLS * 4 + 1024


def tile_columns(cin: int) -> int:
    """Output columns per tile for ``cin`` inputs: all 192 up to cin 192 (W0 and W1 whole in shared
    memory), else 96 (each block holds one half of their columns)."""
    return WIDE_COLS if cin <= WHOLE_TILE_MAX_CIN else WIDE_COLS // 2


def takes(x, weight, mixing: str) -> bool:
    """Whether the kernel runs this layer: 16-bit X with 16-byte aligned rows, an unpaired 16-bit
    [W0 | W1] of cin <= 384 rows and 2 x 192 columns, and the A1 built into ``mixing``."""
    cin = x.shape[-1]
    return (
        bool(mixing)
        and x.dtype.itemsize == 2
        and weight.passes == 0
        and not weight.paired
        and x.ndim == 4
        and weight.n == 2 * WIDE_COLS
        and weight.k == cin
        and 0 < cin <= CHAIN.max_cin
        and (x.strides[2] // 2) % 8 == 0
        and x.data.ptr % 16 == 0
    )


def reference_layer16(hopper, x, weight, bias, residual=None, mixing: str = ""):
    """One 16-bit deformation layer on ``hopper`` (a HopperGemm): X (B, 43, N, cin <= 384) in the mode's
    activation type, ``weight`` the *unpaired* 16-bit [W0 | W1] (``hopper.prepare(w, mode)``), residual
    (B, 43, N, 192) in the same type or None, ``mixing``: hopper.mixing_source of A1. Returns
    (B, 43, N, 192) in the activation type."""
    cp = hopper.cupy
    if not takes(x, weight, mixing):
        raise ValueError(
            f"reference_layer16: X {x.shape} ({x.dtype}, strides {x.strides}) with weight ({weight.k}, "
            f"{weight.n}, {weight.operands}, paired={weight.paired}) and "
            f"{'a' if mixing else 'no'} mixing source: needs 16-bit X with rows a multiple of 8 "
            f"elements apart, cin up to {CHAIN.max_cin}, an unpaired 16-bit (cin, {2 * WIDE_COLS}) "
            f"weight and mixing_source(A1)"
        )
    act = activation_dtype(cp, weight.operands)
    if x.dtype != act or hypothesis_rows(cp, x) is not x or x.shape[1] != HYPOTHESES:
        raise ValueError(
            f"reference_layer16: X must be (B, {HYPOTHESES}, N, cin) with evenly spaced rows, in the "
            f"{weight.operands} activations' type {act}; got {x.shape} {x.dtype}"
        )
    b, _, n, cin = x.shape
    residual, bias = hopper.input_side_epilogue_operands(
        "reference_layer16", residual, bias, (b, HYPOTHESES, n, WIDE_COLS), act, 16
    )
    out = cp.empty((b, HYPOTHESES, n, WIDE_COLS), dtype=act)
    columns = tile_columns(cin)
    tiles, blocks = hopper.column_group_grid(b, n, columns)
    name = f"wg_drb_reference16_{OPERANDS[weight.operands].kernel_part}" + ("_n96" if columns < WIDE_COLS else "")
    hopper._kernel(name, SMEM, mixing, SOURCE)(
        (blocks,),
        (DRB_LAYER.threads,),
        (
            x,
            np.int64(x.strides[2] // 2),
            np.int32(cin),
            weight.big,
            np.int64(weight.big.shape[1]),
            bias,
            np.uint64(0) if residual is None else residual,
            out,
            np.int32(n),
            np.int32(tiles),
        ),
        shared_mem=SMEM,
    )
    return out


def reference_block16(hopper, x, weights, biases, mixing: str):
    """A block's five wide layers by five :func:`reference_layer16` calls: x1 = lc1(X), x2 = lc2(x1),
    x3 = lc3(x2) + x1, x4 = lc4(x3), x5 = lc5(x4) + x3; returns x5."""
    x1 = reference_layer16(hopper, x, weights[0], biases[0], None, mixing)
    x2 = reference_layer16(hopper, x1, weights[1], biases[1], None, mixing)
    x3 = reference_layer16(hopper, x2, weights[2], biases[2], x1, mixing)
    x4 = reference_layer16(hopper, x3, weights[3], biases[3], None, mixing)
    return reference_layer16(hopper, x4, weights[4], biases[4], x3, mixing)
