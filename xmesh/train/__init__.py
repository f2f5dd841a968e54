"""Training Pixel2Mesh++ without a framework: the original's loss, our backward passes, TF1 Adam.

``loss_and_gradients`` computes one training step's loss, its terms and every variable's gradient
by official name (``step.py``); each stage's loss and backward reads top to bottom in its own module.
``Trainer`` holds one stage's weights and Adam state and steps through samples; ``fit`` is a whole
training run from files, as ``xmesh train`` runs it (docs/training.md).
"""

from __future__ import annotations

from .fit import fit
from .step import LossAndGradients, batch_loss_and_gradients, loss_and_gradients
from .trainer import Trainer

__all__ = ["LossAndGradients", "loss_and_gradients", "batch_loss_and_gradients", "Trainer", "fit"]
