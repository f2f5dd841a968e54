"""Stage 2's training step replayed as a CUDA Graph on CuPy, for the small batches whose step the host's
launches bound (one sample a step, the original's, makes about 1,500 launches from Python).

A :class:`StepGraph` belongs to one (batch size, views, padded ground-truth size). It holds the step's
inputs (images, camera transforms, starting meshes, ground truth, the own draws' uniforms, and Adam's
factor, which changes every step) as views of one pinned host buffer and one device buffer, so that a
step's inputs go over in one copy; the loss and backward captured once as a graph
(:meth:`CupyDevice.capture`) with its outputs, the gradients and one report array (the loss, the
terms); and Adam's updates of every variable captured as a second graph
(:class:`xmesh.train.adam_cupy.AdamTable`), which first marks in the report each gradient holding a
NaN or an infinity and skips every update where anything is marked. The two replay back to back and
the report comes back in one copy, so a step waits for the device once. The weights and moments are
updated in place, where the graphs read them.

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
from .adam import AdamState
from .adam_cupy import AdamTable
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
            "alpha": ((1,), f32),
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
        self.alpha = d["alpha"]
        self.graph = self.adam_graph = self.adam_table = None
        self.term_names: list[str] = []
        self.gradient_names: list[str] = []

    def _loss_and_gradients(self):
        """The captured work: the loss, its terms and gradients, and the report: the loss and the terms,
        then zeros for the updates' graph to mark (one a gradient, and one for anything)."""
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
        values = [total] + [terms[n] for n in self.term_names]
        report = xp.zeros((len(values) + len(grads) + 1,), dtype=total.dtype)
        for i, value in enumerate(values):
            report[i] = value
        return report, grads

    def load(self, samples: Sequence[Sample], rng: np.random.Generator, alpha: float) -> None:
        """Copy ``samples``, this step's uniforms (drawn from ``rng`` as the eager step draws them) and
        Adam's factor ``alpha`` (:func:`xmesh.train.adam.step_factor`) into the graph's inputs: the host
        buffer filled, then one copy."""
        batch, _, points = self.key
        h = self.staging.host
        for i, sample in enumerate(samples):
            h["images"][i] = sample.images
            h["starts"][i] = sample.start
        h["packed"][...] = packed_transforms(np.stack([s.cameras for s in samples]))
        fields = {name: h[name] for name in ("points", "normals", "valid", "count_values")}
        truth = ml.GroundTruth.host_arrays([s.labels for s in samples], np.float32, points, out=fields)
        h["lengths"][...] = truth["counts"]
        h["alpha"][...] = alpha
        calls = range(stage2.MESH_LOSS_CALLS)
        triples = [(h[f"pick{call}"], h[f"r1{call}"], h[f"r2{call}"]) for call in calls]
        ml.Uniforms.host(rng, batch, stage2.MESH_LOSS_CALLS, np.float32, out=triples)
        self.staging.upload()

    def capture(self, variables: dict, state: AdamState) -> None:
        """Capture the step on the inputs loaded (after two eager runs that compile and fill its pool),
        then Adam's guarded updates of ``variables`` (the trainer's weights, name -> device array) with
        the moments of ``state`` (zero ones made where missing), which must stay where they are."""
        self.device.synchronize()  # the capture's runs take their own stream: the inputs are there first
        self.graph = self.device.capture(self._loss_and_gradients)
        report, grads = self.graph.outputs
        self.adam_table = table = AdamTable(self.xp, grads, variables, state)  # kept: the graph reads its arrays
        values = 1 + len(self.term_names)

        def updates():
            marks = report[values:]
            table.mark(report[:values], marks)
            table.update(marks, self.alpha)

        self.device.synchronize()
        self.adam_graph = self.device.capture(updates, warmup=0)

    def run(self) -> tuple[LossAndGradients, list[str]]:
        """Replay the step and Adam's updates on the loaded inputs: the step's LossAndGradients (its
        gradients the graph's arrays, overwritten by the next replay) and the names of the gradients that
        hold a NaN or an infinity. Where any does, or the loss or a term is not finite, no weight and no
        moment changed."""
        self.graph.replay()
        self.adam_graph.replay()
        host = self.device.to_numpy(self.graph.outputs[0]).astype(np.float64)
        terms = len(self.term_names)
        result = LossAndGradients(
            float(host[0]),
            {name: float(value) for name, value in zip(self.term_names, host[1 : 1 + terms], strict=True)},
            self.graph.outputs[1],
        )
        marks = host[1 + terms : -1]
        return result, [name for name, mark in zip(self.gradient_names, marks, strict=True) if mark]

    def release(self) -> None:
        for graph in (self.graph, self.adam_graph):
            if graph is not None:
                graph.release()
        self.graph = self.adam_graph = self.adam_table = None


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
