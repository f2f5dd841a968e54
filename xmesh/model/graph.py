"""Stage-1 graph operations: graph convolution with sparse supports, and unpooling.

``graph_conv`` and ``unpool`` are inference (a backend may replace them); the training pairs
(``graph_conv_forward`` / ``graph_conv_backward``, ``unpool_forward`` / ``unpool_backward``) follow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .products import column_sums, matmul
from .sparse import scatter_add_rows, sparse_matrix, sparse_product


def graph_conv(backend, layer, x, supports, residual=None, pool_idx=None):
    """act(S0 (x W0) + S1 (x W1) + b) for x (B,N,cin); S0 = None means the identity (product skipped).

    With ``residual`` (B,N,cout), the original's residual step follows: (out + residual) * 0.5.
    With ``pool_idx``, x is the input *before* the unpooling that precedes this layer: the layer
    runs on unpool(x, pool_idx). Unpooling appends midpoints (x_u + x_v) / 2, which commute with the
    product (unpool(x) W = unpool(x W)), so the product runs on the N rows of x instead of the
    N + E rows of the unpooled input (a quarter of them for blocks 2 and 3) and its output is
    unpooled instead: the same function, rounded differently in float32's last bits.
    """
    fast = backend.op_graph_conv(layer, x, supports, residual, pool_idx)
    if fast is not None:
        return fast
    xp = backend.xp
    s0, s1 = supports

    def product(weight):
        y = x @ weight
        return y if pool_idx is None else unpool(backend, y, pool_idx)

    if layer.weight0 is None:
        y = product(layer.weight)
        out = y[..., : layer.cout] + backend.spmm(s1, y[..., layer.cout :])
    else:
        out = backend.spmm(s0, product(layer.weight0)) + backend.spmm(s1, product(layer.weight))
    out = out + layer.bias
    if layer.relu:
        out = xp.maximum(out, 0.0)
    return out if residual is None else (out + residual) * 0.5


def unpool(backend, x, pool_idx):
    """Append, for each edge (u, v) of ``pool_idx``, the midpoint (x_u + x_v) / 2 of its features."""
    fast = backend.op_unpool(x, pool_idx)
    if fast is not None:
        return fast
    xp = backend.xp
    mids = (xp.take(x, pool_idx[:, 0], axis=1) + xp.take(x, pool_idx[:, 1], axis=1)) * 0.5
    return xp.concat([x, mids], axis=1)


# -- training pairs: forward with an explicit cache, backward beside it -----------------------------


@dataclass(frozen=True)
class GraphSupports:
    """A stage's two supports for training, as ``xp`` sparse matrices of the training dtype, with
    their transposes (the backward's products); ``s0`` is None where it is the identity."""

    s0: Any
    s1: Any
    s0t: Any
    s1t: Any

    @classmethod
    def from_host(cls, xp, supports, dtype) -> GraphSupports:
        """From a template stage's two SciPy supports (``Template.supports[s]``)."""
        s0, s1 = supports
        dense0 = s0.toarray() if hasattr(s0, "toarray") else np.asarray(s0)
        identity = dense0.shape[0] == dense0.shape[1] and np.array_equal(dense0, np.eye(dense0.shape[0]))
        t0 = None if identity else sparse_matrix(xp, s0, dtype)
        return cls(
            t0,
            sparse_matrix(xp, s1, dtype),
            None if identity else sparse_matrix(xp, s0.T, dtype),
            sparse_matrix(xp, s1.T, dtype),
        )


@dataclass
class GraphConvCache:
    x: Any
    act: Any  # the layer's output before the residual average
    weight0: Any
    weight1: Any
    supports: GraphSupports
    relu: bool
    residual: bool


def graph_conv_forward(xp, x, weight0, weight1, bias, supports: GraphSupports, relu: bool, residual=None):
    """act(S0 (x W0) + S1 (x W1) + b) for x (B,N,cin), then (out + residual) * 0.5 where given; returns
    (out, cache). Where S0 is the identity the two products are one, x [W0 | W1], as in inference."""
    cout = weight0.shape[1]
    if supports.s0 is None:
        y = matmul(x, xp.concat([weight0, weight1], axis=1))
        out = y[..., :cout] + sparse_product(xp, supports.s1, y[..., cout:])
    else:
        out = sparse_product(xp, supports.s0, matmul(x, weight0)) + sparse_product(xp, supports.s1, matmul(x, weight1))
    out = out + bias
    if relu:
        out = xp.maximum(out, 0.0)
    cache = GraphConvCache(x, out, weight0, weight1, supports, relu, residual is not None)
    return (out if residual is None else (out + residual) * 0.5), cache


def graph_conv_backward(xp, dout, cache: GraphConvCache):
    """(dx, dW0, dW1, db, dresidual or None) from the output gradient (B,N,cout)."""
    d = dout * 0.5 if cache.residual else dout
    dresidual = d if cache.residual else None
    if cache.relu:
        d = xp.where(cache.act > 0, d, xp.zeros_like(d))
    s = cache.supports
    d1 = sparse_product(xp, s.s1t, d)
    d0 = d if s.s0 is None else sparse_product(xp, s.s0t, d)
    dy = xp.concat([d0, d1], axis=-1)
    cin, cout = cache.weight0.shape
    flat_x = xp.reshape(cache.x, (-1, cin))
    dweights = matmul(xp.matrix_transpose(flat_x), xp.reshape(dy, (-1, 2 * cout)))
    dx = matmul(dy, xp.matrix_transpose(xp.concat([cache.weight0, cache.weight1], axis=1)))
    dbias = column_sums(xp, xp.reshape(d, (-1, cout)))
    return dx, dweights[:, :cout], dweights[:, cout:], dbias, dresidual


def unpool_forward(xp, x, pool_idx):
    """Training unpooling: the midpoints of ``pool_idx``'s edges appended to x (B,N,C)."""
    mids = (xp.take(x, pool_idx[:, 0], axis=1) + xp.take(x, pool_idx[:, 1], axis=1)) * 0.5
    return xp.concat([x, mids], axis=1)


def unpool_backward(xp, dout, pool_idx, n: int):
    """dx (B,n,C) from the gradient of the unpooled (B,n+E,C) output."""
    dmid = dout[:, n:] * 0.5
    return dout[:, :n] + scatter_add_rows(xp, pool_idx[:, 0], dmid, n) + scatter_add_rows(xp, pool_idx[:, 1], dmid, n)
