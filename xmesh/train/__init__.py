"""Training Pixel2Mesh++ without a framework: the original's loss, our backward passes, TF1 Adam.

``loss_and_gradients`` computes one training step's loss, its terms and every variable's gradient
by official name (``step.py``); each stage's loss and backward reads top to bottom in its own module.
"""
from __future__ import annotations

from .step import LossAndGradients, batch_loss_and_gradients, loss_and_gradients

__all__ = ["LossAndGradients", "loss_and_gradients", "batch_loss_and_gradients"]
