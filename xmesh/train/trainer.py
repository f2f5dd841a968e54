"""``Trainer``: the weights and Adam's state of one stage, stepped through samples.

One :meth:`Trainer.step` is one Adam update, as the original's ``opt_op``: the stage's loss and its
gradients by official variable name (:func:`xmesh.train.step.batch_loss_and_gradients`), then TF1's
Adam (:mod:`xmesh.train.adam`) on every variable of the stage that has a gradient. With more than one
sample (``--batch-size B``, a deviation: the original takes one sample a step) the loss and the
gradients are the means over the samples, so one step with B equal samples is the step with one.

The loss's own random draws (the 4000 surface samples of each ``mesh_loss`` call) come from
``draw_rng``, a seeded generator whose state the checkpoints keep, so a resumed run draws what an
uninterrupted one draws. A loss or gradient that is not finite stops before any update
(:class:`NonFiniteLossError`, naming the samples and the step): the weights stay the last good ones.

On CuPy, stage 2's steps of up to ``graph_step.MAX_BATCH`` samples replay a CUDA Graph of the loss and
backward, and of Adam's updates (:mod:`xmesh.train.graph_step`), captured on a shape's first steps;
the draws and the arithmetic are the eager step's. There the updates follow the gradients on the
device, which skips them where anything is not finite, so the error above leaves the weights as they
were there too. A graph of more than ``graph_step.FEW_GRAPHS_BATCH`` samples holds much of the
device's memory (about 70 GiB at 32), so the trainer keeps one at a time then, and pads each such
batch's ground truth to the largest ladder size it has stepped at that batch size: the size grows a
few times in a run, and one graph serves the rest. ``graphs=False`` runs every step eagerly.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..backends import get_backend
from ..errors import XmeshError
from ..io.weights import expected_variables
from ..reconstruct import resolve_template
from . import graph_step
from .adam import AdamConfig, AdamState, adam_step, advance, step_factor
from .data import Sample
from .step import batch_loss_and_gradients


class NonFiniteLossError(XmeshError, ArithmeticError):
    """A training step's loss or gradient is NaN or infinite."""


