"""Matrix products on the tensor cores: ``kernels/tc_gemm.cu`` (mma.sync, every GPU) and, for large
products on compute capability 9.0, the Hopper GEMM (``hopper``); the split-K reduction; cuBLAS's
compute type for the products that still go through it.
"""

from __future__ import annotations

import contextlib

import numpy as np

from ...errors import InputError
from .. import plan
from ..cublas_gemm import CublasGemm, load_library
from ..cuda_kernels import get_function
from ..kernel_constants import GEMM_BK, GEMM_BM, GEMM_DEFINES, GEMM_FILE, GEMM_STAGES, GEMM_THREADS, defines
from .device import THREADS, _grid

#: A product with fewer output tiles than plan.GEMM_TARGET_BLOCKS splits K into parts of at least this
#: many columns of K, or of GEMM_SPLIT_MIN_K_FEW when there are fewer than GEMM_FEW_TILES tiles (stage
#: 1's 156- and 618-vertex graph convolutions).
GEMM_SPLIT_MIN_K = 256
GEMM_SPLIT_MIN_K_FEW, GEMM_FEW_TILES = 32, 24
#: A product with fewer output tiles than multiprocessors takes tiles half as wide, down to this many
#: columns, before K is split (stage 1's graph convolutions at b=1).
GEMM_NARROWEST = 16


def _tile_width(n: int) -> int:
    """Columns of C per block of the tc_gemm.cu kernels for an N-wide product: 128 when N is a multiple
    of it, else the narrowest of 16/32/64 that covers N (64 beyond)."""
    if n % 128 == 0:
        return 128
    return 16 if n <= 16 else 32 if n <= 32 else 64


