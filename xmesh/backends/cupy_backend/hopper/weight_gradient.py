"""The weights' gradient family (kernels/wgmma_wgrad.cu, constants ``families.WEIGHT_GRADIENT``):
``at.T @ b`` for two float32 matrices that both lie K-outermost, as a deformation layer's weights'
gradient X^T [dZ | A1^T dZ] does, in 3xTF32 warpgroup MMAs with K split over the multiprocessors.
"""

from __future__ import annotations

import numpy as np

from ...cuda_kernels import get_arch_function
from .families import ARCH, WEIGHT_GRADIENT

#: Each split takes at least this many rows of K (a few hundred slices of 32 at batch 1).
MIN_SPLIT_ROWS = 1024


class WeightGradientFamily:
    """:meth:`transposed_product` (a mixin of :class:`HopperGemm`)."""

    def transposed_product(self, at, b, bn: int | None = None):
        """``at.T @ b`` (M, N) for float32 ``at`` (K, M) and ``b`` (K, N), rows 16-byte aligned with unit
        column stride (:meth:`takes_transposed` says whether they are). The kernel's tile rows are
        b's columns and its tile columns at's; the reduction of the K splits writes the transpose.
        ``bn``: the build's tile columns (one of WEIGHT_GRADIENT.widths; by default the one that pads
        at's columns least)."""
        cp = self.cupy
        k, m = at.shape
        n = b.shape[1]
        bn = bn or WEIGHT_GRADIENT.width_for(m)
        name, smem = WEIGHT_GRADIENT.name(bn), WEIGHT_GRADIENT.smem(bn)
        tiles = -(-n // WEIGHT_GRADIENT.rows) * -(-m // bn)
        splits = max(1, min(self.sm_count // tiles, k // MIN_SPLIT_ROWS))
        chunk = -(-k // (splits * WEIGHT_GRADIENT.bk)) * WEIGHT_GRADIENT.bk
        splits = -(-k // chunk)
        parts = cp.empty((splits, n, m), dtype=cp.float32)
        self._kernel(name, smem, source=WEIGHT_GRADIENT.source)(
            (tiles, splits),
            (WEIGHT_GRADIENT.threads,),
            (
                b,
                np.int64(b.strides[0] // 4),
                at,
                np.int64(at.strides[0] // 4),
                parts,
                np.int32(n),
                np.int32(m),
                np.int32(k),
                np.int32(chunk),
                np.int64(n * m),
            ),
            shared_mem=smem,
        )
        out = cp.empty((m, n), dtype=cp.float32)
        reduce = get_arch_function(WEIGHT_GRADIENT.source, "wg_wgrad_reduce", ARCH, ("-std=c++17",))
        reduce(
            (min(-(-m * n // 256), 1024),),
            (256,),
            (parts, np.int32(splits), np.int64(n * m), np.int32(n), np.int32(m), out, np.int64(n)),
        )
        return out

    @staticmethod
    def takes_transposed(at, b) -> bool:
        """Whether :meth:`transposed_product` reads ``at`` and ``b`` as they lie: float32 rows with unit
        column stride, starting 16-byte aligned (row strides of whole 16 bytes), and a K of rows."""
        return (
            all(
                x.dtype.itemsize == 4 and x.strides[1] == 4 and x.strides[0] % 16 == 0 and x.data.ptr % 16 == 0
                for x in (at, b)
            )
            and at.shape[0] > 0
        )
