"""Stage 2's deformation reasoning block for training: each layer's forward with its cache, and its backward.

Activations are hypothesis-major (B, K, N, C), as in :mod:`xmesh.model.deformation`, so each dense
43x43 support acts as one matrix product over the K axis, forward and backward. A local graph
convolution's parameters are a ``(W0, W1, b)`` triple of ``xp`` arrays and its gradient the triple
of their gradients; ``supports`` is ``(A0, A1)`` with A0 None when it is the identity (the
official template's), so that both products share one GEMM of [W0 | W1].

Where a backend lends a whole-layer kernel (:func:`xmesh.model.products.deformation_layer`), a layer
with A0 the identity runs in it forward, and its input gradient, dZ W0^T + A1^T (dZ W1^T), runs in it
backward without the ReLU; on CuPy the backward's mask, mixing and bias sums take one pass
(:func:`epilogues_cupy.relu_gradient_mixed`), or, for a layer whose input is the ReLU output of the
layer before, happen in that input gradient's kernel pass (:func:`products.layer_input_gradient`),
which hands the layer before a :class:`ThroughRelu` instead of its output's gradient. The narrow score
layer's input gradient, [dZ | A1^T dZ] (two columns) times [W0 | W1]^T, is made in the pass that
carries it through the ReLU before (:func:`epilogues_cupy.relu_gradient_mixed_of_product`), and its
weights' gradient X^T [dZ | A1^T dZ] in one pass over X (:mod:`.narrow_gradient_cupy`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from array_api_compat import is_cupy_namespace

from . import epilogues_cupy, narrow_gradient_cupy
from .local_projection_train import LocalProjectionCache, local_projection_backward, local_projection_forward
from .products import column_sums, deformation_layer, layer_input_gradient, matmul


def _over_hypotheses(xp, support, y):
    """support (K,K) applied over the K axis of y (B,K,N,C)."""
    b, k, n, c = y.shape
    return xp.reshape(matmul(support, xp.reshape(y, (b, k, n * c))), (b, k, n, c))


@dataclass
class LocalGConvCache:
    x: Any  # (B,K,N,cin) the layer's input
    active: Any  # (B,K,N,cout) where the ReLU passed: bool, or the ReLU's output (positive exactly there)
    layer: tuple  # (W0, W1, b)
    supports: tuple


def local_gconv_forward(xp, layer, x, supports, residual=None):
    """relu(A0 (X W0) + A1 (X W1) + b) over the hypothesis axis of x (B,K,N,cin), plus ``residual``
    (added after the ReLU) where given; returns (out, cache)."""
    w0, w1, bias = layer
    a0, a1 = supports
    b, k, n, cin = x.shape
    cout = w0.shape[1]
    if a0 is None:
        # the residual added in the kernel's pass, which also writes the ReLU output the backward masks with
        lent = (
            None
            if residual is None
            else deformation_layer(x, w0, w1, bias, a1, residual=residual, keep_activation=True)
        )
        if lent is not None:
            return lent[0], LocalGConvCache(x, lent[1], layer, supports)
        relu_out = deformation_layer(x, w0, w1, bias, a1)
        if relu_out is not None:
            out = relu_out if residual is None else relu_out + residual
            return out, LocalGConvCache(x, relu_out, layer, supports)
    flat = xp.reshape(x, (b * k * n, cin))
    if a0 is None:
        y = matmul(flat, xp.concat([w0, w1], axis=1))
        y0 = xp.reshape(y[:, :cout], (b, k, n, cout))
        y1 = xp.reshape(y[:, cout:], (b, k, n, cout))
    else:
        y0 = _over_hypotheses(xp, a0, xp.reshape(matmul(flat, w0), (b, k, n, cout)))
        y1 = xp.reshape(matmul(flat, w1), (b, k, n, cout))
    mixed = _over_hypotheses(xp, a1, y1)
    if is_cupy_namespace(xp):  # one pass instead of five over (B,K,N,cout) arrays
        out, active = epilogues_cupy.bias_relu(y0, mixed, bias, residual)
        return out, LocalGConvCache(x, active, layer, supports)
    z = y0 + mixed + bias
    active = z > 0
    out = xp.where(active, z, xp.zeros_like(z))
    return (out if residual is None else out + residual), LocalGConvCache(x, active, layer, supports)


@dataclass
class ThroughRelu:
    """A layer's output gradient already carried through its ReLU (by the next layer's input gradient
    pass): dy = [dZ | A1^T dZ] (B,K,N,2C), dZ's sums over K (B,N,C), and the gradient before the ReLU
    (``dout``) where a skip connection also needs it, else None."""

    dy: Any
    sums: Any
    dout: Any = None


def before_relu(gradient):
    """The output's gradient itself from a :class:`ThroughRelu` (its ``dout``) or a plain array."""
    return gradient.dout if isinstance(gradient, ThroughRelu) else gradient


