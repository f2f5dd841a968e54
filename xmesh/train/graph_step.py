"""Stage 2's training step replayed as a CUDA Graph on CuPy, for the small batches whose step the host's
launches bound (one sample a step, the original's, makes about 1,500 launches from Python).

A :class:`StepGraph` belongs to one (batch size, views, padded ground-truth size). It holds the step's
inputs (images, camera transforms, starting meshes, ground truth, the own draws' uniforms) as views of
one pinned host buffer and one device buffer, so that a step's inputs go over in one copy; the loss
and backward captured once as a graph (:meth:`CupyDevice.capture`) with its outputs, the gradients and
one report array (the loss, the terms, each gradient's sum), read back in one copy; and Adam's
updates captured as a second graph once every moment exists, its factor (which changes every step)
read from the device. The weights and moments are updated in place, where the graphs read them.

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
from . import adam, stage2
from . import mesh_losses as ml
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
        f32, samples = np.float32, ml.SAMPLES
        fields = {
            "images": ((batch, views, 224, 224, 3), f32),
            "packed": ((batch, 12 + 12 * views), f32),
            "starts": ((batch, vertices, 3), f32),
            "points": ((batch, points, 3), f32),
            "normals": ((batch, points, 3), f32),
            "valid": ((batch, points), f32),
            "count_values": ((batch,), f32),
            "lengths": ((batch,), np.int64),
        }
        for call in range(stage2.MESH_LOSS_CALLS):
            fields[f"pick{call}"] = ((batch, samples), np.float64)
            fields[f"r1{call}"] = ((batch, samples, 1), f32)
            fields[f"r2{call}"] = ((batch, samples, 1), f32)
        self.staging = _Staging(xp, fields)
        d = self.staging.device
        self.images, self.packed, self.starts = d["images"], d["packed"], d["starts"]
        self.transforms = DeviceTransforms.from_packed(self.packed, views)
        self.gt = ml.GroundTruth(
            d["points"], d["normals"], d["valid"], np.full(batch, points, np.int64), d["count_values"], d["lengths"]
        )
        self.uniforms = [
            ml.Uniforms(d[f"pick{call}"], d[f"r1{call}"], d[f"r2{call}"]) for call in range(stage2.MESH_LOSS_CALLS)
        ]
        self.graph = self.adam_graph = None
        self.alpha = xp.zeros((), dtype=xp.float32)  # Adam's factor, set before each replay
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
        into the graph's inputs: the host buffer filled, then one copy."""
        batch, _, points = self.key
        h = self.staging.host
        for i, sample in enumerate(samples):
            h["images"][i] = sample.images
            h["starts"][i] = sample.start
        h["packed"][...] = packed_transforms(np.stack([s.cameras for s in samples]))
        truth = ml.GroundTruth.host_arrays([s.labels for s in samples], np.float32, points)
        for name in ("points", "normals", "valid", "count_values"):
            h[name][...] = truth[name]
        h["lengths"][...] = truth["counts"]
        for call, uniforms in enumerate(ml.Uniforms.host(rng, batch, stage2.MESH_LOSS_CALLS, np.float32)):
            for name, value in zip(("pick", "r1", "r2"), uniforms, strict=True):
                h[f"{name}{call}"][...] = value
        self.staging.upload()

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

    def update(self, variables: dict, state: adam.AdamState) -> None:
        """Adam's step on the replayed gradients: eager while a moment is missing (the first step makes
        them), then a graph of the updates captured once, its factor copied in before each replay."""
        xp = self.xp
        grads = self.graph.outputs[1]
        if self.adam_graph is None and all(name in state.m for name in grads):
            # the kernel built for a factor on the device, on throwaway arrays, before the capture
            spare = {"x": xp.zeros(4, dtype=xp.float32)}
            adam.apply_updates(xp, spare, spare, adam.AdamState(state.config), self.alpha)
            self.device.synchronize()
            self.adam_graph = self.device.capture(
                lambda: adam.apply_updates(xp, variables, grads, state, self.alpha), warmup=0
            )
        if self.adam_graph is None:
            adam.adam_step(xp, variables, grads, state)
            return
        self.alpha.set(np.asarray(adam.step_factor(state), dtype=np.float32))
        self.adam_graph.replay()
        adam.advance(state)

    def release(self) -> None:
        for graph in (self.graph, self.adam_graph):
            if graph is not None:
                graph.release()
        self.graph = self.adam_graph = None


class _Staging:
    """Named arrays laid out in one pinned host buffer and one device buffer of the same bytes, so that
    all of them go to the device in one copy (each starts on a 256-byte boundary)."""

    def __init__(self, xp, fields: dict):
        import cupyx

        layout, size = {}, 0
        for name, (shape, dtype) in fields.items():
            nbytes = math.prod(shape) * np.dtype(dtype).itemsize
            layout[name] = (size, nbytes, shape, dtype)
            size += -(-nbytes // 256) * 256
        self.host_bytes = cupyx.empty_pinned((size,), dtype=np.uint8)
        self.device_bytes = xp.empty((size,), dtype=xp.uint8)
        self.host = {n: self.host_bytes[o : o + b].view(t).reshape(s) for n, (o, b, s, t) in layout.items()}
        self.device = {n: self.device_bytes[o : o + b].view(t).reshape(s) for n, (o, b, s, t) in layout.items()}

    def upload(self) -> None:
        self.device_bytes.set(self.host_bytes)
