"""The public training step: one sample's (or a batch's) loss, loss terms and gradients by official name."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..backends import get_backend
from ..errors import InputError
from ..io.template import Template
from ..io.weights import STAGE_PREFIXES
from ..reconstruct import resolve_template
from . import mesh_losses as ml
from . import stage1, stage2

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


_prepared: dict = {}


def stage1_template(xp, template: Template, dtype) -> stage1.Stage1Template:
    """The template's training arrays, built once per (template, array library, dtype)."""
    key = (template, xp.__name__, np.dtype(dtype).str)
    if key not in _prepared:
        _prepared[key] = stage1.Stage1Template.build(xp, template, dtype)
    return _prepared[key]


def stage2_template(xp, template: Template, dtype) -> stage2.Stage2Template:
    """Stage 2's training arrays of the template, built once per (template, array library, dtype)."""
    key = (template, xp.__name__, np.dtype(dtype).str, 2)
    if key not in _prepared:
        _prepared[key] = stage2.Stage2Template.build(xp, template, dtype)
    return _prepared[key]


def _draws(xp, draws, calls: int, dtype):
    """Per mesh_loss call, the batch's fed draws as one :class:`Draws` (draws: B lists of ``calls`` triples)."""
    if draws is None:
        return None
    for b, sample in enumerate(draws):
        if len(sample) != calls:
            raise InputError(
                f"draws[{b}] holds {len(sample)} (choice, r1, r2) triples; this stage's step makes "
                f"{calls} mesh_loss calls"
            )
    return [ml.Draws.stack(xp, [sample[k] for sample in draws], dtype) for k in range(calls)]


def batch_loss_and_gradients(
    stage,
    params_or_weights,
    template,
    images,
    cameras,
    labels,
    starts=None,
    draws=None,
    backend="numpy",
    rng=None,
    dtype=np.float32,
    view_quirk: bool = True,
    to_host: bool = True,
) -> LossAndGradients:
    """The step for B samples at once, the loss and gradients averaged over the B samples.

    ``params_or_weights``: the stage's variables by official name (host arrays, or arrays already on
    the backend's device in ``dtype``); images (B,V,224,224,3), cameras (B,V,5), labels a list of B
    (P_i,6) ground-truth arrays; ``starts`` the B meshes the stage deforms (stage 2); ``draws`` B
    lists of the ``(choice, r1, r2)`` of each mesh_loss call, or None for draws from ``rng``.
    ``to_host=False`` leaves the gradients on the backend's device (the trainer's Adam reads them there).
    """
    stage = _check_stage(stage)
    be = get_backend(backend)
    xp = be.xp
    template = resolve_template(template)
    prefix = STAGE_PREFIXES[stage]
    weights = {
        name: xp.asarray(value, dtype=dtype) for name, value in params_or_weights.items() if name.startswith(prefix)
    }
    images = xp.asarray(np.asarray(images, dtype=np.float32) if isinstance(images, np.ndarray) else images, dtype=dtype)
    if images.ndim != 5 or len(labels) != images.shape[0]:
        raise InputError(
            f"images of shape {tuple(images.shape)} with {len(labels)} label arrays: expected "
            "(B,V,224,224,3) images and B label arrays"
        )
    gt = ml.GroundTruth.from_labels(xp, labels, dtype)
    if rng is None:
        rng = np.random.default_rng(0)
    if stage == 1:
        tmpl = stage1_template(xp, template, dtype)
        tf = stage1.transforms(xp, cameras)
        loss, terms, grads = stage1.loss_and_gradients(
            xp, weights, tmpl, images, tf, gt, _draws(xp, draws, stage1.MESH_LOSS_CALLS, dtype), rng, view_quirk
        )
    else:
        if starts is None or len(starts) != images.shape[0]:
            raise InputError(
                "stage 2 deforms a start mesh per sample (stage 1's prediction): pass starts, "
                f"one (N,3) array for each of the {images.shape[0]} sample(s)"
            )
        tmpl = stage2_template(xp, template, dtype)
        tf = stage1.transforms(xp, cameras)
        start = xp.stack([xp.asarray(s, dtype=dtype) for s in starts])
        loss, terms, grads = stage2.loss_and_gradients(
            xp, weights, tmpl, images, tf, gt, start, _draws(xp, draws, stage2.MESH_LOSS_CALLS, dtype), rng
        )
    if to_host:
        grads = {name: np.asarray(be.to_numpy(g)) for name, g in grads.items()}
    return LossAndGradients(float(loss), {k: float(v) for k, v in terms.items()}, grads)


def loss_and_gradients(
    stage, weights, template, images, cameras, labels, start=None, draws=None, backend="numpy"
) -> LossAndGradients:
    """One sample's loss, terms and gradients as the original's training graph computes them.

    ``images`` (V,224,224,3), ``cameras`` (V,5), ``labels`` (P,6) points and unit normals; ``start``
    is the mesh the stage deforms (None: the template's coordinates for stage 1); ``draws`` the
    ``(choice, r1, r2)`` of each ``mesh_loss`` call in the original's order, or None for seeded draws.
    """
    images = np.asarray(images, dtype=np.float32)
    cameras = np.asarray(cameras, dtype=np.float32)
    return batch_loss_and_gradients(
        stage,
        weights,
        template,
        images[None],
        cameras[None],
        [np.asarray(labels)],
        None if start is None else [start],
        None if draws is None else [draws],
        backend,
    )
