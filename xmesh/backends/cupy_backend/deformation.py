"""The deformation reasoning blocks: the local graph convolution (one Hopper kernel a layer, or a block's
five wide layers chained in the 16-bit modes; elsewhere a GEMM and ``kernels/deformation.cu``'s mixing
epilogue, or cuBLAS), the score layer with the softmax and the vertex update (``deformation.cu``).
"""

from __future__ import annotations

import numpy as np

from ...errors import KernelCompileError
from .. import cuda_kernels, kernel_manifest, plan
from ..kernel_constants import (
    DEFORMATION_FILE,
    HYPOTHESES,
    ROWS_BF16,
    ROWS_F16,
    ROWS_F32,
    SCORE_FINISH_THREADS,
    SCORE_FINISH_VERTICES,
    SCORE_THREADS,
    SCORE_VERTICES,
    SKINNY_MAX_COLS,
    SKINNY_MAX_K,
)
from . import hopper as hg
from .device import LAYER_OPERANDS, THREADS, _grid

#: A block's end kernels: (vertices, threads) a block.
_SCORE_BLOCKS = {
    "drb_score_update": (SCORE_VERTICES, SCORE_THREADS),
    "drb_score_finish": (SCORE_FINISH_VERTICES, SCORE_FINISH_THREADS),
}

SOURCE = DEFORMATION_FILE
#: The row format code (kernel_constants.ROWS_*) of each activation type the deformation.cu kernels read.
ROW_FORMATS = {"float32": ROWS_F32, "float16": ROWS_F16, "uint16": ROWS_BF16}


