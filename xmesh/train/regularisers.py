"""The regularisers the original adds to each stage's loss, with their gradients.

tflearn's conv_2d registers ``1e-5 * l2_loss(W)`` for each convolution's kernel and the model adds
their sum times 0.3; stage 1 also adds ``5e-6 * l2_loss`` of every weight and bias of its 43 graph
layers. ``l2_loss(v) = sum(v**2) / 2``, so each gradient is the factor times the variable.
"""

from __future__ import annotations

from ..model import architecture as arch

CNN_L2 = 1e-5
CNN_L2_SCALE = 0.3
CNN_FACTOR = CNN_L2 * CNN_L2_SCALE  # each CNN kernel's l2_loss factor in the stage's loss
GRAPH_WEIGHT_DECAY = 5e-6


def l2_penalty(xp, variables: dict, factor: float):
    """``factor * sum(l2_loss(v))`` over ``variables`` (name -> array), as an ``xp`` scalar (no copy to
    the host per variable), and each variable's gradient."""
    loss = 0.0
    grads = {}
    for name, value in variables.items():
        loss = loss + xp.sum(value * value)
        grads[name] = factor * value
    return loss * (factor / 2), grads


def cnn_kernels(weights: dict, stage: int) -> dict:
    """The 18 convolution kernels of a stage's CNN, by official name."""
    names = [f"{arch.cnn_name(stage, k)}/W:0" for k in range(1, len(arch.CNN_LAYERS) + 1)]
    return {name: weights[name] for name in names}


def graph_variables(weights: dict) -> dict:
    """Every weight and bias of stage 1's 43 graph convolutions, by official name."""
    out = {}
    for _, _, scope in arch.graph_layers():
        for part in ("weights_0", "weights_1", "bias"):
            out[f"{scope}/{part}:0"] = weights[f"{scope}/{part}:0"]
    return out


def cnn_regulariser(xp, weights: dict, stage: int):
    """The CNN's ``0.3 * sum(1e-5 * l2_loss(W))`` and its gradients."""
    return l2_penalty(xp, cnn_kernels(weights, stage), CNN_FACTOR)


def graph_weight_decay(xp, weights: dict):
    """Stage 1's ``5e-6 * l2_loss`` over its graph layers' variables and its gradients."""
    return l2_penalty(xp, graph_variables(weights), GRAPH_WEIGHT_DECAY)
