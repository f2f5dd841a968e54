"""The CPU baseline: NumPy + SciPy sparse + BLAS, with numba kernels for the two projections."""

from __future__ import annotations

import numpy as np
import scipy.sparse

from ..model.cnn import same_padding
from .base import Backend


def im2col(x: np.ndarray, kh: int, kw: int, stride: int) -> np.ndarray:
    """(N,H,W,C) -> (N*Ho*Wo, kh*kw*C) patches with 'SAME' zero padding, rows in NHW order."""
    n, h, w, c = x.shape
    ho, top, bottom = same_padding(h, kh, stride)
    wo, left, right = same_padding(w, kw, stride)
    padded = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
    sn, sh, sw, sc = padded.strides
    windows = np.lib.stride_tricks.as_strided(
        padded, shape=(n, ho, wo, kh, kw, c), strides=(sn, sh * stride, sw * stride, sh, sw, sc), writeable=False
    )
    return windows.reshape(n * ho * wo, kh * kw * c), (n, ho, wo)


class NumpyBackend(Backend):
    name = "numpy"

    def __init__(self, precision: str = "fp32", conv_chunk: int = 3):
        import array_api_compat.numpy as xp

        from ..errors import InputError

        if precision != "fp32":
            raise InputError(f"precision={precision!r}: the NumPy backend computes in fp32 only")
        self.xp = xp
        self.precision = precision
        self.conv_chunk = conv_chunk

    def asarray(self, array, dtype=np.float32):
        return np.ascontiguousarray(array, dtype=dtype)

    def to_numpy(self, array):
        return np.asarray(array)

    def sparse(self, csr_host):
        return scipy.sparse.csr_matrix(csr_host, dtype=np.float32)

    def spmm(self, sparse_matrix, dense):
        if dense.ndim == 2:
            return np.asarray(sparse_matrix @ dense, dtype=np.float32)
        return np.stack([np.asarray(sparse_matrix @ d, dtype=np.float32) for d in dense])

    def conv2d_same(self, x, weight, bias, stride: int, relu: bool = True):
        kh, kw, cin, cout = weight.shape
        flat_w = weight.reshape(kh * kw * cin, cout)
        outs = []
        for start in range(0, x.shape[0], self.conv_chunk):
            cols, (n, ho, wo) = im2col(x[start : start + self.conv_chunk], kh, kw, stride)
            y = cols @ flat_w
            y += bias
            if relu:
                np.maximum(y, 0.0, out=y)
            outs.append(y.reshape(n, ho, wo, cout))
        return outs[0] if len(outs) == 1 else np.concatenate(outs)

    def load_kernels(self) -> None:
        from . import numba_kernels  # noqa: F401 (compiled, or read from numba's cache, at import and first call)

    # -- fast paths (same function as the model's array-API code) -------------------------
    def op_local_projection(self, points, maps, tf):
        from . import numba_kernels

        if len(maps) != 3:
            return None
        batch, n, _ = points.shape
        channels = sum(m.shape[3] for m in maps)
        out = np.empty((batch, n, 3 + 3 * channels), dtype=np.float32)
        numba_kernels.local_projection(
            np.ascontiguousarray(points, dtype=np.float32), np.ascontiguousarray(tf.packed), *maps, tf.num_views, out
        )
        return out

    def op_local_gconv(self, layer, x, cheb1, cheb0=None, residual=None):
        if cheb0 is not None or layer.weight0 is not None:
            return None
        b, k, n, cin = x.shape
        cout = layer.cout
        y = x.reshape(-1, cin) @ layer.weight  # (B*K*N, 2*cout), one GEMM
        y1 = np.ascontiguousarray(y[:, cout:]).reshape(b, k, n * cout)
        out = np.matmul(cheb1, y1).reshape(b, k, n, cout)  # 43x43 mixing, one GEMM per sample
        out += y[:, :cout].reshape(b, k, n, cout)
        out += layer.bias
        np.maximum(out, 0.0, out=out)
        if residual is not None:
            out += residual
        return out