class DeformationStage:
    """The deformation blocks' fast paths (a mixin of CupyBackend)."""

    def _deformation_kernel(self, name: str):
        return self._stage_kernel(SOURCE, name)

    def _local_weights(self, layer, cheb1, cheb0):
        """(W0, W1, bias, A1, A0) in the GEMM dtype, split once per (layer, supports) objects."""

        def make():
            cp = self.cupy
            dtype = cp.float16 if self.precision == "fp16" else cp.float32
            cout = layer.cout
            if layer.weight0 is None:
                w0, w1 = layer.weight[:, :cout], layer.weight[:, cout:]
            else:
                w0, w1 = layer.weight0, layer.weight
            return (
                cp.ascontiguousarray(w0, dtype=dtype),
                cp.ascontiguousarray(w1, dtype=dtype),
                cp.ascontiguousarray(layer.bias, dtype=cp.float32),
                cp.ascontiguousarray(cheb1, dtype=dtype),
                None if cheb0 is None else cp.ascontiguousarray(cheb0, dtype=dtype),
            )

        return self._derived.get((layer, cheb1, cheb0), "local", make)

    def _mix(self, a, y):
        """a (K,K) applied over axis 1 of y (B,K,N,C): one GEMM per sample over (K, N*C)."""
        cp = self.cupy
        b, k, n, c = y.shape
        out = cp.empty_like(y)
        flat_y, flat_out = y.reshape(b, k, n * c), out.reshape(b, k, n * c)
        if y.dtype == cp.float32 and b > 1:
            cp.matmul(a, flat_y, out=flat_out)
        else:
            for i in range(b):
                cp.matmul(a, flat_y[i], out=flat_out[i])
        return out

    def _prepared_chain(self, layers, x, cheb0):
        """The block's five wide layers prepared for ``HopperGemm.drb_chain16`` (made once per layer
        set), or None where the chained kernel does not run them: off Hopper, in the float32 modes,
        with a non-identity first support, other widths, or an X it does not take."""
        operands = LAYER_OPERANDS[self.precision]
        z = hg.WIDE_COLS
        if (
            self.hopper is None
            or not hg.OPERANDS[operands].is_16bit
            or cheb0 is not None
            or len(layers) != hg.CHAIN.hidden_layers + 1
            or any(layer.weight0 is not None for layer in layers)
            or layers[0].weight.shape != (x.shape[-1], 2 * z)
            or not 0 < x.shape[-1] <= hg.CHAIN.max_cin
            or any(layer.weight.shape != (z, 2 * z) for layer in layers[1:])
            or x.dtype != hg.activation_dtype(self.cupy, operands)
            or not plan.chain_takes(x, x.shape[-1])
        ):
            return None

        def make():
            weights = [self._hopper_weight(layer.weight, operands, layer.weight) for layer in layers]
            return self.hopper.prepare_chain16(weights[0], weights[1:], [layer.bias for layer in layers])

        return self._derived.get(tuple(layer.weight for layer in layers), ("chain", operands), make)

    def op_drb_block_layers(self, layers, x, cheb1, cheb0=None):
        """A deformation block's five wide layers (the projected features X -> x5, in the model's
        ``block_tail``) in one Hopper kernel in the 16-bit modes (``HopperGemm.drb_chain16``: the
        activations stay in shared memory); None
        elsewhere, and the model runs the layers one by one."""
        chain = self._prepared_chain(layers, x, cheb0)
        return None if chain is None else self.hopper.drb_chain16(x, chain, self._mixing_source(cheb1))

    def op_drb_block_tail(self, layers, x, cheb1, cheb0, centers, offsets):
        """A deformation block from its projected features X to the moved vertices (the model's
        ``block_tail``) where the five wide layers chain (``op_drb_block_layers``): the score layer's
        two products in the last wide layer's epilogue (``drb_chain16`` with ``score_weight``: x5
        never leaves the chip, 8 bytes a row come back instead of 384), then ``drb_score_finish``
        mixes them, adds the bias, takes the softmax and moves the vertices (``drb_score_update``'s
        arithmetic, its float32 products summed in another order). None elsewhere."""
        score = layers[-1]
        if (
            not self.fuse_drb_score
            or len(layers) != hg.CHAIN.hidden_layers + 2
            or not plan.fusable_score(score)
            or x.shape[1] != HYPOTHESES
        ):
            return None
        chain = self._prepared_chain(layers[:-1], x, cheb0)
        if chain is None:
            return None
        rows = self.hopper.drb_chain16(x, chain, self._mixing_source(cheb1), score_weight=score.weight)
        return self._move_vertices(
            "drb_score_finish", (rows, np.int32(1), np.int64(0)), cheb1, score.bias, centers, offsets
        )

    def op_drb_last_layer_score(self, layer, score, x, residual, cheb1, cheb0, centers, offsets):
        """A deformation block's last wide layer, x5 = lc5(x4) + x3, and its score layer and vertex update
        (the model's ``block_tail`` after the first four layers) where the fp32 mode's layers run
        ``drb_layer_3xf16``: the score layer's two products in the layer's epilogue
        (``drb_layer_3xf16`` with ``score_weight``: x5 is never written, each of the two 96-column groups
        leaves 8 bytes a row), then ``drb_score_finish`` adds the groups' products, mixes them, adds the
        bias, takes the softmax and moves the vertices (``drb_score_update``'s arithmetic, its float32
        products summed in another order). None elsewhere."""
        if (
            not self.fuse_drb_score
            or self.hopper is None
            or cheb0 is not None
            or layer.weight0 is not None
            or not plan.fusable_score(score)
            or x.ndim != 4
            or x.shape[1] != HYPOTHESES
            or not self._runs_layer_3xf16(layer, x)
        ):
            return None
        rows, halves, mixing = hg.hypothesis_rows(self.cupy, x), self._halves(layer), self._mixing_source(cheb1)
        if not plan.layer_3xf16_takes(rows, halves.k, mixing):
            return None
        parts = self.hopper.drb_layer_3xf16(rows, halves, layer.bias, residual, mixing, score_weight=score.weight)
        return self._move_vertices(
            "drb_score_finish",
            (parts, np.int32(parts.shape[0]), np.int64(parts[0].size // 2)),
            cheb1,
            score.bias,
            centers,
            offsets,
        )

    def _runs_layer_3xf16(self, layer, x) -> bool:
        """Whether a deformation layer is ``drb_layer_3xf16``'s to run, its rows' layout aside
        (``plan.layer_3xf16_takes``): the fp32 mode with ``fp32_halves``, float32 X, a [W0 | W1] of
        X's width and 2 x 192 columns."""
        return (
            LAYER_OPERANDS[self.precision] == "3xtf32"
            and self.fp32_halves
            and x.dtype == self.cupy.float32
            and layer.weight.shape == (x.shape[-1], 2 * hg.WIDE_COLS)
        )

    def _halves(self, layer):
        """A layer's [W0 | W1] prepared for ``drb_layer_3xf16`` (HopperGemm.prepare_halves), once per weight."""
        return self._derived.get((layer.weight,), "halves", lambda: self.hopper.prepare_halves(layer.weight))

    def op_local_gconv(self, layer, x, cheb1, cheb0=None, residual=None):
        if cheb0 is None and layer.weight0 is None and x.shape[1] == HYPOTHESES:  # A_0 the identity
            if self.hopper is not None and layer.cout % hg.DRB_LAYER.cols == 0:
                return self._local_gconv_hopper(layer, x, cheb1, residual)
            if self.precision != "fp16" or self.hopper is not None:
                return self._local_gconv_fused(layer, x, cheb1, residual)
        return self._local_gconv_cublas(layer, x, cheb1, cheb0, residual)

    def _local_gconv_hopper(self, layer, x, cheb1, residual):
        """The whole layer in one Hopper kernel, its products with the precision mode's operands. The
        16-bit modes keep these layers' outputs in 16 bits (half the bytes to write and to read back
                as the next layer's X and residual), and the narrow last layer reads them through
                ``_skinny16`` (a block's wide layers run chained, ``op_drb_block_tail``, where the chain takes
                them). The fp32 mode's layers run ``drb_layer_3xf16`` (three
                float16 products of 22-bit operand parts, the mixing on the input side, each K slice summed on
                its own and added in float32) where it takes X; the tf32 mode's, ``drb_layer``."""
        cp = self.cupy
        operands = LAYER_OPERANDS[self.precision]
        out16 = hg.OPERANDS[operands].is_16bit
        if out16 and residual is not None and residual.dtype == cp.float32:
            residual = hg.narrow16(cp, residual, operands)
        rows, mixing = hg.hypothesis_rows(cp, x), self._mixing_source(cheb1)
        if self._runs_layer_3xf16(layer, x):
            halves = self._halves(layer)
            if plan.layer_3xf16_takes(rows, halves.k, mixing):
                return self.hopper.drb_layer_3xf16(rows, halves, layer.bias, residual, mixing)
        weight = self._hopper_weight(layer.weight, operands, layer.weight, paired=True)
        return self.hopper.drb_layer(
            rows,
            weight,
            cp.ascontiguousarray(cheb1, dtype=cp.float32),
            layer.bias,
            residual,
            mixing=mixing,
            out16=out16,
        )

    def training_layer(
        self,
        x,
        w0,
        w1,
        bias,
        a1,
        relu: bool = True,
        support_transposed: bool = False,
        residual=None,
        mask=None,
        keep=False,
        keep_activation=False,
    ):
        """The training passes' deformation layer (lent to ``xmesh.model.products.deformation_layer``):
        act(X W0 + A1 (X W1) + bias) (+ residual, added after act) for float32 X (B, 43, N, cin) in the
        Hopper layer kernel with 3xTF32 products whatever this backend's mode (float32's accuracy), act
        the ReLU or none (``relu=False``, a module built with WG_DRB_LINEAR); bias None is zero. An
        output width that is not a multiple of 32 takes zero weight columns up to one and comes back as a
        view of the first ``cout`` columns; such a width declines a residual. None off Hopper and for
        layers narrower than 32 columns either way (the score layer). ``keep_activation``: (output,
        act(...) before the residual), written in the same pass. The weights change every step: W0 and
        W1 are split into the kernel's paired TF32 parts at every call, in one launch (``prepare_pair``).

        With ``mask`` (the ReLU output of the layer before, the output's shape; ``relu=False``) the output
        is carried on through that ReLU in the same pass (``drb_layer_gradient``): (dy, sums, output or
        None, kept with ``keep``); None unless ``cout`` is a multiple of 32, the mask float32 and X's rows
        16-byte aligned.

        Not the fp32 inference's ``drb_layer_3xf16``: preparing its float16 halves of W at every step
        takes some fifteen launches a layer, and its forward moved the golden stage-2 gradients further
        from the original's (97.2% within 1e-3 against 100%)."""
        cp = self.cupy
        cin, cout = w0.shape
        cols = hg.DRB_LAYER.cols
        if self.hopper is None or x.shape[1] != HYPOTHESES or x.shape[3] != cin or min(cin, cout) < cols:
            return None
        if residual is not None and (cout % cols or residual.dtype != cp.float32):
            return None  # the kernel adds a residual of the output's whole width, in float32
        support, mixing = self._training_support(a1, support_transposed)
        if mask is not None:
            return self._training_gradient(x, w0, w1, mixing, mask, residual, keep)
        width = -(-cout // cols) * cols
        full_bias = bias
        if width != cout or bias is None or bias.dtype != cp.float32 or not bias.flags.c_contiguous:
            full_bias = cp.zeros(width, dtype=cp.float32)
            if bias is not None:
                full_bias[:cout] = bias
        out, activation = self.hopper.drb_layer(
            hg.hypothesis_rows(cp, x),
            self.hopper.prepare_pair(
                w0, w1, interleaved=self.hopper.holds_weight(cin, width, residual=residual is not None)
            ),
            support,
            full_bias,
            residual,
            mixing=mixing if relu else "#define WG_DRB_LINEAR 1\n" + mixing,
            keep_activation=True,  # one module for every forward layer, the ReLU output kept where a residual is
        )
        if width != cout:  # no residual (its width is whole): the two are the same array
            out = activation = out[..., :cout]
        return (out, activation) if keep_activation else out

    def _training_gradient(self, x, w0, w1, mixing, mask, residual, keep):
        """:meth:`training_layer` with a mask: the input gradient through the ReLU before, or None."""
        cp = self.cupy
        cout = w0.shape[1]
        rows = hg.hypothesis_rows(cp, x)
        if (
            cout % hg.DRB_LAYER.cols
            or mask.dtype != cp.float32
            or mask.shape != x.shape[:3] + (cout,)
            or (rows.strides[2] // 4) % 4
            or rows.data.ptr % 16
        ):
            return None
        weight = self.hopper.prepare_pair(
            w0, w1, interleaved=self.hopper.holds_weight(w0.shape[0], cout, gradient=True)
        )
        return self.hopper.drb_layer_gradient(rows, weight, mask, residual, mixing, keep)

    def _training_support(self, a1, transposed: bool):
        """(A1 or A1^T as a contiguous float32 device array, its mixing source), made once per support."""

        def make():
            host = np.asarray(self.to_numpy(a1), dtype=np.float32)
            host = np.ascontiguousarray(host.T if transposed else host)
            return self.cupy.asarray(host), hg.mixing_source(host)

        return self._derived.get((a1,), ("training support", transposed), make)

    def _skinny16(self, x, weight):
        """y = X W (float32 sums) for 16-bit activations X (..., K) and a narrow float32 W (K, <= 8),
        reading X as it is (the narrow last layer of a block in the 16-bit modes); None where that
        kernel does not apply (float32 X, wide W, unaligned rows)."""
        cp = self.cupy
        k, nw = weight.shape
        if (
            x.dtype not in (cp.float16, cp.uint16)
            or nw > SKINNY_MAX_COLS
            or k > SKINNY_MAX_K
            or weight.dtype != cp.float32
        ):
            return None
        rows = hg.hypothesis_rows(cp, x)  # unit-stride rows, evenly spaced
        ldx = rows.strides[-2] // 2
        if ldx % 8 or rows.data.ptr % 16:
            return None
        m = int(np.prod(rows.shape[:-1]))
        y = cp.empty((m, nw), dtype=cp.float32)
        self._deformation_kernel("skinny_gemm16")(
            _grid(m),
            (THREADS,),
            (
                rows,
                np.int64(ldx),
                cp.ascontiguousarray(weight),
                y,
                np.int64(m),
                np.int32(k),
                np.int32(nw),
                np.int32(x.dtype == cp.uint16),
            ),
        )
        return y

    def _activation_f32(self, x):
        """float32 values of a deformation activation (16-bit ones from ``_local_gconv_hopper`` widened)."""
        cp = self.cupy
        if x is None or x.dtype == cp.float32:
            return x
        return hg.widen16(cp, x, "bf16" if x.dtype == cp.uint16 else "fp16")

    def _local_gconv_fused(self, layer, x, cheb1, residual):
        """One product y = X [W0 | W1] (``layer.weight``, fused when A_0 is the identity): a tensor-core
        GEMM, or for 16-bit X (the narrow last layers in the 16-bit modes on compute capability 9.0)
        ``_skinny16``; then the mixing and epilogue kernel."""
        cp = self.cupy
        b, k, n, cin = x.shape
        cout = layer.cout
        residual = self._activation_f32(residual)
        y = self._skinny16(x, layer.weight)
        if y is None:
            x = self._activation_f32(x)
            y = self.gemm(
                cp.ascontiguousarray(x, dtype=cp.float32).reshape(b * k * n, cin), layer.weight, cache_key=layer.weight
            )
        out = cp.empty((b, k, n, cout), dtype=cp.float32)
        res = np.uint64(0) if residual is None else cp.ascontiguousarray(residual, dtype=cp.float32)
        columns = b * n * cout
        self._deformation_kernel("drb_mix_epilogue")(
            _grid(columns),
            (THREADS,),
            (
                y,
                cp.ascontiguousarray(cheb1, dtype=cp.float32),
                layer.bias,
                res,
                out,
                np.int32(b),
                np.int32(n),
                np.int32(cout),
            ),
        )
        return out

    def _mixing_source(self, cheb1) -> str:
        """hopper.mixing_source of a support (read to the host once per array: the template's
        supports live as long as the model, so this happens in the first, eager call)."""
        return self._derived.get(
            (cheb1,), "mixing", lambda: self._prepare_mixing(hg.mixing_source(self.to_numpy(cheb1)))
        )

    def _prepare_mixing(self, mixing: str) -> str:
        """Start building this mode's Hopper deformation kernels for a support's ``mixing`` source, all at
        once in background threads (kernel_manifest)."""
        if self.hopper is None:
            return mixing
        try:
            cuda_kernels.prepare(kernel_manifest.planned_mixing_builds(self.precision, mixing), wait=False)
        except KernelCompileError:
            pass  # tried again, and reported, where a kernel is first used
        return mixing

    def op_score_update(self, layer, x, cheb1, cheb0, centers, offsets):
        """A deformation block's narrow last layer (cin -> 1), the softmax over hypotheses and the moved
        vertices in one kernel (``drb_score_update``: X read once, float32 sums in every mode). None
        where it does not apply: a non-identity first support, other widths, fp16 mode off Hopper
        (cuBLAS products), rows not in whole 16-byte loads."""
        cp = self.cupy
        b, k, n, cin = x.shape
        row_format = ROW_FORMATS.get(x.dtype.name)
        if (
            cheb0 is not None
            or layer.weight0 is not None
            or layer.cout != 1
            or k != HYPOTHESES
            or row_format is None
            or cin > SKINNY_MAX_K
            or (row_format == ROWS_F32 and self.precision == "fp16" and self.hopper is None)
        ):
            return None
        rows = hg.hypothesis_rows(cp, x)  # unit-stride rows, evenly spaced
        ldx, vector = rows.strides[-2] // rows.itemsize, 16 // rows.itemsize  # elements per 16-byte load
        if cin % vector or ldx % vector or rows.data.ptr % 16:
            return None
        return self._move_vertices(
            "drb_score_update",
            (
                rows,
                np.int64(ldx),
                np.int32(cin),
                np.int32(row_format),
                cp.ascontiguousarray(layer.weight, dtype=cp.float32),
            ),
            cheb1,
            layer.bias,
            centers,
            offsets,
        )

    def _move_vertices(self, kernel: str, inputs: tuple, cheb1, bias, centers, offsets):
        """Launch a block's end kernel on its leading arguments ``inputs`` and A1, the score layer's bias,
        the offsets and the centers (B,N,3): ``drb_score_update`` (SCORE_VERTICES vertices a block) or
        ``drb_score_finish`` (SCORE_FINISH_VERTICES), a thread a hypothesis of a vertex; returns the moved
        centers (B,N,3)."""
        cp = self.cupy
        b, n = centers.shape[:2]
        out = cp.empty((b, n, 3), dtype=cp.float32)

        def f32(a):
            return cp.ascontiguousarray(a, dtype=cp.float32)

        per_block, threads = _SCORE_BLOCKS[kernel]
        self._deformation_kernel(kernel)(
            (-(-(b * n) // per_block),),
            (threads,),
            (*inputs, f32(cheb1), f32(bias), f32(offsets), f32(centers), out, np.int32(b), np.int32(n)),
        )
        return out

    def op_hypothesis_update(self, centers, score, offsets):
        """Softmax over the hypotheses (axis 1 of score (B,K,N)) and the moved centers (B,N,3)."""
        cp = self.cupy
        b, k, n = score.shape
        out = cp.empty((b, n, 3), dtype=cp.float32)
        self._deformation_kernel("hypothesis_softmax_update")(
            _grid(b * n),
            (THREADS,),
            (
                cp.ascontiguousarray(score, dtype=cp.float32),
                cp.ascontiguousarray(offsets, dtype=cp.float32),
                cp.ascontiguousarray(centers, dtype=cp.float32),
                out,
                np.int32(b),
                np.int32(k),
                np.int32(n),
            ),
        )
        return out

    def _local_gconv_cublas(self, layer, x, cheb1, cheb0, residual):
        """fp16 mode (cuBLAS half GEMMs), or a non-identity first support: the separate-GEMM path."""
        cp = self.cupy
        w0, w1, bias, a1, a0 = self._local_weights(layer, cheb1, cheb0)
        dtype = w0.dtype
        x, residual = self._activation_f32(x), self._activation_f32(residual)
        b, k, n, cin = x.shape
        cout = layer.cout
        x2 = cp.ascontiguousarray(x, dtype=dtype).reshape(b * k * n, cin)
        with self._math():
            y0 = (x2 @ w0).reshape(b, k, n, cout)
            y1 = (x2 @ w1).reshape(b, k, n, cout)
            if a0 is not None:
                y0 = self._mix(a0, y0)
            mixed = self._mix(a1, y1)
        last = cout == 1
        out_dtype = cp.float32 if (dtype == cp.float32 or last) else dtype
        out = cp.empty((b, k, n, cout), dtype=out_dtype)
        if dtype == cp.float32:
            name = "gconv_epilogue_f32"
        else:
            name = "gconv_epilogue_f16_f32" if out_dtype == cp.float32 else "gconv_epilogue_f16"
        res = np.uint64(0) if residual is None else cp.ascontiguousarray(residual, dtype=dtype)
        total = out.size
        self._deformation_kernel(name)(
            _grid(total), (THREADS,), (y0, mixed, bias, res, out, np.int64(total), np.int32(cout), np.int32(1))
        )
        return out
