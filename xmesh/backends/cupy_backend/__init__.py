"""The CuPy backend, by stage: ``device`` (the GPU, kernel loading, uploads, streams, CUDA graph
capture), one module per stage, each loading its own file of ``kernels/`` (``gemm``, ``convolution``,
``projection``, ``graph_conv``, ``deformation``), the Hopper kernels in ``hopper``, and
:class:`CupyBackend` (``backend``), which puts them together."""

from __future__ import annotations

from .backend import CupyBackend
from .device import PRECISIONS, CapturedGraph, GraphCaptureError, StreamBranch

__all__ = ["CupyBackend", "CapturedGraph", "GraphCaptureError", "StreamBranch", "PRECISIONS"]
