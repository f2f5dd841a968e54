"""CNN18: 18 'SAME' convolutions with ReLU; returns the feature maps a stage reads.

``run_cnn`` is inference (the backend's convolutions). For training, ``conv_forward`` /
``conv_backward`` are one convolution's pair and ``cnn_forward`` / ``cnn_backward`` the network's,
written with the array API: the convolution is an im2col product whose columns are ordered as
the kernel's (kh, kw, cin) rows, the same product the NumPy backend computes. A backend may lend
its own im2col and col2im (:func:`lend_patches`: on CuPy one launch each instead of a copy or an add
per tap), with the same values, and its own convolution with its two gradients
(:func:`lend_convolution`: on CuPy cuDNN's, in float32 multiply-adds, for stride 1), which then
keeps the input instead of its patches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from array_api_compat import is_cupy_namespace

from . import epilogues_cupy
from .products import column_sums, matmul


def run_cnn(backend, convs, images, taps) -> list:
    """Run ``convs`` over images (N,224,224,3) and return the maps after the layers numbered in ``taps``."""
    maps = []
    x = images
    for k, conv in enumerate(convs, start=1):
        x = backend.conv2d_same(x, conv.weight, conv.bias, conv.stride, relu=True)
        if k in taps:
            maps.append(x)
    return maps


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int, int]:
    """TensorFlow 'SAME': (output size, pad before, pad after); the larger half goes after."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return out, total // 2, total - total // 2


def _padded(xp, x, kh: int, kw: int, stride: int):
    n, h, w, c = x.shape
    ho, top, bottom = same_padding(h, kh, stride)
    wo, left, right = same_padding(w, kw, stride)
    padded = xp.zeros((n, h + top + bottom, w + left + right, c), dtype=x.dtype)
    padded[:, top : top + h, left : left + w, :] = x
    return padded, (ho, wo, top, left)


_lent_im2col = None
_lent_col2im = None
_lent_convolution = None  # (forward, data gradient, filter gradient)


def lend_patches(im2col_fn, col2im_fn) -> tuple:
    """Route :func:`im2col` and :func:`col2im` through ``im2col_fn(x, kh, kw, stride)`` and
    ``col2im_fn(cols, shape, kh, kw, stride)`` (each None to decline an array); returns the pair lent
    before."""
    global _lent_im2col, _lent_col2im
    before = (_lent_im2col, _lent_col2im)
    _lent_im2col, _lent_col2im = im2col_fn, col2im_fn
    return before


def lend_convolution(forward, data_gradient, filter_gradient):
    """Route :func:`conv_forward`'s product through ``forward(x, W, stride)`` (conv(x, W), no bias; None
    to decline) and a convolution it took through ``data_gradient(dz, W, x_shape, stride)`` and
    ``filter_gradient(x, dz, W_shape, stride)`` backward; returns the triple lent before (None: none)."""
    global _lent_convolution
    before = _lent_convolution
    _lent_convolution = None if forward is None else (forward, data_gradient, filter_gradient)
    return before