def local_gconv_backward(
    xp, dout, cache: LocalGConvCache, need_dx: bool = True, plus=None, before=None, keep: bool = False
):
    """(dx or None, (dW0, dW1, db)) from the output's gradient ``dout`` (an array, or a
    :class:`ThroughRelu` for this layer); a residual's gradient is ``dout`` itself. ``plus``: a gradient
    that reaches the layer's input by another path (a skip connection's), added to dx (on CuPy in the
    layer kernel's pass). ``before``: the cache of the layer whose ReLU output is this layer's input;
    where the layer kernel takes it, dx comes back as a :class:`ThroughRelu` for that layer (with dx
    itself in it where ``keep``)."""
    w0, w1, _ = cache.layer
    a0, a1 = cache.supports
    b, k, n, cin = cache.x.shape
    cout = w0.shape[1]
    if isinstance(dout, ThroughRelu) or (a0 is None and is_cupy_namespace(xp) and str(dout.dtype) == "float32"):
        return _local_gconv_backward_cupy(xp, dout, cache, need_dx, plus, before, keep)
    if is_cupy_namespace(xp):
        dz = epilogues_cupy.relu_gradient(dout, cache.active)
    else:
        dz = xp.where(cache.active, dout, xp.zeros_like(dout))
    dbias = column_sums(xp, xp.reshape(dz, (-1, cout)))
    dy1 = xp.reshape(_over_hypotheses(xp, xp.matrix_transpose(a1), dz), (-1, cout))
    dy0 = xp.reshape(dz if a0 is None else _over_hypotheses(xp, xp.matrix_transpose(a0), dz), (-1, cout))
    flat = xp.reshape(cache.x, (b * k * n, cin))
    dy = xp.concat([dy0, dy1], axis=1)
    dweight = matmul(xp.matrix_transpose(flat), dy)
    dx = None
    if need_dx:
        dx = xp.reshape(matmul(dy, xp.matrix_transpose(xp.concat([w0, w1], axis=1))), (b, k, n, cin))
        if plus is not None:
            dx = plus + dx
    return dx, (dweight[:, :cout], dweight[:, cout:], dbias)


def _local_gconv_backward_cupy(xp, dout, cache: LocalGConvCache, need_dx: bool, plus, before, keep: bool):
    """:func:`local_gconv_backward` for float32 on CuPy with A0 the identity: dy = [dZ | A1^T dZ] and the
    bias's sums in one pass (or given), the weights' gradient one product over all rows, the input's
    gradient (and ``plus``) in the lent layer kernel (or dy [W0 | W1]^T), carried through the ReLU
    before where ``before`` is given and the kernel takes it."""
    w0, w1, _ = cache.layer
    a1 = cache.supports[1]
    b, k, n, cin = cache.x.shape
    cout = w0.shape[1]
    if isinstance(dout, ThroughRelu):
        dy, sums = dout.dy, dout.sums
    else:
        dy, sums = epilogues_cupy.relu_gradient_mixed(dout, cache.active, a1)
    dbias = column_sums(xp, xp.reshape(sums, (-1, cout)))
    rows = xp.reshape(dy, (-1, 2 * cout))
    flat = xp.reshape(cache.x, (b * k * n, cin))
    if narrow_gradient_cupy.takes(flat, rows):  # the score layer: one pass over X
        dweight = narrow_gradient_cupy.weight_gradient(flat, rows)
    else:
        dweight = matmul(xp.matrix_transpose(flat), rows)
    dx = None
    narrow = 2 * cout <= epilogues_cupy.NARROW_MAX
    if need_dx and before is not None and plus is None and narrow and before.supports[0] is None:
        # a narrow layer (the score): dX = dy [W0 | W1]^T made in the pass that carries it through the
        # ReLU before (whose A0 is the identity too); dX also comes back, for a skip connection
        weights = xp.concat([w0, w1], axis=1)
        carried = epilogues_cupy.relu_gradient_mixed_of_product(dy, weights, before.active, before.supports[1])
        return ThroughRelu(*carried), (dweight[:, :cout], dweight[:, cout:], dbias)
    if need_dx and before is not None and before.supports[1] is a1:
        carried = layer_input_gradient(dy[..., :cout], w0, w1, a1, before.active, plus, keep)
        if carried is not None:
            return ThroughRelu(*carried), (dweight[:, :cout], dweight[:, cout:], dbias)
    if need_dx:
        dz = dy[..., :cout]
        transposed = (xp.matrix_transpose(w0), xp.matrix_transpose(w1))
        dx = deformation_layer(dz, *transposed, None, a1, relu=False, support_transposed=True, residual=plus)
        if dx is None:
            dx = xp.reshape(matmul(rows, xp.matrix_transpose(xp.concat([w0, w1], axis=1))), (b, k, n, cin))
            if plus is not None:
                dx = plus + dx
    return dx, (dweight[:, :cout], dweight[:, cout:], dbias)


