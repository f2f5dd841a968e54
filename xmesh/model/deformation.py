"""Stage 2: the deformation reasoning block (local projection, six local graph convolutions, softmax).

Activations are kept hypothesis-major, (B, K, N, C) with K = 43 hypotheses per vertex, so the
43x43 support acts as one matrix product over the leading axis.
"""

from __future__ import annotations

from .projection import local_projection


def local_gconv(backend, layer, x, cheb1, cheb0=None, residual=None):
    """relu(sum_k A_k (X W_k) + b) over the hypothesis axis of x (B,K,N,cin); A_0 = identity when cheb0 is None.

    ``residual`` (the output's shape), when given, is added after the ReLU (a fast path may fuse it).
    """
    fast = backend.op_local_gconv(layer, x, cheb1, cheb0, residual)
    if fast is not None:
        return fast
    xp = backend.xp
    b, k, n, _ = x.shape
    cout = layer.cout
    if cheb0 is None:
        y = x @ layer.weight
        y0, y1 = y[..., :cout], y[..., cout:]
    else:
        y0 = xp.reshape(cheb0 @ xp.reshape(x @ layer.weight0, (b, k, n * cout)), (b, k, n, cout))
        y1 = x @ layer.weight
    mixed = xp.reshape(cheb1 @ xp.reshape(y1, (b, k, n * cout)), (b, k, n, cout))
    out = y0 + mixed + layer.bias
    out = xp.maximum(out, 0.0)
    return out if residual is None else out + residual


def deformation_block(backend, layers, params, centers, maps, tf):
    """One DRB: centers (B,N,3) -> refined centers (B,N,3)."""
    xp = backend.xp
    b, n, _ = centers.shape
    offsets = params.sample_coord
    k = offsets.shape[0]
    points = centers[:, None, :, :] + offsets[None, :, None, :]  # (B,K,N,3)
    feats = local_projection(backend, xp.reshape(points, (b, k * n, 3)), maps, tf)
    x = xp.reshape(feats, (b, k, n, feats.shape[-1]))
    return block_tail(backend, layers, x, params, centers)


def block_tail(backend, layers, x, params, centers):
    """The block's six layers and its vertex update, the projected features x (B,K,N,cin) -> the moved
    centers (B,N,3): the five wide layers, then the score layer and the softmax. A backend may run
    them without ever writing x5 (the score layer's products inside the last wide layer), either for
    the whole block (``op_drb_block_tail``) or for its last wide layer (``last_layer_and_score``), or
    run the five wide layers as one (``op_drb_block_layers``)."""
    cheb1, cheb0, offsets = params.sample_cheb1, params.sample_cheb0, params.sample_coord
    fast = backend.op_drb_block_tail(layers, x, cheb1, cheb0, centers, offsets)
    if fast is not None:
        return fast
    x5 = backend.op_drb_block_layers(layers[:5], x, cheb1, cheb0)
    if x5 is None:
        x3, x4 = first_wide_layers(backend, layers[:4], x, params)
        return last_layer_and_score(backend, layers[4], layers[5], x4, x3, params, centers)
    return score_update(backend, layers[5], x5, params, centers)


def last_layer_and_score(backend, layer, score, x4, x3, params, centers):
    """The block's last wide layer x5 = lc5(x4) + x3, then its score layer and the vertex update."""
    cheb1, cheb0, offsets = params.sample_cheb1, params.sample_cheb0, params.sample_coord
    fast = backend.op_drb_last_layer_score(layer, score, x4, x3, cheb1, cheb0, centers, offsets)
    if fast is not None:
        return fast
    x5 = local_gconv(backend, layer, x4, cheb1, cheb0, x3)
    return score_update(backend, score, x5, params, centers)


def first_wide_layers(backend, layers, x, params):
    """The block's first four wide layers: x1 = lc1(x), x2 = lc2(x1), x3 = lc3(x2) + x1, x4 = lc4(x3);
    returns (x3, x4), what the last wide layer x5 = lc5(x4) + x3 reads."""

    def conv(layer, h, res=None):
        return local_gconv(backend, layer, h, params.sample_cheb1, params.sample_cheb0, res)

    x1 = conv(layers[0], x)
    x2 = conv(layers[1], x1)
    x3 = conv(layers[2], x2, x1)
    return x3, conv(layers[3], x3)


def score_update(backend, layer, x, params, centers):
    """The block's last layer (x (B,K,N,cin) -> hypothesis scores (B,K,N)) and the vertex update:
    centers (B,N,3) moved by the softmax-weighted offsets (a backend may fuse the two)."""
    cheb1, cheb0, offsets = params.sample_cheb1, params.sample_cheb0, params.sample_coord
    fast = backend.op_score_update(layer, x, cheb1, cheb0, centers, offsets)
    if fast is not None:
        return fast
    score = local_gconv(backend, layer, x, cheb1, cheb0)[..., 0]  # (B,K,N)
    return hypothesis_update(backend, centers, score, offsets)


def hypothesis_update(backend, centers, score, offsets):
    """centers (B,N,3) + sum_k softmax_k(score (B,K,N)) offsets[k]: the block's new vertex positions."""
    fast = backend.op_hypothesis_update(centers, score, offsets)
    if fast is not None:
        return fast
    xp = backend.xp
    score = score - xp.max(score, axis=1, keepdims=True)
    e = xp.exp(score)
    weight = e / xp.sum(e, axis=1, keepdims=True)
    return centers + xp.matmul(xp.permute_dims(weight, (0, 2, 1)), offsets)
