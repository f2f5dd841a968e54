"""cuBLAS's float32 and float64 GEMM reached through ctypes, so that a CUDA Graph can capture it.

CuPy refuses every cuBLAS call while its stream captures (its ``setStream`` guard), though cuBLAS
itself supports stream capture once its handle has a workspace set beforehand (cuBLAS's "CUDA Graphs
support"): this handle has one. :meth:`CublasGemm.matmul` is ``a @ b`` for CuPy arrays of one float
dtype whose matrices are row- or column-major (transposed views are read as they lie, never copied),
with leading axes broadcast as NumPy's matmul does; it makes the same cuBLAS product as CuPy's
``matmul`` (``*gemmStridedBatched``, float32 or float64 arithmetic, no TF32).

The library is the one already loaded in this process (CuPy's), else CUDA's Python wheel
(``nvidia.cublas``), else the loader's search; ``XMESH_CUBLAS`` names a file, or ``0`` none (CuPy's
matmul then, and no training step captured) (:mod:`xmesh.backends.shared_library`).
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from .shared_library import candidate_paths, load_first

WORKSPACE_BYTES = 32 << 20  # cuBLAS's recommended workspace on Hopper
_OP_N, _OP_T = 0, 1


class CublasError(RuntimeError):
    pass


def load_library():
    """The cuBLAS library (a ctypes handle), or None where none can be loaded."""
    import cupy_backends.cuda.libs.cublas  # noqa: F401  (maps CuPy's libcublas into the process)

    paths = candidate_paths(
        "XMESH_CUBLAS", "libcublas.so", "nvidia.cublas", ["libcublas.so.13", "libcublas.so.12"], mapped=True
    )
    return load_first(paths, lambda lib: hasattr(lib, "cublasSgemmStridedBatched"))


def _layout(strides, rows: int, cols: int):
    """How cuBLAS reads a (rows, cols) matrix with these element strides: ("row" or "col", leading
    dimension), or None when neither axis has unit stride (the caller copies it)."""
    sr, sc = strides
    if (sc == 1 or cols == 1) and (rows == 1 or sr >= cols):
        return "row", (max(sr, cols) if rows > 1 else max(cols, 1))
    if (sr == 1 or rows == 1) and (cols == 1 or sc >= rows):
        return "col", (max(sc, rows) if cols > 1 else max(rows, 1))
    return None


class CublasGemm:
    """``a @ b`` through cuBLAS on the current CuPy device and stream, capturable (see the module)."""

    def __init__(self, lib):
        import cupy

        self.cupy = cupy
        self.lib = lib
        self._local = threading.local()
        for name in ("cublasSgemmStridedBatched", "cublasDgemmStridedBatched"):
            getattr(lib, name).argtypes = [
                ctypes.c_void_p,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.c_int,
                ctypes.c_longlong,
                ctypes.c_void_p,
                ctypes.c_int,
                ctypes.c_longlong,
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.c_int,
                ctypes.c_longlong,
                ctypes.c_int,
            ]
        lib.cublasSetStream_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.cublasSetWorkspace_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise CublasError(f"cuBLAS {what} failed with status {status}")

    def _handle(self):
        """This thread's handle on the current device, with its workspace (made once)."""
        device = self.cupy.cuda.Device().id
        handles = getattr(self._local, "handles", None)
        if handles is None:
            handles = self._local.handles = {}
        if device not in handles:
            handle = ctypes.c_void_p()
            self._check(self.lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
            # its own allocation, outside any memory pool (a CUDA Graph's private pool included)
            workspace = self.cupy.cuda.memory.Memory(WORKSPACE_BYTES)
            self._check(self.lib.cublasSetWorkspace_v2(handle, workspace.ptr, WORKSPACE_BYTES), "cublasSetWorkspace")
            handles[device] = (handle, workspace)
        return handles[device][0]

    def matmul(self, a, b):
        """``a @ b`` for float32 or float64 CuPy arrays of two or more axes, or None for anything else
        (other dtypes, vectors, mixed libraries), which the caller computes otherwise."""
        cp = self.cupy
        if not (isinstance(a, cp.ndarray) and isinstance(b, cp.ndarray)):
            return None
        if a.dtype != b.dtype or a.dtype not in (cp.float32, cp.float64) or a.ndim < 2 or b.ndim < 2:
            return None
        if a.shape[-1] != b.shape[-2]:
            raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not align")
        if b.ndim == 2 and a.ndim > 2 and a.flags.c_contiguous:  # every row of a in one product
            rows = a.reshape(-1, a.shape[-1])
            return self._batched(rows[None], b[None], (1,)).reshape(a.shape[:-1] + (b.shape[1],))
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        count = int(np.prod(batch, dtype=np.int64))
        return self._batched(self._stack(a, batch, count), self._stack(b, batch, count), batch)

    def _stack(self, x, batch: tuple, count: int):
        """x as (count or 1, rows, cols): its leading axes broadcast to ``batch`` and merged (a batch stride
        of 0 where x has one matrix)."""
        if int(np.prod(x.shape[:-2], dtype=np.int64)) == 1:
            return x.reshape(x.shape[-2:])[None]  # one matrix: a view with strides kept
        x = self.cupy.broadcast_to(x, batch + x.shape[-2:])
        return x.reshape((count,) + x.shape[-2:])

    def _batched(self, a, b, batch: tuple):
        """(Ba or 1, M, K) @ (Bb or 1, K, N) -> batch + (M, N), one strided batched GEMM."""
        cp = self.cupy
        count = max(a.shape[0], b.shape[0])
        m, k = a.shape[1:]
        n = b.shape[2]
        out = cp.empty((count, m, n), dtype=a.dtype)
        if m and n and not k:
            out.fill(0)
        if not (m and n and k and count):
            return out.reshape(tuple(batch) + (m, n))
        item = a.itemsize
        operands = []
        for x, rows, cols in ((a, m, k), (b, k, n)):
            layout = _layout((x.strides[1] // item, x.strides[2] // item), rows, cols)
            if layout is None or any(s % item for s in x.strides):
                x = cp.ascontiguousarray(x)
                layout = ("row", cols)
            stride = 0 if x.shape[0] == 1 else x.strides[0] // item
            operands.append((x, layout, stride))
        (a, (a_kind, lda), a_stride), (b, (b_kind, ldb), b_stride) = operands
        # row-major C = A B is column-major C^T = B^T A^T: a row-major operand is its transpose as cuBLAS
        # reads it, a column-major one is taken transposed
        handle = self._handle()
        self._check(self.lib.cublasSetStream_v2(handle, cp.cuda.get_current_stream().ptr), "cublasSetStream")
        scalar = ctypes.c_float if a.dtype == cp.float32 else ctypes.c_double
        one, zero = scalar(1.0), scalar(0.0)
        gemm = self.lib.cublasSgemmStridedBatched if a.dtype == cp.float32 else self.lib.cublasDgemmStridedBatched
        status = gemm(
            handle,
            _OP_N if b_kind == "row" else _OP_T,
            _OP_N if a_kind == "row" else _OP_T,
            n,
            m,
            k,
            ctypes.byref(one),
            b.data.ptr,
            ldb,
            b_stride,
            a.data.ptr,
            lda,
            a_stride,
            ctypes.byref(zero),
            out.data.ptr,
            n,
            m * n,
            count,
        )
        self._check(status, "gemmStridedBatched")
        return out.reshape(tuple(batch) + (m, n))
