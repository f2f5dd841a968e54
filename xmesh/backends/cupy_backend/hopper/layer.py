"""The deformation layer family (``wg_drb_layer_*`` in kernels/wgmma_gemm.cu, constants
``families.DRB_LAYER``): a whole local graph convolution in one kernel.
"""

from __future__ import annotations

import numpy as np

from ...kernel_constants import HYPOTHESES
from .activations import activation_dtype
from .families import BLOCK_SMEM_LIMIT, DRB_LAYER, GEMM, OPERANDS
from .gemm import PreparedWeight, smem_bytes
from .layouts import hypothesis_rows, vertex_tile_map


def _x_and_weight(x, ldx: int, weight: PreparedWeight) -> tuple:
    """The layer kernels' first arguments: X, its row stride and width, the prepared weight's parts and row stride."""
    return (x, np.int64(ldx), np.int32(x.shape[3]), weight.big, weight.small_arg, np.int64(weight.big.shape[1]))


class LayerFamily:
    """:meth:`drb_layer` (a mixin of :class:`HopperGemm`)."""

    def holds_weight(self, k: int, cout: int, gradient: bool = False, residual: bool = True) -> bool:
        """Whether the training's layer kernel takes a (k, cout) weight held in shared memory, with A read
        straight into registers (a module built with WG_DRB_DIRECT_A, for a weight prepared with
        ``prepare_pair(..., interleaved=True)``): every K slice of a block's B columns fits beside the
        staging (of :meth:`drb_layer_gradient` with ``gradient``; without a ``residual``, the forward's
        lean staging where the full one leaves no room), and the multiprocessors take at least one
        block per column tile."""
        return self._held_staging(k, gradient, residual) is not None and self.sm_count >= -(-cout // DRB_LAYER.cols)

    @staticmethod
    def _held_staging(k: int, gradient: bool, residual: bool, aligned: bool = True) -> str | None:
        """Which staging a block holding a K of k takes: "streamed" (a forward without a residual whose A
        slices also fit in shared memory, X's rows 16-byte ``aligned`` for its tensor map:
        WG_DRB_STREAMED, the lean staging, a producer warpgroup), "full" (or the gradient's), "lean" (a
        forward without a residual, WG_DRB_LEAN), or None where none fits."""
        streamed_fits = DRB_LAYER.held_smem(k, streamed=True) <= BLOCK_SMEM_LIMIT
        if not gradient and not residual and aligned and streamed_fits:
            return "streamed"
        if DRB_LAYER.held_smem(k, gradient) <= BLOCK_SMEM_LIMIT:
            return "full"
        if not gradient and not residual and DRB_LAYER.held_smem(k, lean=True) <= BLOCK_SMEM_LIMIT:
            return "lean"
        return None

    def _held_launch(
        self, weight: PreparedWeight, gradient: bool, tiles: int, residual: bool, aligned: bool = True
    ) -> tuple[int, int, str]:
        """(shared memory, blocks, prelude) of a layer kernel holding an interleaved weight: blocks a
        multiple of the column tiles, so that each keeps one; the prelude's defines choose the module."""
        cout = weight.n // 2
        if weight.operands != "3xtf32" or not self.holds_weight(weight.k, cout, gradient, residual):
            raise ValueError(f"a ({weight.k}, {weight.n}) {weight.operands} weight is not one the layer kernel holds")
        col_tiles = cout // DRB_LAYER.cols
        staging = self._held_staging(weight.k, gradient, residual, aligned)
        lean, streamed = staging == "lean", staging == "streamed"
        prelude = "#define WG_DRB_DIRECT_A 1\n"
        if lean or streamed:
            prelude += "#define WG_DRB_LEAN 1\n" + ("#define WG_DRB_STREAMED 1\n" if streamed else "")
        return (
            DRB_LAYER.held_smem(weight.k, gradient, lean, streamed),
            min(tiles, self.sm_count // col_tiles * col_tiles),
            prelude,
        )

    def drb_layer(
        self,
        x,
        weight: PreparedWeight,
        a1,
        bias,
        residual=None,
        mixing: str = "",
        out16: bool = False,
        keep_activation: bool = False,
    ):
        """relu(X W0 + A1 (X W1) + bias) (+ residual) for X (B, 43, N, cin) (rows may be padded: see
        :func:`hypothesis_rows`), ``weight`` the
        paired [W0 | W1], a1 (43, 43), bias (cout,), residual (B, 43, N, cout) or None. ``mixing``:
        :func:`mixing_source` of the same A1 to run the kernel built for it (zeros skipped).
        ``keep_activation`` (float32 output): (out, the values before the residual; out itself without a
        residual), both written in the same pass (the training's forward keeps a skip connection's ReLU
        output for its backward), by a module built with WG_DRB_ACTIVATION. An interleaved ``weight``
        (:meth:`holds_weight`) runs the module that holds it in shared memory (WG_DRB_DIRECT_A).

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
            raise ValueError(
                f"drb_layer: 16-bit X ({x.dtype}) or output (out16={out16}) needs a 16-bit mode "
                f"(weight {weight.operands}) and a 16-bit output"
            )
        act = activation_dtype(cp, weight.operands) if out16 else cp.dtype(cp.float32)
        if x16 and x.dtype != act:
            raise ValueError(f"drb_layer: X is {x.dtype}, the {weight.operands} activations are {act}")
        ldx = x.strides[2] // x.itemsize
        if residual is not None:  # the kernel copies its rows in 16-byte pieces
            if out16 and residual.dtype != act:
                raise ValueError(f"drb_layer: with out16 the residual must be {act}, got {residual.dtype}")
            residual = cp.ascontiguousarray(residual, dtype=act)
            if residual.shape != (b, hyp, n, cout) or residual.data.ptr % 16:
                raise ValueError(
                    f"drb_layer: residual {residual.shape} must be ({b}, {hyp}, {n}, {cout}), 16-byte aligned"
                )
        out = cp.empty((b, hyp, n, cout), dtype=act)
        if keep_activation and out16:
            raise ValueError("drb_layer: keep_activation is for a float32 output")
        activation = cp.empty_like(out) if keep_activation and residual is not None else None
        vec = ldx % (8 if x16 else 4) == 0 and x.data.ptr % 16 == 0
        if x16 and not vec:
            raise ValueError(f"drb_layer: 16-bit X needs 16-byte aligned rows (a multiple of 8 elements), got {ldx}")
        smem = (
            smem_bytes(weight.operands, 2 * DRB_LAYER.cols, DRB_LAYER.rows, DRB_LAYER.stages, a16=x16)
            + DRB_LAYER.staging_bytes
        )
        tiles = b * -(-n // DRB_LAYER.vertices) * (cout // DRB_LAYER.cols)
        blocks = min(tiles, self.sm_count)  # persistent blocks, one per multiprocessor
        code, part, _ = OPERANDS[weight.operands]
        if weight.interleaved and (x16 or out16 or not mixing):  # A straight into registers
            raise ValueError("drb_layer: an interleaved weight takes float32 X and output and one A1's mixing")
        if mixing:  # a module for one A1 holds one mode's kernels (WG_DRB_OPS)
            mixing += f"#define WG_DRB_OPS {code}\n"
        if keep_activation:
            mixing += "#define WG_DRB_ACTIVATION 1\n"
        if weight.interleaved:
            smem, blocks, held = self._held_launch(weight, False, tiles, residual is not None, aligned=vec)
            mixing += held
        io = "_h16" if x16 else ("_v" if vec else "_s") + ("_o16" if out16 else "")
        streamed, threads = (), DRB_LAYER.threads  # a streamed forward also takes X through a tensor map
        if "WG_DRB_STREAMED" in mixing:
            io, streamed, threads = "_v_streamed", (vertex_tile_map(x, GEMM.bk),), DRB_LAYER.streamed_threads
        self._kernel(f"wg_drb_layer_{part}{io}", smem, mixing, DRB_LAYER.source)(
            (blocks,),
            (threads,),
            (
                *streamed,
                *_x_and_weight(x, ldx, weight),
                a1,
                bias,
                np.uint64(0) if residual is None else residual,
                out,
                np.int32(n),
                np.int32(cout),
                np.int32(tiles),
                *((np.uint64(0) if activation is None else activation,) if keep_activation else ()),
            ),
            shared_mem=smem,
        )
        if keep_activation:
            return out, (out if activation is None else activation)
        return out

    def drb_layer_gradient(self, x, weight: PreparedWeight, mask, residual, mixing: str, keep: bool = False):
        """A layer's input gradient carried on through the ReLU of the layer before, in one kernel
        (``wg_drb_layer_3x_v_grad``): dx = X W0 + A1 (X W1) (+ residual) for X = dZ (B, 43, N, cin) with
        16-byte aligned rows, ``weight`` the paired 3xTF32 [W0^T | W1^T], ``mixing`` the
        :func:`mixing_source` of A1 (here the support's transpose); then dz = dx where ``mask`` (the
        layer before's ReLU output, (B, 43, N, cout) float32) is positive. Returns (dy, sums, dx): dy
        (B, 43, N, 2 cout) = [dz | A1 dz] over the hypotheses, sums (B, N, cout) dz's sums over them
        (as ``epilogues_cupy.relu_gradient_mixed``), dx only with ``keep`` (else None). An interleaved
        ``weight`` runs the module that holds it in shared memory, as :meth:`drb_layer`'s."""
        cp = self.cupy
        b, hyp, n, cin = x.shape
        cout = weight.n // 2
        if not weight.paired or weight.operands != "3xtf32" or hyp != HYPOTHESES or weight.k != cin:
            raise ValueError(f"drb_layer_gradient: X {x.shape} does not fit a paired 3xTF32 ({weight.k}, {weight.n})")
        x = hypothesis_rows(cp, x)
        ldx = x.strides[2] // 4
        if x.dtype != cp.float32 or ldx % 4 or x.data.ptr % 16:
            raise ValueError(
                f"drb_layer_gradient: X must be float32 with 16-byte aligned rows, got {x.dtype} {x.strides}"
            )
        shape = (b, hyp, n, cout)
        for name, value in (("mask", mask), ("residual", residual)):
            if value is not None and (value.shape != shape or value.dtype != cp.float32):
                raise ValueError(f"drb_layer_gradient: {name} must be {shape} float32, got {value.shape} {value.dtype}")
        mask = cp.ascontiguousarray(mask)
        if residual is not None:
            residual = cp.ascontiguousarray(residual)
        dy = cp.empty((b, hyp, n, 2 * cout), dtype=cp.float32)
        sums = cp.empty((b, n, cout), dtype=cp.float32)
        out = cp.empty(shape, dtype=cp.float32) if keep else None
        smem = (
            smem_bytes("3xtf32", 2 * DRB_LAYER.cols, DRB_LAYER.rows, DRB_LAYER.stages)
            + DRB_LAYER.gradient_staging_bytes
        )
        tiles = b * -(-n // DRB_LAYER.vertices) * (cout // DRB_LAYER.cols)
        prelude = "#define WG_DRB_GRADIENT 1\n#define WG_DRB_LINEAR 1\n" + mixing
        blocks = min(tiles, self.sm_count)
        if weight.interleaved:
            smem, blocks, held = self._held_launch(weight, True, tiles, residual is not None)
            prelude += held
        null = np.uint64(0)
        self._kernel("wg_drb_layer_3x_v_grad", smem, prelude, DRB_LAYER.source)(
            (blocks,),
            (DRB_LAYER.threads,),
            (
                *_x_and_weight(x, ldx, weight),
                null if residual is None else residual,
                mask,
                null if out is None else out,
                dy,
                sums,
                np.int32(n),
                np.int32(cout),
                np.int32(tiles),
            ),
            shared_mem=smem,
        )
        return dy, sums, out
