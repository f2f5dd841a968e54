"""``HopperGemm``: the Hopper kernels' launchers, one mixin per kernel family."""

from __future__ import annotations

from .chain import ChainFamily
from .gemm import HopperCore
from .layer import LayerFamily
from .layer_3xf16 import Layer3xf16Family
from .weight_gradient import WeightGradientFamily


class HopperGemm(WeightGradientFamily, Layer3xf16Family, ChainFamily, LayerFamily, HopperCore):
    """The Hopper kernels on one device: ``HopperGemm(cupy)`` loads the weight-preparing kernels;
    calling it runs the GEMM, and each family's methods its kernels."""