def im2col(xp, x, kh: int, kw: int, stride: int):
    """(N,H,W,C) -> (N*Ho*Wo, kh*kw*C) 'SAME' patches, rows in NHW order, columns in (kh, kw, C) order."""
    if _lent_im2col is not None:
        lent = _lent_im2col(x, kh, kw, stride)
        if lent is not None:
            return lent
    n, _, _, c = x.shape
    padded, (ho, wo, _, _) = _padded(xp, x, kh, kw, stride)
    # tap by tap into one array: CuPy's stack of more than 8 arrays uploads their addresses from the
    # host, a copy that a CUDA Graph cannot hold
    cols = xp.empty((n, ho, wo, kh * kw, c), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            rows = slice(i, i + stride * (ho - 1) + 1, stride)
            columns = slice(j, j + stride * (wo - 1) + 1, stride)
            cols[:, :, :, i * kw + j, :] = padded[:, rows, columns, :]
    return xp.reshape(cols, (n * ho * wo, kh * kw * c)), (ho, wo)


def col2im(xp, cols, shape, kh: int, kw: int, stride: int):
    """The backward of :func:`im2col`: each patch column summed back into the (N,H,W,C) ``shape``."""
    if _lent_col2im is not None:
        lent = _lent_col2im(cols, shape, kh, kw, stride)
        if lent is not None:
            return lent
    n, h, w, c = shape
    ho, top, bottom = same_padding(h, kh, stride)
    wo, left, right = same_padding(w, kw, stride)
    cols = xp.reshape(cols, (n, ho, wo, kh * kw, c))
    padded = xp.zeros((n, h + top + bottom, w + left + right, c), dtype=cols.dtype)
    for i in range(kh):
        for j in range(kw):
            rows = slice(i, i + stride * (ho - 1) + 1, stride)
            columns = slice(j, j + stride * (wo - 1) + 1, stride)
            padded[:, rows, columns, :] += cols[:, :, :, i * kw + j, :]
    return padded[:, top : top + h, left : left + w, :]


@dataclass
class ConvCache:
    """What a convolution's backward reads: its input's patches (kept rather than made again: the
    backward's dW product needs them, at the cost of kh*kw times the input's memory), or where a lent
    convolution took it the input itself (``cols`` None), the input's shape and the (post-ReLU) output."""

    cols: Any
    x_shape: tuple
    y: Any
    weight: Any
    stride: int
    x: Any = None


def conv_forward(xp, x, weight, bias, stride: int):
    """relu(conv_same(x, W) + b) for NHWC ``x``; returns (y, cache)."""
    kh, kw, cin, cout = weight.shape
    lent = None if _lent_convolution is None else _lent_convolution[0](x, weight, stride)
    if lent is not None:
        y = _plus_bias_relu(xp, lent, bias)
        return y, ConvCache(None, tuple(x.shape), y, weight, stride, x)
    cols, (ho, wo) = im2col(xp, x, kh, kw, stride)
    y = _plus_bias_relu(xp, matmul(cols, xp.reshape(weight, (kh * kw * cin, cout))), bias)
    y = xp.reshape(y, (x.shape[0], ho, wo, cout))
    return y, ConvCache(cols, tuple(x.shape), y, weight, stride)


def _plus_bias_relu(xp, y, bias):
    """relu(y + bias), on CuPy in one pass instead of two."""
    if is_cupy_namespace(xp):
        return epilogues_cupy.plus_bias_relu(y, bias)
    return xp.maximum(y + bias, 0.0)


def conv_backward(xp, dy, cache: ConvCache, need_dx: bool = True, plus=None):
    """(dx or None, dW, db) for the output gradient ``dy`` (``dy + plus`` where another path's ``plus``
    is given: on CuPy summed in the ReLU gradient's pass); ReLU passes where the output is > 0."""
    kh, kw, cin, cout = cache.weight.shape
    if is_cupy_namespace(xp):  # one pass instead of three
        dz = epilogues_cupy.relu_gradient(dy, cache.y, plus)
    else:
        dy = dy if plus is None else dy + plus
        dz = xp.where(cache.y > 0, dy, xp.zeros_like(dy))
    dbias = column_sums(xp, xp.reshape(dz, (-1, cout)))
    if cache.cols is None:  # a lent convolution's forward: its gradients too
        _, data_gradient, filter_gradient = _lent_convolution
        dweight = filter_gradient(cache.x, dz, cache.weight.shape, cache.stride)
        dx = data_gradient(dz, cache.weight, cache.x_shape, cache.stride) if need_dx else None
        return dx, dweight, dbias
    dz = xp.reshape(dz, (-1, cout))
    dweight = xp.reshape(matmul(xp.matrix_transpose(cache.cols), dz), cache.weight.shape)
    dx = None
    if need_dx:
        dcols = matmul(dz, xp.matrix_transpose(xp.reshape(cache.weight, (kh * kw * cin, cout))))
        dx = col2im(xp, dcols, cache.x_shape, kh, kw, cache.stride)
    return dx, dweight, dbias


def cnn_forward(xp, convs, images, taps):
    """Training forward of ``convs`` ((W, b, stride) triples) up to the last of ``taps``; returns
    (the maps after the layers numbered in ``taps``, the per-layer caches)."""
    maps, caches = [], []
    x = images
    for k, (weight, bias, stride) in enumerate(convs[: max(taps)], start=1):
        x, cache = conv_forward(xp, x, weight, bias, stride)
        caches.append(cache)
        if k in taps:
            maps.append(x)
    return maps, caches


def cnn_backward(xp, dmaps, caches, taps):
    """Gradients [(dW, db) per layer] from the gradients ``dmaps`` of the maps after the ``taps``
    layers (the last tap's gradient is required, a lower one may be None); the images get none."""
    grads = [None] * len(caches)
    dx = None
    tap_grads = dict(zip(taps, dmaps, strict=True))
    for k in range(len(caches), 0, -1):
        extra = tap_grads.get(k)
        if dx is None:
            dx, extra = extra, None
        dx, dweight, dbias = conv_backward(xp, dx, caches[k - 1], need_dx=k > 1, plus=extra)
        grads[k - 1] = (dweight, dbias)
    return grads
