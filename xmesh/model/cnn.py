"""CNN18: 18 'SAME' convolutions with ReLU; returns the feature maps a stage reads."""
from __future__ import annotations


def run_cnn(backend, convs, images, taps) -> list:
    """Run ``convs`` over images (N,224,224,3) and return the maps after the layers numbered in ``taps``."""
    maps = []
    x = images
    for k, conv in enumerate(convs, start=1):
        x = backend.conv2d_same(x, conv.weight, conv.bias, conv.stride, relu=True)
        if k in taps:
            maps.append(x)
    return maps
