"""Stage 2's training step replayed as a CUDA Graph on CuPy: for the small batches whose step the host's
launches bound (one sample a step, the original's, makes about 1,500 launches from Python), and for
batches of up to 32, whose eager step waits about a tenth of its time on the host (the inputs' stacking
and copies, the gaps between launches).

A :class:`StepGraph` belongs to one (batch size, views, padded ground-truth size). It holds the step's
inputs (images, camera transforms, starting meshes, ground truth, the own draws' uniforms, and Adam's
factor, which changes every step) as views of one pinned host buffer and one device buffer, so that a
step's inputs go over in one copy; the loss and backward captured once as a graph
(:meth:`CupyDevice.capture`) with its outputs, the gradients and one report array (the loss, the
terms), the CNN regulariser in it made in two launches (:class:`xmesh.train.regularisers_cupy.L2Table`);
and Adam's updates of every variable captured as a second graph
(:class:`xmesh.train.adam_cupy.AdamTable`), which first marks in the report each gradient holding a
NaN or an infinity and skips every update where anything is marked. The two replay back to back and
the report comes back in one copy, so a step waits for the device once. The weights and moments are
updated in place, where the graphs read them. While the device replays a step, the host writes the
next step's inputs into the host buffer where the trainer knows them (:class:`HostInputs`: the
samples, and the uniforms from a copy of the generator, taken only if nothing moved it since) and
sends them to a spare device buffer on a side stream, so a step's own work before its replay is Adam's
factor and a copy on the device.

The arithmetic is the eager step's, kernel for kernel, with two differences. The regulariser's sum of
squares adds the same squares in another order. The ground truth is padded to
a size from a short ladder (:func:`padded_size`), so that a few graphs serve a dataset whose samples
have different point counts; the padded rows lie far from any mesh, count as invalid and are skipped by
the nearest neighbours through lengths read on the device, so the losses take the same values, sums
over the padded rows aside (the same terms in another order, within float32 rounding).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..io.weights import STAGE_PREFIXES
from ..model.camera import packed_transforms
from ..model.projection import DeviceTransforms
from . import mesh_losses as ml
from . import stage2
from .adam import AdamState
from .adam_cupy import AdamTable
from .data import Sample
from .regularisers import CNN_FACTOR, cnn_kernels
from .regularisers_cupy import L2Table
from .step import LossAndGradients, stage2_template

MAX_BATCH = 32  # the largest batch a trainer replays as a graph (its graph holds about 70 GiB at 32)
FEW_GRAPHS_BATCH = 4  # up to this batch a trainer keeps MAX_GRAPHS graphs; above it, one (see Trainer)
MAX_GRAPHS = 4  # graphs a trainer keeps of small batches (the least recently used is released first)
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


def input_fields(batch: int, views: int, vertices: int, points: int) -> dict:
    """The replayed step's inputs, name -> (shape, dtype): images, packed camera transforms, starting
    meshes, ground truth padded to ``points``, Adam's factor and each mesh_loss call's uniforms."""
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
    return fields


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
        self.cnn_l2 = L2Table(xp, cnn_kernels(self.weights, 2))  # the trainer's kernels, by address
        fields = input_fields(batch, views, int(self.template.reciprocal.shape[0]), points)
        self.staging = InputStaging(xp, fields)
        self.inputs = HostInputs(self.staging.host, points)
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
            regulariser=lambda: self.cnn_l2.penalty(CNN_FACTOR),
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
        buffer filled, then one copy; or, taken as :meth:`prepare` filled and sent them ahead, a copy on
        the device and Adam's factor."""
        self.staging.settle()  # a copy sent ahead has read the host buffer
        taken = self.inputs.fill(samples, rng, alpha)
        self.staging.upload(ahead=taken)

    def prepare(self, samples: Sequence[Sample], rng: np.random.Generator) -> None:
        """Fill the host buffer for a coming step of ``samples`` now, while the device works on this one
        (:meth:`HostInputs.fill_ahead`), and send it to the device's spare buffer: its :meth:`load` then
        only adds Adam's factor and copies on the device."""
        self.staging.settle()
        self.inputs.fill_ahead(samples, rng)
        self.staging.send_ahead()

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

    def run(self, meanwhile=None) -> tuple[LossAndGradients, list[str]]:
        """Replay the step and Adam's updates on the loaded inputs: the step's LossAndGradients (its
        gradients the graph's arrays, overwritten by the next replay) and the names of the gradients that
        hold a NaN or an infinity. Where any does, or the loss or a term is not finite, no weight and no
        moment changed. ``meanwhile()``, if given, runs on the host while the device replays."""
        self.graph.replay()
        self.adam_graph.replay()
        if meanwhile is not None:
            meanwhile()
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


