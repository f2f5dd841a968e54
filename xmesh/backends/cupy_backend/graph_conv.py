"""Stage 1's graph convolution: the sparse products of the model's own path, and the fast path of one
GEMM then one kernel of ``kernels/graph_conv.cu`` (support 1 in CSR, bias, ReLU, residual), with the
unpooling kernel.
"""

from __future__ import annotations

import numpy as np

from ...errors import InputError
from ..kernel_constants import GRAPH_CONV_FILE
from .device import THREADS

SOURCE = GRAPH_CONV_FILE


def _rows_16byte(cp, x):
    """x (B,N,C) float32 as a (B*N, C) view when its rows are evenly spaced, 16-byte aligned and a
    multiple of 16 bytes apart with unit column stride (a projection's padded rows), else None."""
    if x.dtype != cp.float32 or x.ndim != 3 or x.size == 0:
        return None
    b, n, c = x.shape
    col, row = x.strides[2], x.strides[1]
    if col != 4 or row % 16 or x.data.ptr % 16 or row < 4 * c or (b > 1 and x.strides[0] != n * row):
        return None
    return cp.lib.stride_tricks.as_strided(x, (b * n, c), (row, 4))


class GraphConvStage:
    """``sparse``, ``spmm``, ``op_graph_conv`` and ``op_unpool`` (a mixin of CupyBackend)."""

    def _graph_conv_kernel(self, name: str):
        return self._stage_kernel(SOURCE, name)

    def sparse(self, csr_host):
        import cupyx.scipy.sparse as csp
        import scipy.sparse

        host = scipy.sparse.csr_matrix(csr_host, dtype=np.float32)
        host.sum_duplicates()
        host.sort_indices()
        return csp.csr_matrix(host)

    def spmm(self, sparse_matrix, dense):
        cp = self.cupy
        if dense.ndim == 2:
            return cp.ascontiguousarray(sparse_matrix @ cp.ascontiguousarray(dense))
        b, n, c = dense.shape
        wide = cp.ascontiguousarray(cp.transpose(dense, (1, 0, 2))).reshape(n, b * c)
        out = sparse_matrix @ wide
        return cp.ascontiguousarray(cp.transpose(out.reshape(out.shape[0], b, c), (1, 0, 2)))

    def op_graph_conv(self, layer, x, supports, residual=None, pool_idx=None):
        """Stage-1 graph convolution when support 0 is the identity: one GEMM, then one CSR kernel
        (bias, ReLU and the residual step included). With ``pool_idx`` the GEMM's output is unpooled
        (one kernel) before the CSR kernel (graph.graph_conv's order)."""
        cp = self.cupy
        s0, s1 = supports
        if s0 is not None or layer.weight0 is not None:
            return None
        b, n, cin = x.shape
        cout = layer.cout
        weight = layer.weight
        x2 = _rows_16byte(cp, x)  # a projection's rows, padded to 16 bytes, read in place
        if x2 is None:
            x2 = cp.ascontiguousarray(x, dtype=cp.float32).reshape(b * n, cin)
            if cin % 4:  # the first layers' 2883 / 3075 inputs: rows padded to 16 bytes for the vector loads
                x2, weight = self._pad_k(x2), self._padded_weight(layer.weight)
        y = self.gemm(x2, weight, cache_key=weight)  # (B*N, 2*cout)
        if pool_idx is not None:
            y = self.op_unpool(y.reshape(b, n, 2 * cout), pool_idx)
            if y is None:
                return None
            n = y.shape[1]
            y = y.reshape(b * n, 2 * cout)
        if s1.shape != (n, n):
            raise InputError(f"graph_conv: support of shape {s1.shape} for {n} vertices")
        if residual is not None:
            residual = cp.ascontiguousarray(residual, dtype=cp.float32)
            if residual.shape != (b, n, cout):
                raise InputError(f"graph_conv: residual of shape {residual.shape}, expected {(b, n, cout)}")
        out = cp.empty((b, n, cout), dtype=cp.float32)
        total, kernel = out.size, "csr_gconv"
        if (
            cout % 4 == 0
            and total < 2**31
            and all(a.data.ptr % 16 == 0 for a in (y, layer.bias, out))
            and (residual is None or residual.data.ptr % 16 == 0)
        ):
            total, kernel = total // 4, "csr_gconv_x4"  # 4 columns a thread, 32-bit indices
        self._graph_conv_kernel(kernel)(
            ((total + THREADS - 1) // THREADS,),
            (THREADS,),
            (
                s1.indptr,
                s1.indices,
                s1.data,
                y,
                np.int32(2 * cout),
                np.int32(cout),
                layer.bias,
                np.uint64(0) if residual is None else residual,
                out,
                np.int32(b),
                np.int32(n),
                np.int32(cout),
                np.int32(bool(layer.relu)),
            ),
        )
        return out

    def _pad_k(self, x2):
        """(M, K) -> (M, K rounded up to 4) with zero columns appended."""
        m, k = x2.shape
        padded = self.cupy.empty((m, k + (-k % 4)), dtype=self.cupy.float32)
        padded[:, k:] = 0.0
        padded[:, :k] = x2
        return padded

    def _padded_weight(self, weight):
        """``weight`` (K, N) with zero rows up to a multiple of 4, made once per weight array."""

        def make():
            k = weight.shape[0]
            padded = self.cupy.zeros((k + (-k % 4), weight.shape[1]), dtype=self.cupy.float32)
            padded[:k] = weight
            return padded

        return self._derived.get((weight,), "pad_k", make)

    def op_unpool(self, x, pool_idx):
        """x (B,N,C) followed by the midpoints of pool_idx's edges, in one kernel (graph.unpool's arithmetic)."""
        cp = self.cupy
        if x.dtype != cp.float32 or pool_idx.dtype != cp.int64 or pool_idx.ndim != 2 or pool_idx.shape[1] != 2:
            return None
        x = cp.ascontiguousarray(x)
        edges = cp.ascontiguousarray(pool_idx)
        b, n, c = x.shape
        e = edges.shape[0]
        out = cp.empty((b, n + e, c), dtype=cp.float32)
        if out.size:
            self._graph_conv_kernel("unpool_midpoints")(
                (b * (n + e),), (THREADS,), (x, edges, out, np.int32(n), np.int32(e), np.int32(c))
            )
        return out
