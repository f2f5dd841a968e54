"""Stage-1 graph operations: graph convolution with sparse supports, and unpooling."""
from __future__ import annotations


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
        out = y[..., : layer.cout] + backend.spmm(s1, y[..., layer.cout:])
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