class InputStaging:
    """Named arrays laid out in one pinned host buffer and one device buffer of the same bytes, so that
    all of them go to the device in one copy (each starts on a 256-byte boundary). A spare device buffer
    takes a coming step's inputs on a side stream while the device computes (:meth:`send_ahead`): at
    batch 32 the host-to-device copy of some 85 MB takes about 1.5 ms, a copy on the device a few
    hundredths of that."""

    def __init__(self, xp, fields: dict):
        import cupy
        import cupyx

        layout, size = {}, 0
        for name, (shape, dtype) in fields.items():
            nbytes = math.prod(shape) * np.dtype(dtype).itemsize
            layout[name] = (size, nbytes, shape, dtype)
            size += -(-nbytes // 256) * 256
        self.host_bytes = cupyx.empty_pinned((size,), dtype=np.uint8)
        self.device_bytes = xp.empty((size,), dtype=xp.uint8)
        self.spare_bytes = xp.empty((size,), dtype=xp.uint8)
        self.host = {n: self.host_bytes[o : o + b].view(t).reshape(s) for n, (o, b, s, t) in layout.items()}
        self.device = {n: self.device_bytes[o : o + b].view(t).reshape(s) for n, (o, b, s, t) in layout.items()}
        self.uploaded = cupy.cuda.Event(disable_timing=True)  # this step's copies have read what they read
        self.sent = cupy.cuda.Event(disable_timing=True)  # the copy ahead is in the spare buffer
        self.side = cupy.cuda.Stream(non_blocking=True)
        self.in_flight = False  # a copy ahead may still be reading the host buffer
        self.ready = False  # the spare buffer holds the host buffer as the last fill_ahead left it

    def settle(self) -> None:
        """Wait until the copies that read the host buffer (this step's, one sent ahead) have read it,
        before the host writes it again."""
        self.uploaded.synchronize()
        if self.in_flight:
            self.sent.synchronize()
            self.in_flight = False

    def send_ahead(self) -> None:
        """Copy the host buffer into the spare one on the side stream, after the device has taken this
        step's inputs from the spare buffer (``uploaded``)."""
        self.side.wait_event(self.uploaded)
        self.spare_bytes.set(self.host_bytes, stream=self.side)
        self.sent.record(self.side)
        self.in_flight = self.ready = True

    def upload(self, ahead: bool = False) -> None:
        """The inputs to the device, on the current stream (``uploaded`` marks the copies' end): with
        ``ahead`` and a spare buffer holding them, that buffer copied on the device and Adam's factor
        from the host; else the host buffer."""
        import cupy

        if ahead and self.ready:
            stream = cupy.cuda.get_current_stream()
            stream.wait_event(self.sent)
            self.device_bytes.data.copy_from_device_async(self.spare_bytes.data, self.device_bytes.nbytes, stream)
            self.device["alpha"].set(self.host["alpha"])
        else:
            self.device_bytes.set(self.host_bytes)
        self.ready = False
        self.uploaded.record()


def fill_inputs(host: dict, samples: Sequence[Sample], rng: np.random.Generator, points: int) -> None:
    """A step's inputs but Adam's factor written into ``host`` (:class:`StepGraph`'s fields by name):
    the samples' images, starting meshes and camera transforms, their ground truth padded to
    ``points``, and the own draws' uniforms from ``rng``."""
    for i, sample in enumerate(samples):
        host["images"][i] = sample.images
        host["starts"][i] = sample.start
    host["packed"][...] = packed_transforms(np.stack([s.cameras for s in samples]))
    fields = {name: host[name] for name in ("points", "normals", "valid", "count_values")}
    truth = ml.GroundTruth.host_arrays([s.labels for s in samples], np.float32, points, out=fields)
    host["lengths"][...] = truth["counts"]
    calls = range(stage2.MESH_LOSS_CALLS)
    triples = [(host[f"pick{call}"], host[f"r1{call}"], host[f"r2{call}"]) for call in calls]
    ml.Uniforms.host(rng, len(samples), stage2.MESH_LOSS_CALLS, np.float32, out=triples)


@dataclass(frozen=True)
class _Ahead:
    samples: tuple  # the sample objects filled in
    before: dict  # the draws' generator state they started from
    after: dict  # and the state they left


class HostInputs:
    """A step's host inputs (``host``: :class:`StepGraph`'s fields by name, ground truth padded to
    ``points``), filled at the step (:meth:`fill`) or ahead of it (:meth:`fill_ahead`), while the device
    works on the step before. Filled ahead, the uniforms come from a copy of the generator; the step
    takes them only if it has the same sample objects and its generator is still where the copy started,
    and then moves the generator to where the copy ended. So the draws, and the generator's state a
    checkpoint saves after a step, are those of filling at the step."""

    def __init__(self, host: dict, points: int):
        self.host = host
        self.points = points
        self.ahead: _Ahead | None = None
        self._spare: np.random.Generator | None = None

    def fill_ahead(self, samples: Sequence[Sample], rng: np.random.Generator) -> None:
        if self._spare is None or type(self._spare.bit_generator) is not type(rng.bit_generator):
            self._spare = np.random.Generator(type(rng.bit_generator)())
        before = rng.bit_generator.state
        self._spare.bit_generator.state = before
        self.ahead = None  # the buffer is being overwritten
        fill_inputs(self.host, samples, self._spare, self.points)
        self.ahead = _Ahead(tuple(samples), before, self._spare.bit_generator.state)

    def fill(self, samples: Sequence[Sample], rng: np.random.Generator, alpha: float) -> bool:
        """The step's inputs in the host buffer; True where they are those filled ahead."""
        ahead, self.ahead = self.ahead, None
        taken = (
            ahead is not None
            and len(ahead.samples) == len(samples)
            and all(a is b for a, b in zip(ahead.samples, samples, strict=True))
            and rng.bit_generator.state == ahead.before
        )
        if taken:
            rng.bit_generator.state = ahead.after
        else:
            fill_inputs(self.host, samples, rng, self.points)
        self.host["alpha"][...] = alpha
        return taken