class GemmStage:
    """``gemm`` and the tc_gemm.cu launches it and the convolutions share (a mixin of CupyBackend)."""

    def _gemm_kernel(self, name: str, bn: int, bk: int = GEMM_BK):
        """A kernel of tc_gemm.cu (gemm_* or conv_*) built for K slices of ``bk``, and that width (the
        pair ``_launch_tc`` takes), with its shared-memory opt-in set once."""
        entry = self._gemm_kernels.get((name, bk))
        if entry is None:
            kernel = get_function(GEMM_FILE, name, ("-std=c++17",) + defines(GEMM_DEFINES, XG_BK=bk))
            kernel.max_dynamic_shared_size_bytes = self._gemm_smem(bn, bk)  # > 48 KB needs the opt-in
            entry = self._gemm_kernels[(name, bk)] = (kernel, bk)
        return entry

    @staticmethod
    def _gemm_smem(bn: int, bk: int) -> int:
        return GEMM_STAGES * (GEMM_BM * (bk + 4) + bk * (bn + 8)) * 4

    def _hopper_weight(self, b, operands: str, cache_key, paired: bool = False):
        """b prepared for the Hopper kernels (``operands``: a key of hopper.OPERANDS); kept per
        (cache_key, operands, paired) when cache_key (a weight array that lives as long as the model)
        is given, so a layer's weights are split once."""
        if cache_key is None:
            return self.hopper.prepare(b, operands, paired)
        return self._derived.get(
            (cache_key,), ("hopper", operands, paired, tuple(b.shape)), lambda: self.hopper.prepare(b, operands, paired)
        )

    def gemm(self, a, b, out=None, bias=None, relu: bool = False, passes: int | None = None, cache_key=None):
        """``act(a @ b + bias)`` for float32 a (M,K), b (K,N) on the tensor cores (our kernels).

        ``passes`` 3 (3xTF32, float32 accuracy) or 1 (TF32); default: the backend's precision.
        ``a`` and ``out`` may be row-strided views (unit column stride); ``out`` defaults to a new (M,N).
        ``cache_key``: a long-lived array ``b`` comes from (a layer's weights); on the Hopper path its
        prepared form is then kept instead of being rebuilt each call.
        """
        cp = self.cupy
        if a.dtype != cp.float32 or b.dtype != cp.float32:
            raise InputError(f"gemm takes float32 operands, got {a.dtype} and {b.dtype}")
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise InputError(f"gemm: shapes {a.shape} and {b.shape} do not multiply")
        a, b = self._float32_rows(a), self._float32_rows(b)
        m, k = a.shape
        n = b.shape[1]
        if out is None:
            out = cp.empty((m, n), dtype=cp.float32)
        elif out.shape != (m, n) or out.dtype != cp.float32 or out.strides[1] != 4:
            raise InputError(
                f"gemm: out must be float32 ({m}, {n}) with unit column stride, got {out.dtype} {out.shape}"
            )
        if m == 0 or n == 0:
            return out
        if k == 0:
            out[...] = 0.0 if bias is None else cp.maximum(bias, 0.0) if relu else bias
            return out
        passes = self.gemm_passes if passes is None else passes
        if self.hopper is not None and plan.gemm_on_hopper(m, n):
            return self.hopper(
                a, self._hopper_weight(b, "3xtf32" if passes == 3 else "tf32", cache_key), out, bias, relu
            )
        lda, ldb = a.strides[0] // 4, b.strides[0] // 4
        # 16-byte copies: rows 16-byte aligned; K may end inside one (the copy zero-fills past K)
        vec = lda % 4 == 0 and ldb % 4 == 0 and n % 4 == 0 and a.data.ptr % 16 == 0 and b.data.ptr % 16 == 0
        bn = _tile_width(n)
        while bn > GEMM_NARROWEST and n % (bn // 2) == 0 and -(-m // GEMM_BM) * (n // bn) < self.sm_count:
            bn //= 2  # fewer tiles than multiprocessors (stage 1's graph convolutions): narrower ones
        bk = plan.gemm_k_slice(passes, m, n, bn)
        entry = self._gemm_kernel(f"gemm_{passes}x_n{bn}_{'v' if vec else 's'}", bn, bk)
        return self._launch_tc(entry, (a, np.int64(lda)), b, out, m, k, bn, bias, relu)

    def training_product(self, a, b):
        """``a @ b`` in 3xTF32 (float32 accuracy) for the training passes' large float32 products, lent to
        :func:`xmesh.model.products.matmul` whatever this backend's precision: those of a row-major ``a``
        with enough output tiles for the Hopper GEMM, and those of a transposed ``a`` (the weights'
        gradients X^T dY, long sums over rows) with N a multiple of 128 in :meth:`gemm_transposed_a`.
        None for the rest: cuBLAS takes them."""
        m, n = a.shape[0], b.shape[1]
        if a.strides[0] == a.itemsize and a.strides[1] != a.itemsize and n % GEMM_BM == 0:
            return self.gemm_transposed_a(a.T, b)
        if self.hopper is None or a.strides[1] != a.itemsize or not plan.gemm_on_hopper(m, n):
            return None
        return self.gemm(a, b, passes=3)

    def general_product(self, a, b):
        """``a @ b`` through cuBLAS called directly (:mod:`xmesh.backends.cublas_gemm`: a CUDA Graph can
        capture it), lent to :func:`xmesh.model.products.matmul` for the training passes' other float
        products; None where cuBLAS cannot be loaded or the operands are not its (CuPy's matmul then)."""
        blas = getattr(self, "_cublas", None)
        if blas is None:
            library = load_library()
            blas = self._cublas = CublasGemm(library) if library is not None else False
        return blas.matmul(a, b) if blas else None

    def gemm_transposed_a(self, at, b, wgmma: bool = True):
        """``at.T @ b`` in 3xTF32 for float32 ``at`` (K, M) and ``b`` (K, N), N a multiple of 128, both with
        unit column stride (rows may be strided), K split over the multiprocessors (the weights' gradient
        of a deformation layer sums 3.4 million rows at batch 32 into a few tiles): on Hopper, with rows
        16-byte aligned, the wgmma kernel (``hopper.transposed_product``); else tc_gemm.cu's
        gemm_t3x_n128, which reads At's slices as they lie (``wgmma=False`` takes it on Hopper too)."""
        cp = self.cupy
        if at.dtype != cp.float32 or b.dtype != cp.float32 or at.shape[0] != b.shape[0] or b.shape[1] % GEMM_BM:
            raise InputError(f"gemm_transposed_a: float32 (K, M) and (K, N), N a multiple of {GEMM_BM}")
        at, b = self._float32_rows(at), self._float32_rows(b)
        if wgmma and self.hopper is not None and self.hopper.takes_transposed(at, b):
            return self.hopper.transposed_product(at, b)
        k, m = at.shape
        n = b.shape[1]
        out = cp.empty((m, n), dtype=cp.float32)
        lda, ldb = at.strides[0] // 4, b.strides[0] // 4
        vec = lda % 4 == 0 and ldb % 4 == 0 and at.data.ptr % 16 == 0 and b.data.ptr % 16 == 0
        bk = plan.gemm_k_slice(3, m, n, GEMM_BM)
        entry = self._gemm_kernel(f"gemm_t3x_n128_{'v' if vec else 's'}", GEMM_BM, bk)
        return self._launch_tc(entry, (at, np.int64(lda)), b, out, m, k, GEMM_BM, None, False)

    def _float32_rows(self, a):
        """A float32 matrix as the kernels read it: unit column stride and whole-float row stride (a
        view as it is, else a contiguous copy)."""
        return a if a.strides[1] == 4 and a.strides[0] % 4 == 0 else self.cupy.ascontiguousarray(a)

    def _launch_tc(self, entry: tuple, a_args: tuple, b, out, m: int, k: int, bn: int, bias, relu: bool):
        """Launch a kernel of tc_gemm.cu (``entry``: ``_gemm_kernel``'s (kernel, K slice width); A given
        by ``a_args``, B by ``b``) over (M/128 x N/bn) tiles, splitting K when there are few tiles (the
        CNN's deep layers at small batch)."""
        kernel, bk = entry
        cp = self.cupy
        n = b.shape[1]
        ldb, ldc = b.strides[0] // 4, out.strides[0] // 4
        tiles = -(-m // GEMM_BM) * -(-n // bn)
        # few output tiles and a long K: split K so more multiprocessors get work
        min_k = GEMM_SPLIT_MIN_K_FEW if tiles < GEMM_FEW_TILES else GEMM_SPLIT_MIN_K
        splits = max(1, min(-(-plan.GEMM_TARGET_BLOCKS // tiles), k // min_k))
        bias_arg = np.uint64(0) if bias is None else bias
        smem = self._gemm_smem(bn, bk)
        if splits == 1:
            kernel(
                (tiles, 1),
                (GEMM_THREADS,),
                (
                    *a_args,
                    b,
                    np.int64(ldb),
                    out,
                    np.int64(ldc),
                    np.int32(m),
                    np.int32(n),
                    np.int32(k),
                    bias_arg,
                    np.int32(bool(relu)),
                    np.int32(k),
                    np.int64(0),
                ),
                shared_mem=smem,
            )
            return out
        chunk = -(-k // (splits * bk)) * bk
        splits = -(-k // chunk)
        parts = cp.empty((splits, m, n), dtype=cp.float32)
        kernel(
            (tiles, splits),
            (GEMM_THREADS,),
            (
                *a_args,
                b,
                np.int64(ldb),
                parts,
                np.int64(n),
                np.int32(m),
                np.int32(n),
                np.int32(k),
                np.uint64(0),
                np.int32(0),
                np.int32(chunk),
                np.int64(m * n),
            ),
            shared_mem=smem,
        )
        get_function(GEMM_FILE, "gemm_splitk_reduce", ("-std=c++17",) + defines(GEMM_DEFINES, XG_BK=GEMM_BK))(
            _grid(m * n),
            (THREADS,),
            (
                parts,
                np.int32(splits),
                np.int64(m * n),
                np.int32(m),
                np.int32(n),
                out,
                np.int64(ldc),
                bias_arg,
                np.int32(bool(relu)),
            ),
        )
        return out

    @contextlib.contextmanager
    def _math(self):
        """float32 GEMMs on the tensor cores (TF32) in ``tf32`` mode, plain float32 otherwise."""
        old = self._linalg.get_compute_type(np.float32)
        self._linalg.set_compute_type(np.float32, self._tf32_type if self.precision == "tf32" else self._fp32_type)
        try:
            yield
        finally:
            self._linalg.set_compute_type(np.float32, old)