class Trainer:
    """The variables of ``stage`` (1 or 2) from ``weights`` (a dict by official name; the other stage's,
    if given, are kept as they are) and their Adam moments, resident on ``backend`` ("numpy" or
    "cupy"). ``lr``: Adam's learning rate (the original's 1e-5); ``seed``: the loss's own draws;
    ``graphs``: replay small batches' steps as CUDA Graphs where the backend can (see the module)."""

    def __init__(
        self,
        stage: int,
        weights: dict[str, np.ndarray],
        template: Any = None,
        backend: str = "numpy",
        lr: float = 1e-5,
        seed: int = 123,
        graphs: bool = True,
    ):
        self.stage = int(stage)
        self.template = resolve_template(template)
        self.backend = backend
        self.device = get_backend(backend)
        xp = self.device.xp
        self.weights = {name: xp.asarray(np.array(value, dtype=np.float32)) for name, value in weights.items()}
        self.trained = list(expected_variables(self.stage))
        self.adam = AdamState(AdamConfig(learning_rate=lr))
        self.draw_rng = np.random.default_rng(seed)
        self.graphs = bool(graphs) and self.stage == 2 and hasattr(self.device, "capture")
        self._graphs: OrderedDict = OrderedDict()  # (batch, views, points) -> StepGraph, oldest first
        self._graph_failed: set = set()
        self._largest_points: dict = {}  # batch -> the largest padded ground truth stepped (large batches)

    def host_weights(self, names=None) -> dict[str, np.ndarray]:
        """Host copies of the weights (all, or ``names``)."""
        return {name: np.array(self.device.to_numpy(self.weights[name])) for name in (names or self.weights)}

    def trained_weights(self) -> dict[str, np.ndarray]:
        return self.host_weights(self.trained)

    def adam_arrays(self) -> dict[str, np.ndarray]:
        return self.adam.arrays(to_numpy=self.device.to_numpy)

    def restore(self, weights: dict[str, np.ndarray], adam: dict[str, np.ndarray], draw_state: dict) -> None:
        """Take a checkpoint's trained weights, Adam state and draw generator state."""
        xp = self.device.xp
        self.weights.update({name: xp.asarray(np.array(weights[name], dtype=np.float32)) for name in self.trained})
        self.adam = AdamState.from_arrays(adam, asarray=xp.asarray)
        self.drop_graphs()  # they read the arrays replaced
        self.draw_rng = np.random.Generator(getattr(np.random, draw_state["bit_generator"])())
        self.draw_rng.bit_generator.state = draw_state

    @property
    def captured_shapes(self) -> list:
        """The (batch, views, padded ground-truth points) shapes whose step is held as a CUDA Graph."""
        return list(self._graphs)

    def drop_graphs(self) -> None:
        """Release the captured step graphs (the next steps capture again)."""
        while self._graphs:
            self._graphs.popitem()[1].release()

    def _graph_key(self, samples: Sequence[Sample]) -> tuple | None:
        """The (batch, views, padded ground-truth points) of the graph that would step ``samples``; None
        where they step eagerly."""
        batch = len(samples)
        if not self.graphs or not samples or batch > graph_step.MAX_BATCH:
            return None
        points = graph_step.padded_size(max(len(s.labels) for s in samples))
        if batch > graph_step.FEW_GRAPHS_BATCH:
            points = max(points, self._largest_points.get(batch, 0))
        return batch, samples[0].images.shape[0], points

    def _prepare(self, samples: Sequence[Sample] | Callable | None) -> None:
        """The inputs of a coming step of ``samples`` (or of what the function ``samples`` returns now)
        written now, if its graph is captured. A sample they cannot be made from is left to its own step,
        which fills them again and says what is wrong before its compute: this step's device work, Adam's
        updates included, is under way."""
        if callable(samples):
            samples = samples()
        graph = self._graphs.get(self._graph_key(samples)) if samples else None
        if graph is not None:
            try:
                graph.prepare(samples, self.draw_rng)
            except Exception:  # noqa: BLE001, S110  (nothing taken ahead: graph.inputs.ahead stays None)
                pass

    def _graph(self, samples: Sequence[Sample]):
        """The captured step for these samples' shape, loaded with them and this step's draws; None where
        the step runs eagerly (no graphs here, a large batch, or a shape whose capture failed)."""
        key = self._graph_key(samples)
        if key is None or key in self._graph_failed:
            return None
        large = key[0] > graph_step.FEW_GRAPHS_BATCH
        if large:
            self._largest_points[key[0]] = key[2]
        graph = self._graphs.get(key)
        if graph is not None:
            self._graphs.move_to_end(key)
            graph.load(samples, self.draw_rng, step_factor(self.adam))
            return graph
        while len(self._graphs) >= (1 if large else graph_step.MAX_GRAPHS):  # a large batch's needs the memory
            self._graphs.popitem(last=False)[1].release()
        draws_before = self.draw_rng.bit_generator.state
        try:
            graph = graph_step.StepGraph(self.device, self.weights, self.template, *key)
            graph.load(samples, self.draw_rng, step_factor(self.adam))
            graph.capture(self.weights, self.adam)
        except Exception as exc:  # noqa: BLE001  (the eager step runs instead, and raises what is wrong)
            self._graph_failed.add(key)
            self.draw_rng.bit_generator.state = draws_before
            if graph is not None:
                graph.release()
            if self.device.is_out_of_memory(exc):
                self.drop_graphs()  # the eager step needs the memory the other shapes' graphs hold
            self.device.release_memory()
            warnings.warn(
                f"the training step of {key[0]} sample(s) could not be captured as a CUDA Graph "
                f"({type(exc).__name__}: {exc}); it runs eagerly",
                RuntimeWarning,
                stacklevel=3,
            )
            return None
        self._graphs[key] = graph
        return graph

    def step(
        self,
        samples: Sequence[Sample],
        step_number: int | None = None,
        following: Sequence[Sample] | Callable[[], Sequence[Sample] | None] | None = None,
    ):
        """One Adam step on the mean loss of ``samples``; returns the step's LossAndGradients, its gradients
        on the trainer's device (a replayed graph's arrays, which the next step overwrites).
        ``following``: the next step's samples, if known, or a function that returns them (None while
        they are not loaded), called once the device works on this step; where the steps replay graphs,
        their inputs are written then (the next step's draws still its own)."""
        xp = self.device.xp
        graph = self._graph(samples)
        if graph is not None:  # the updates too, skipped on the device where anything is not finite
            result, bad = graph.run(meanwhile=lambda: self._prepare(following))
        else:
            with np.errstate(all="ignore"):  # an overflow is reported below, as the step's one error
                result = batch_loss_and_gradients(
                    self.stage,
                    self.weights,
                    self.template,
                    np.stack([s.images for s in samples]),
                    np.stack([s.cameras for s in samples]),
                    [s.labels for s in samples],
                    [s.start for s in samples] if self.stage == 2 else None,
                    None,
                    self.backend,
                    self.draw_rng,
                    to_host=False,
                )
            # a NaN or an infinity anywhere makes its gradient's sum one: the sums come back at once
            sums = self.device.to_numpy(xp.stack([xp.sum(g) for g in result.gradients.values()]))
            bad = (
                []
                if bool(np.isfinite(sums).all())
                else [name for name, g in result.gradients.items() if not bool(xp.all(xp.isfinite(g)))]
            )
        if not np.isfinite(result.loss) or bad:
            where = f"step {step_number}" if step_number is not None else "this step"
            what = (
                f"the loss is {result.loss}"
                if not np.isfinite(result.loss)
                else f"the gradient of {bad[0]} holds NaN or infinity"
            )
            raise NonFiniteLossError(
                f"{where}, sample(s) {', '.join(str(s.id) for s in samples)}: {what}; the run stopped before "
                "updating the weights, and the last good checkpoint is kept"
            )
        if graph is not None:
            advance(self.adam)
        else:
            adam_step(xp, self.weights, result.gradients, self.adam)
        return result
