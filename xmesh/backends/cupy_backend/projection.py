"""The projections, each one launch of ``kernels/projection.cu``: stage 1's graph projection (camera
transform, 4 gathers per view, max / mean / std over views) and stage 2's local projection (3 x 4
bilinear taps per view, pooling; in the 16-bit modes on an H100/H200, its output in 16 bits).
"""

from __future__ import annotations

import numpy as np

from ...errors import InputError
from ..kernel_constants import (
    GRAPH_POINTS,
    GRAPH_THREADS,
    LOCAL_POINTS,
    LOCAL_TAP_BYTES,
    LOCAL_THREADS,
    MAX_VIEWS,
    PROJECTION_FILE,
)
from . import hopper as hg
from .device import LAYER_OPERANDS, THREADS

SOURCE = PROJECTION_FILE


class ProjectionStage:
    """``op_graph_projection`` and ``op_local_projection`` (a mixin of CupyBackend)."""

    def _projection_kernel(self, name: str):
        return self._stage_kernel(SOURCE, name)

    def _projection(
        self, kernel: str, points, maps, tf, count: int, padded: int, *extra, out16: str = "", carried=None
    ):
        """Launch a projection kernel: one thread per (sample, point, channel of the maps' concatenation),
        or for the local projection with channel counts a multiple of 4, one block per LOCAL_POINTS
        points. ``out16`` ("fp16" / "bf16", local projection only): the output in that mode's 16-bit
        activation type (hopper.activation_dtype), rows padded to a multiple of 8 elements, where
        the tiled kernel applies (float32 otherwise). ``carried`` (B,N,E) float32: columns that follow
        the projection's in each row (rows then padded to a multiple of 4 floats)."""
        cp = self.cupy
        if len(maps) != count:
            raise InputError(f"the {kernel} kernel takes {count} maps, got {len(maps)}")
        if tf.num_views > MAX_VIEWS:
            raise InputError(f"the projection kernels take at most {MAX_VIEWS} views, got {tf.num_views}")
        points = cp.ascontiguousarray(points, dtype=cp.float32)
        batch, n, _ = points.shape
        maps = [cp.ascontiguousarray(m, dtype=cp.float32) for m in maps]
        sizes = [np.int32(m.shape[1] - padded) for m in maps]
        chans = [np.int32(m.shape[3]) for m in maps]
        ct = int(sum(int(c) for c in chans))
        width = 3 + 3 * ct
        extra_cols = 0 if carried is None else carried.shape[-1]
        # rows padded to a multiple of 4 floats (a view of the first `width` is returned), so the layer
        # that reads them can copy 16 bytes at a time: stage 2's, and stage 1's where it appends columns
        # (its next layer then reads (M, 3075) with rows 3076 apart; pad column never read)
        row = -(-(width + extra_cols) // 4) * 4 if kernel == "local_projection" or carried is not None else width
        row16 = -(-width // 8) * 8
        tiled_shared = LOCAL_POINTS * ((row16 * 2 if out16 else row * 4) + 3 * tf.num_views * LOCAL_TAP_BYTES)
        tiled = (
            kernel == "local_projection"
            and all(c % 4 == 0 for c in chans)
            and tiled_shared <= self._max_shared_per_block  # its rows in shared memory: up to ~580 channels (float32)
            and all(m.shape[1] * m.shape[2] * m.shape[3] * tf.num_views < 2**31 for m in maps)
        )  # 32-bit offsets
        dtype, shared, block = cp.float32, 0, THREADS
        grid = ((batch * n * ct + THREADS - 1) // THREADS,)
        if tiled and all(m.data.ptr % 16 == 0 for m in maps):
            # a block per LOCAL_POINTS points: their bilinear corners once in shared memory, then a thread
            # per 4 channels with 16-byte gathers
            kernel, grid = "local_projection_tiled", ((batch * n + LOCAL_POINTS - 1) // LOCAL_POINTS,)
            if out16:  # 16-bit rows of a multiple of 8 elements: 16-byte aligned for the layer's copies
                kernel, dtype, row = "local_projection_tiled_o16", hg.activation_dtype(cp, out16), row16
            block, shared = LOCAL_THREADS, tiled_shared
        if (
            kernel == "graph_projection"
            and self.tiled_graph_projection
            and all(c % 4 == 0 for c in chans)
            and all(m.size < 2**31 and m.data.ptr % 16 == 0 for m in maps)
        ):  # 32-bit offsets, 16-byte gathers
            # a block per GRAPH_POINTS points: their pixels once in shared memory, a thread per 4 channels
            kernel, grid, block = "graph_projection_tiled", (-(-(batch * n) // GRAPH_POINTS),), GRAPH_THREADS
        out = cp.empty((batch, n, row), dtype=dtype)
        args = (
            points,
            tf.packed,
            *maps,
            *sizes,
            *chans,
            np.int32(batch),
            np.int32(n),
            np.int32(tf.num_views),
            *extra,
            out,
            np.int64(row),
        )
        if dtype != cp.float32:
            args += (np.int32(out16 == "bf16"),)
        function = self._projection_kernel(kernel)
        if shared > 48 * 1024 and function.max_dynamic_shared_size_bytes < shared:
            function.max_dynamic_shared_size_bytes = shared  # > 48 KB needs the opt-in
        function(grid, (block,), args, shared_mem=shared)
        width += extra_cols
        if extra_cols:
            out[..., width - extra_cols : width] = carried
        return out if row == width else out[..., :width]

    def op_graph_projection(self, coords, maps, tf, view_quirk=True, carried=None, map_views=None):
        """The stage-1 projection in one kernel; ``carried``'s columns are written after it into the same
        rows, padded to 16 bytes (op_graph_conv reads them in place: no concatenation, no padded copy).
        ``map_views``: views per sample in ``maps`` (the model's check); None: every view."""
        if map_views is None:
            map_views = tf.num_views
        if carried is not None:
            carried = self.cupy.asarray(carried, dtype=self.cupy.float32)
            if carried.shape[:2] != coords.shape[:2]:
                raise InputError(
                    f"graph projection: carried features of shape {carried.shape} for {coords.shape[:2]} points"
                )
        return self._projection(
            "graph_projection", coords, maps, tf, 4, 0, np.int32(bool(view_quirk)), np.int32(map_views), carried=carried
        )

    def op_local_projection(self, points, maps, tf):
        """The stage-2 projection; in the 16-bit modes on an H100/H200 its output is already in the
        mode's 16 bits (the values the block's first layer rounds its X to, so the same layer)."""
        operands = LAYER_OPERANDS[self.precision]
        out16 = operands if self.hopper is not None and hg.OPERANDS[operands].is_16bit else ""
        return self._projection("local_projection", points, maps, tf, 3, 1, out16=out16)
