"""The 16-bit chain family (kernels/wgmma_drb16_chain.cu, constants ``families.CHAIN``): a deformation
block's five wide layers in one kernel, the activations in shared memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import plan
from ...kernel_constants import HYPOTHESES
from .activations import activation_dtype
from .families import CHAIN, DRB_LAYER, OPERANDS, WIDE_COLS
from .gemm import PreparedWeight
from .layouts import chain_piece_index, vertex_tile_map


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


class ChainFamily:
    """:meth:`prepare_chain16` and :meth:`drb_chain16` (a mixin of :class:`HopperGemm`)."""

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
        if (
            len(weights) != CHAIN.hidden_layers
            or len(modes) != 1
            or first.passes
            or any(w.paired or w.k != WIDE_COLS or w.n != 2 * WIDE_COLS for w in weights)
            or first.paired
            or first.n != 2 * WIDE_COLS
            or not 0 < first.k <= CHAIN.max_cin
        ):
            raise ValueError(
                f"prepare_chain16: needs a first layer's unpaired 16-bit (cin <= {CHAIN.max_cin}, "
                f"{2 * WIDE_COLS}) weight and {CHAIN.hidden_layers} unpaired ({WIDE_COLS}, "
                f"{2 * WIDE_COLS}) weights, all "
                f"of one 16-bit mode, got {[(w.k, w.n, w.operands, w.paired) for w in (first,) + weights]}"
            )
        first_slices = -(-first.k // 32)  # prepare pads K to a multiple of 32 with zeros
        parts = [cp.take(first.big.reshape(-1), cp.asarray(chain_piece_index(first.big.shape[1], first_slices)))]
        index = cp.asarray(
            chain_piece_index(WIDE_COLS)
        )  # a 192-wide layer's big is (384, 192): k = 192 is a whole K tile
        parts += [cp.take(w.big.reshape(-1), index) for w in weights]
        stream = cp.concatenate([part.reshape(-1) for part in parts])
        bias = cp.stack([cp.ascontiguousarray(b, dtype=cp.float32).reshape(-1) for b in biases])
        if bias.shape != (CHAIN.hidden_layers + 1, WIDE_COLS):
            raise ValueError(
                f"prepare_chain16: needs {CHAIN.hidden_layers + 1} biases of ({WIDE_COLS},), got {bias.shape}"
            )
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
            raise ValueError(
                f"drb_chain16: X {x.shape} {x.dtype} (strides {x.strides}) with "
                f"{'a' if mixing else 'no'} mixing source: needs a 16-byte aligned (B, {HYPOTHESES}, N, "
                f"{chain.cin}) {act} array ({chain.operands}) with rows a multiple of 8 elements apart, "
                f"and mixing_source(A1)"
            )
        b, _, n, _ = x.shape
        tiles = b * -(-n // DRB_LAYER.vertices)
        head = (vertex_tile_map(x, 64), x, np.int64(x.strides[2] // 2), np.int32(chain.cin), chain.stream, chain.bias)
        if score_weight is None:
            out = cp.empty((b, HYPOTHESES, n, WIDE_COLS), dtype=act)
            name, args = f"wg_drb_chain_{OPERANDS[chain.operands].kernel_part}", head + (out,)
        else:
            if score_weight.shape != (WIDE_COLS, 2):
                raise ValueError(
                    f"drb_chain16: the score layer's weight must be ({WIDE_COLS}, 2), got {score_weight.shape}"
                )
            out = cp.empty((b, HYPOTHESES, n, 2), dtype=cp.float32)
            name = f"wg_drb_chain_score_{OPERANDS[chain.operands].kernel_part}"
            args = head + (cp.ascontiguousarray(score_weight, dtype=cp.float32), out)
        self._kernel(name, CHAIN.smem, mixing, CHAIN.source)(
            (min(tiles, self.sm_count),),
            (DRB_LAYER.threads,),
            args + (np.int32(n), np.int32(tiles)),
            shared_mem=CHAIN.smem,
        )
        return out
