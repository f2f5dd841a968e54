"""The public training step: one sample's (or a batch's) loss, loss terms and gradients by official name."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError

STAGES = (1, 2)


@dataclass
class LossAndGradients:
    """A training step's result: the total loss the optimiser minimises, each loss call's value keyed
    as the golden file's terms without their stage prefix (``mesh_loss_block1_0``, ...), and the
    gradient of every trainable variable, keyed by its official name, as host NumPy arrays."""

    loss: float
    terms: dict[str, float] = field(default_factory=dict)
    gradients: dict[str, np.ndarray] = field(default_factory=dict)


def _check_stage(stage) -> int:
    if stage not in STAGES:
        raise InputError(f"stage={stage!r}: the training step covers stage 1 (MVP2M) or stage 2 (the DRBs)")
    return int(stage)


def batch_loss_and_gradients(stage, params_or_weights, template, images, cameras, labels, starts=None, draws=None,
                             backend="numpy", rng=None) -> LossAndGradients:
    """The step for B samples at once: images (B,V,224,224,3), cameras (B,V,5), labels a list of B
    (P_i,6) ground-truth arrays; the loss and gradients are averaged over the B samples."""
    stage = _check_stage(stage)
    raise NotImplementedError(f"the stage-{stage} training step is not implemented yet")


def loss_and_gradients(stage, weights, template, images, cameras, labels, start=None, draws=None,
                       backend="numpy") -> LossAndGradients:
    """One sample's loss, terms and gradients as the original's training graph computes them.

    ``images`` (V,224,224,3), ``cameras`` (V,5), ``labels`` (P,6) points and unit normals; ``start``
    is the mesh the stage deforms (None: the template's coordinates for stage 1); ``draws`` the
    ``(choice, r1, r2)`` of each ``mesh_loss`` call in the original's order, or None for seeded draws.
    """
    images = np.asarray(images, dtype=np.float32)
    cameras = np.asarray(cameras, dtype=np.float32)
    return batch_loss_and_gradients(stage, weights, template, images[None], cameras[None], [np.asarray(labels)],
                                    None if start is None else [start], None if draws is None else [draws], backend)
