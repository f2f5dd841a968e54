"""Stage 2's training step replayed as a CUDA Graph on CuPy, for the small batches whose step the host's
launches bound (one sample a step, the original's, makes about 1,500 launches from Python).

A :class:`StepGraph` belongs to one (batch size, views, padded ground-truth size). It holds the step's
inputs as device arrays (images, camera transforms, starting meshes, ground truth, the own draws'
uniforms), the loss and backward captured once as a graph (:meth:`CupyDevice.capture`), and the graph's
outputs: the gradients and one report array (the loss, the terms, each gradient's sum). A step copies
the samples into the inputs, replays the graph, reads the report back in one copy, and leaves Adam to
the trainer (its factor changes every step; it updates the weights in place, which the graph reads).

The arithmetic is the eager step's, kernel for kernel. Only the ground truth differs: it is padded to
a size from a short ladder (:func:`padded_size`), so that a few graphs serve a dataset whose samples
have different point counts; the padded rows lie far from any mesh, count as invalid and are skipped by
the nearest neighbours through lengths read on the device, so the losses take the same values, sums
over the padded rows aside (the same terms in another order, within float32 rounding).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..io.weights import STAGE_PREFIXES
from ..model.camera import packed_transforms
from ..model.projection import DeviceTransforms
from . import mesh_losses as ml
from . import stage2
from .data import Sample
from .step import LossAndGradients, stage2_template

MAX_BATCH = 4  # the largest batch a trainer replays as a graph: beyond it the device bounds the step
MAX_GRAPHS = 4  # graphs a trainer keeps (the least recently used is released first)
SMALLEST_SIZE = 1024  # the ground-truth sizes' ladder: 1024 * 2^(k/2), rounded up to 256 points


def padded_size(points: int) -> int:
    """The ladder's size that holds ``points`` ground-truth points: at most 41% of padding, and a few
    sizes for a whole dataset (1024, 1536, 2048, 2304, 3072, 4096, 5888, 8192, ...)."""
    k = 0
    while True:
        size = -(-math.ceil(SMALLEST_SIZE * 2 ** (k / 2)) // 256) * 256
        if size >= points:
            return size
        k += 1


class StepGraph:
    """Stage 2's loss and gradients as a CUDA Graph for batches of ``batch`` samples of ``views`` views
    and ground truth of up to ``points`` points (see the module docstring); ``weights`` are the trainer's
    device arrays, read in place."""

    def __init__(self, device, weights: dict, template, batch: int, views: int, points: int):
        xp = self.xp = device.xp
        self.device = device
        self.key = (batch, views, points)
        self.weights = {name: w for name, w in weights.items() if name.startswith(STAGE_PREFIXES[2])}
        self.template = stage2_template(xp, template, np.float32)
        vertices = int(self.template.reciprocal.shape[0])
        f32 = xp.float32
        self.images = xp.empty((batch, views, 224, 224, 3), dtype=f32)
        self.packed = xp.empty((batch, 12 + 12 * views), dtype=f32)
        self.transforms = DeviceTransforms.from_packed(self.packed, views)
        self.starts = xp.empty((batch, vertices, 3), dtype=f32)
        self.gt = ml.GroundTruth(
            xp.empty((batch, points, 3), dtype=f32),
            xp.empty((batch, points, 3), dtype=f32),
            xp.empty((batch, points), dtype=f32),
            np.full(batch, points, dtype=np.int64),
            xp.empty((batch,), dtype=f32),
            xp.empty((batch,), dtype=xp.int64),
        )
        self.uniforms = [
            ml.Uniforms(
                xp.empty((batch, ml.SAMPLES), dtype=xp.float64),
                xp.empty((batch, ml.SAMPLES, 1), dtype=f32),
                xp.empty((batch, ml.SAMPLES, 1), dtype=f32),
            )
            for _ in range(stage2.MESH_LOSS_CALLS)
        ]
        self.graph = None
        self.term_names: list[str] = []
        self.gradient_names: list[str] = []

    def _loss_and_gradients(self):
        """The captured work: the loss, its terms and gradients, and the report (loss, terms, each
        gradient's sum: a NaN or an infinity anywhere in a gradient makes its sum one)."""
        xp = self.xp
        total, terms, grads = stage2.loss_and_gradients(
            xp,
            self.weights,
            self.template,
            self.images,
            self.transforms,
            self.gt,
            self.starts,
            None,
            uniforms=self.uniforms,
        )
        self.term_names, self.gradient_names = list(terms), list(grads)
        # value by value (a concatenation of more than 8 arrays uploads their addresses: no graph holds it)
        values = [total] + [terms[n] for n in self.term_names] + [xp.sum(grads[n]) for n in self.gradient_names]
        report = xp.empty((len(values),), dtype=total.dtype)
        for i, value in enumerate(values):
            report[i] = value
        return report, grads

    def load(self, samples: Sequence[Sample], rng: np.random.Generator) -> None:
        """Copy ``samples`` and this step's uniforms (drawn from ``rng`` as the eager step draws them)
        into the graph's inputs."""
        batch, views, points = self.key
        self.device.copy_into(self.images, np.stack([s.images for s in samples]).astype(np.float32, copy=False))
        self.packed.set(packed_transforms(np.stack([s.cameras for s in samples])))
        self.starts.set(np.ascontiguousarray(np.stack([s.start for s in samples]), dtype=np.float32))
        host = ml.GroundTruth.host_arrays([s.labels for s in samples], np.float32, points)
        for field in ("points", "normals", "valid", "count_values"):
            getattr(self.gt, field).set(host[field])
        self.gt.device_lengths.set(host["lengths"])
        for uniforms, (pick, r1, r2) in zip(
            self.uniforms, ml.Uniforms.host(rng, batch, stage2.MESH_LOSS_CALLS, np.float32), strict=True
        ):
            uniforms.pick.set(pick)
            uniforms.r1.set(r1)
            uniforms.r2.set(r2)

    def capture(self) -> None:
        """Capture the step on the inputs loaded (after two eager runs that compile and fill its pool)."""
        self.device.synchronize()  # the capture's runs take their own stream: the inputs are there first
        self.graph = self.device.capture(self._loss_and_gradients)

    def run(self) -> tuple[LossAndGradients, np.ndarray]:
        """Replay the graph on the loaded inputs: the step's LossAndGradients (its gradients the graph's
        arrays, overwritten by the next replay) and each gradient's sum, on the host."""
        report, grads = self.graph.replay()
        host = self.device.to_numpy(report).astype(np.float64)
        terms = len(self.term_names)
        result = LossAndGradients(
            float(host[0]),
            {name: float(value) for name, value in zip(self.term_names, host[1 : 1 + terms], strict=True)},
            grads,
        )
        return result, host[1 + terms :]

    def release(self) -> None:
        if self.graph is not None:
            self.graph.release()
            self.graph = None
