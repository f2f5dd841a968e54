"""Each training layer's backward against float64 central differences (tests/gradcheck.py), and each
training forward against the inference forward it stands beside."""
from __future__ import annotations

import numpy as np
import pytest
from gradcheck import check_gradients

from xmesh.backends import get_backend
from xmesh.model import cnn

xp = get_backend("numpy").xp


def rand(rng, *shape, scale=1.0):
    return rng.standard_normal(shape) * scale


@pytest.mark.parametrize("stride,kernel,size", [(1, 3, 6), (2, 3, 7), (2, 5, 8), (2, 3, 8)])
def test_conv_pair(stride, kernel, size):
    rng = np.random.default_rng(stride * 10 + kernel + size)
    inputs = {"x": rand(rng, 2, size, size, 3), "weight": rand(rng, kernel, kernel, 3, 4, scale=0.3),
              "bias": rand(rng, 4, scale=0.1)}

    def forward(x, weight, bias):
        return cnn.conv_forward(xp, x, weight, bias, stride)[0]

    def backward(dy):
        _, cache = cnn.conv_forward(xp, inputs["x"], inputs["weight"], inputs["bias"], stride)
        dx, dw, db = cnn.conv_backward(xp, dy, cache)
        return {"x": dx, "weight": dw, "bias": db}

    check_gradients(forward, backward, inputs)


def test_conv_forward_is_the_backends_convolution():
    rng = np.random.default_rng(3)
    x = rng.random((2, 9, 9, 5), dtype=np.float32)
    w = (rng.standard_normal((3, 3, 5, 8)) * 0.2).astype(np.float32)
    b = (rng.standard_normal(8) * 0.1).astype(np.float32)
    for stride in (1, 2):
        ours = cnn.conv_forward(xp, x, w, b, stride)[0]
        theirs = get_backend("numpy").conv2d_same(x, w, b, stride)
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


def test_cnn_pair_with_taps():
    rng = np.random.default_rng(5)
    layers = [(3, 4, 1), (3, 4, 2), (3, 6, 1), (3, 6, 2)]
    inputs = {"images": rand(rng, 1, 8, 8, 2)}
    cin = 2
    for k, (ksize, cout, _) in enumerate(layers):
        inputs[f"W{k}"] = rand(rng, ksize, ksize, cin, cout, scale=0.4)
        inputs[f"b{k}"] = rand(rng, cout, scale=0.1)
        cin = cout
    taps = (2, 4)

    def convs(values):
        return [(values[f"W{k}"], values[f"b{k}"], stride) for k, (_, _, stride) in enumerate(layers)]

    def forward(**values):
        return tuple(cnn.cnn_forward(xp, convs(values), values["images"], taps)[0])

    def backward(dmaps):
        _, caches = cnn.cnn_forward(xp, convs(inputs), inputs["images"], taps)
        grads = cnn.cnn_backward(xp, list(dmaps), caches, taps)
        out = {}
        for k, (dw, db) in enumerate(grads):
            out[f"W{k}"], out[f"b{k}"] = dw, db
        return out

    check_gradients(forward, backward, inputs)
