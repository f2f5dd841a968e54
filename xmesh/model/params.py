"""Weights in the layouts the computation wants, resident on the backend's device.

Built once per (weights, template, backend) and reused by every reconstruction: the two weight
matrices of a graph convolution are fused into one [W0 | W1] product wherever support 0 is the
identity, and the stage-2 CNN keeps only the layers that can reach the output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import architecture as arch


@dataclass(frozen=True)
class Conv:
    weight: Any
    bias: Any
    stride: int


@dataclass(frozen=True)
class GraphConv:
    """act(S0 x W0 + S1 x W1 + b); ``weight`` is [W0 | W1] (cin, 2*cout) when S0 is the identity."""

    weight: Any
    bias: Any
    cout: int
    relu: bool
    weight0: Any = None  # W0 alone when S0 is not the identity (then ``weight`` holds W1 alone)


@dataclass(frozen=True)
class Stage1Params:
    cnn: tuple
    layers: dict  # layer index -> GraphConv
    supports: tuple  # per block: (S0 or None if identity, S1) on the device
    pool_idx: tuple  # device int arrays (E,2)
    coord: Any  # (156,3)


@dataclass(frozen=True)
class Stage2Params:
    cnn: tuple
    blocks: tuple  # per DRB: six GraphConv (local) layers
    sample_coord: Any  # (K,3)
    sample_cheb1: Any  # (K,K) the non-identity support
    sample_cheb0: Any  # None when the identity, else (K,K)


def _is_identity(matrix) -> bool:
    dense = matrix.toarray() if hasattr(matrix, "toarray") else np.asarray(matrix)
    return dense.shape[0] == dense.shape[1] and np.array_equal(dense, np.eye(dense.shape[0], dtype=dense.dtype))


def _fused(backend, weights, scope: str, relu: bool, fuse: bool) -> GraphConv:
    w0 = weights[f"{scope}/weights_0:0"]
    w1 = weights[f"{scope}/weights_1:0"]
    bias = backend.asarray(weights[f"{scope}/bias:0"])
    if fuse:
        return GraphConv(backend.asarray(np.concatenate([w0, w1], axis=1)), bias, w0.shape[1], relu)
    return GraphConv(backend.asarray(w1), bias, w0.shape[1], relu, weight0=backend.asarray(w0))


def _cnn(backend, weights, stage: int, last: int) -> tuple:
    layers = []
    for k, (_, _, stride) in enumerate(arch.CNN_LAYERS[:last], start=1):
        name = arch.cnn_name(stage, k)
        layers.append(Conv(backend.asarray(weights[f"{name}/W:0"]), backend.asarray(weights[f"{name}/b:0"]), stride))
    return tuple(layers)


def prepare_stage1(backend, weights: dict, template) -> Stage1Params:
    supports = []
    for stage_supports in template.supports:
        s0, s1 = stage_supports
        supports.append((None if _is_identity(s0) else backend.sparse(s0), backend.sparse(s1)))
    layers = {}
    for block, idx, scope in arch.graph_layers():
        fuse = supports[block - 1][0] is None
        layers[idx] = _fused(backend, weights, scope, relu=not arch.last_layer_of_block(idx), fuse=fuse)
    return Stage1Params(
        cnn=_cnn(backend, weights, 1, max(arch.STAGE1_TAPS)),
        layers=layers,
        supports=tuple(supports),
        pool_idx=tuple(backend.asarray(p, dtype=np.int64) for p in template.pool_idx),
        coord=backend.asarray(template.coord),
    )


def prepare_stage2(backend, weights: dict, template) -> Stage2Params:
    cheb0, cheb1 = template.sample_cheb
    fuse = _is_identity(cheb0)
    blocks = []
    for scope, ks in arch.DRB_BLOCKS:
        blocks.append(tuple(_fused(backend, weights, arch.drb_layer_name(scope, k), relu=True, fuse=fuse) for k in ks))
    return Stage2Params(
        cnn=_cnn(backend, weights, 2, max(arch.STAGE2_TAPS)),
        blocks=tuple(blocks),
        sample_coord=backend.asarray(template.sample_coord),
        sample_cheb1=backend.asarray(cheb1),
        sample_cheb0=None if fuse else backend.asarray(cheb0),
    )