@dataclass
class HypothesisUpdateCache:
    weight: Any  # (B,K,N) softmax of the scores over K
    offsets: Any  # (K,3)


def hypothesis_update_forward(xp, centers, score, offsets):
    """centers (B,N,3) + sum_k softmax_k(score (B,K,N)) offsets[k]; returns (new centers, cache)."""
    e = xp.exp(score - xp.max(score, axis=1, keepdims=True))
    weight = e / xp.sum(e, axis=1, keepdims=True)
    return centers + matmul(xp.permute_dims(weight, (0, 2, 1)), offsets), HypothesisUpdateCache(weight, offsets)


def hypothesis_update_backward(xp, dnew, cache: HypothesisUpdateCache):
    """(dcenters (B,N,3), dscore (B,K,N)) from the new centers' gradient."""
    dweight = xp.permute_dims(matmul(dnew, xp.matrix_transpose(cache.offsets)), (0, 2, 1))  # (B,K,N)
    w = cache.weight
    dscore = w * (dweight - xp.sum(w * dweight, axis=1, keepdims=True))
    return dnew, dscore


@dataclass
class DeformationBlockCache:
    projection: LocalProjectionCache
    layers: list  # LocalGConvCache of the six layers
    update: HypothesisUpdateCache


def deformation_block_forward(xp, layers, supports, offsets, centers, maps, tf):
    """One DRB: centers (B,N,3) -> moved centers (B,N,3), and the cache.

    The hypotheses P = c + offsets (B,K,N,3) are projected onto the padded ``maps``; then
    x1 = lc1(X), x2 = lc2(x1), x3 = lc3(x2) + x1, x4 = lc4(x3), x5 = lc5(x4) + x3, s = lc6(x5)
    (ReLU on all six), and the centers move by the softmax(s)-weighted offsets.
    """
    b, n, _ = centers.shape
    k = offsets.shape[0]
    points = centers[:, None, :, :] + offsets[None, :, None, :]
    feats, projection = local_projection_forward(xp, xp.reshape(points, (b, k * n, 3)), maps, tf, groups=n)
    x = xp.reshape(feats, (b, k, n, feats.shape[-1]))
    caches = []

    def conv(i, h, residual=None):
        out, cache = local_gconv_forward(xp, layers[i], h, supports, residual)
        caches.append(cache)
        return out

    x1 = conv(0, x)
    x2 = conv(1, x1)
    x3 = conv(2, x2, x1)
    x4 = conv(3, x3)
    x5 = conv(4, x4, x3)
    score = conv(5, x5)[..., 0]
    new, update = hypothesis_update_forward(xp, centers, score, offsets)
    return new, DeformationBlockCache(projection, caches, update)


def deformation_block_backward(xp, dnew, cache: DeformationBlockCache, dmaps=None):
    """(dcenters (B,N,3), [d padded map], [(dW0, dW1, db) per layer]) from the moved centers' gradient;
    ``dmaps``, the maps' gradients from the blocks after this one, are added to this block's."""
    dcenters, dscore = hypothesis_update_backward(xp, dnew, cache.update)
    grads = [None] * 6

    def back(i, dout, plus=None, keep=False):
        before = cache.layers[i - 1] if i else None  # x_i = relu(...) of layer i - 1 (+ a residual)
        dx, grads[i] = local_gconv_backward(xp, dout, cache.layers[i], plus=plus, before=before, keep=keep)
        return dx

    dx5 = back(5, dscore[..., None])
    dx3 = back(3, back(4, dx5), plus=before_relu(dx5), keep=True)  # x5 = lc5(x4) + x3, x4 = lc4(x3)
    dx1 = back(1, back(2, dx3), plus=before_relu(dx3))  # x3 = lc3(x2) + x1, x2 = lc2(x1)
    dx = back(0, dx1)
    b, k, n, width = dx.shape
    dpoints, dmaps = local_projection_backward(
        xp, xp.reshape(dx, (b, k * n, width)), cache.projection, groups=n, plus=dmaps
    )
    dcenters = dcenters + xp.sum(xp.reshape(dpoints, (b, k, n, 3)), axis=1)
    return dcenters, dmaps, grads
