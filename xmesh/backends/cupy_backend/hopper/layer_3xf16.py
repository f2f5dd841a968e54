"""The three-half-products layer family (kernels/wgmma_drb32h.cu, constants ``families.LAYER_3XF16``):
the fp32 mode's deformation layer as three float16 products, the mixing on the input side.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import plan
from ...kernel_constants import HYPOTHESES
from .families import DRB_LAYER, LAYER_3XF16, WIDE_COLS
from .layouts import piece_index, vertex_tile_map


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


class Layer3xf16Family:
    """:meth:`prepare_halves` and :meth:`drb_layer_3xf16` (a mixin of :class:`HopperGemm`)."""

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
        _, exponent = cp.frexp(largest)  # largest = m 2^exponent, m in [0.5, 1)
        shift = cp.where(largest > 0, LAYER_3XF16.w_exponent + 1 - exponent, 0).astype(cp.int32)
        scaled = cp.ldexp(w, cp.concatenate([shift, shift])[None, :])
        big = scaled.astype(cp.float16)
        small = (scaled - big.astype(cp.float32)).astype(cp.float16)
        slices = -(-k // LAYER_3XF16.k_slice)

        def k_major(part):  # (2 x 192, 32 slices): row c holds column c of [W0 | W1], zeros past k
            rows = cp.zeros((2 * WIDE_COLS, LAYER_3XF16.k_slice * slices), dtype=cp.uint16)
            rows[:, :k] = part.view(cp.uint16).T
            return rows.reshape(-1)

        index = cp.asarray(
            piece_index(LAYER_3XF16.k_slice * slices, slices, LAYER_3XF16.tile_columns)
        )  # (slice, group, W1 / W0, n, 4, 8)
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
            raise ValueError(
                f"drb_layer_3xf16: X {x.shape} ({x.dtype}, strides {x.strides}) with "
                f"{'a' if mixing else 'no'} mixing source: needs a 16-byte aligned float32 "
                f"(B, {HYPOTHESES}, N, {halves.k}) array with rows a multiple of 4 floats apart, "
                f"and mixing_source(A1)"
            )
        b, _, n, cin = x.shape
        residual, bias = self.input_side_epilogue_operands(
            "drb_layer_3xf16", residual, bias, (b, HYPOTHESES, n, WIDE_COLS), cp.dtype(cp.float32), 16
        )
        tiles, blocks = self.column_group_grid(b, n, LAYER_3XF16.tile_columns)
        head = (
            vertex_tile_map(x, LAYER_3XF16.k_slice),
            np.int32(cin),
            halves.stream,
            halves.scale,
            bias,
            np.uint64(0) if residual is None else residual,
        )
        if score_weight is None:
            out = cp.empty((b, HYPOTHESES, n, WIDE_COLS), dtype=cp.float32)
            name, args = "wg_drb_layer_3xf16", head + (out,)
        else:
            if score_weight.shape != (WIDE_COLS, 2):
                raise ValueError(
                    f"drb_layer_3xf16: the score layer's weight must be ({WIDE_COLS}, 2), got {score_weight.shape}"
                )
            out = cp.empty((WIDE_COLS // LAYER_3XF16.tile_columns, b, HYPOTHESES, n, 2), dtype=cp.float32)
            name = "wg_drb_layer_3xf16_score"
            args = head + (cp.ascontiguousarray(score_weight, dtype=cp.float32), out, np.int64(b * HYPOTHESES * n))
        self._kernel(name, LAYER_3XF16.smem, mixing, LAYER_3XF16.source)(
            (blocks,), (DRB_LAYER.threads,), args + (np.int32(n), np.int32(tiles)), shared_mem=LAYER_3XF16.smem
        )
        return out
