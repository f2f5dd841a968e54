"""Stage 2's training step replayed as a CUDA Graph (xmesh/train/graph_step.py) against the eager step,
and the ground-truth sizes' ladder that decides how many graphs a dataset needs."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

from conftest import requires_cuda
from xmesh.train import graph_step


def test_the_ladder_holds_every_size_with_bounded_padding():
    sizes = sorted({graph_step.padded_size(p) for p in range(1, 20001)})
    for points in (1, 1023, 1024, 1025, 2500, 3000, 4097, 9999, 20000):
        size = graph_step.padded_size(points)
        assert size >= points and size % 256 == 0
        assert size <= max(graph_step.SMALLEST_SIZE, 1.42 * points + 256)
    assert len(sizes) <= 12  # 1 to 20,000 points: a dozen graphs at most
    assert sizes == sorted(sizes) and sizes[0] == graph_step.SMALLEST_SIZE


def _host(points: int) -> dict:
    return {
        name: np.full(shape, np.nan, dtype) if np.dtype(dtype).kind == "f" else np.zeros(shape, dtype)
        for name, (shape, dtype) in graph_step.input_fields(1, 3, 2466, points).items()
    }


def test_inputs_filled_ahead_are_the_steps_own_and_leave_the_generator_where_the_step_would():
    """Inputs written while the step before runs (the uniforms from a copy of the generator) equal those
    written at the step, and the step moves the generator as far as its own draws would; where the
    generator moved in between, or the samples are others, the step writes its own (CPU)."""
    from xmesh.benchmarking import default_template
    from xmesh.train.bench import default_sample

    template, _ = default_template()
    sample, _ = default_sample(template)
    other = dataclasses.replace(sample, labels=sample.labels[::-1].copy())
    points = graph_step.padded_size(len(sample.labels))

    def at_step(samples, state):
        host, rng = _host(points), np.random.default_rng()
        rng.bit_generator.state = state
        graph_step.HostInputs(host, points).fill(samples, rng, 0.25)
        return host, rng.bit_generator.state

    rng = np.random.default_rng(5)
    inputs = graph_step.HostInputs(_host(points), points)
    for moved, samples_then in ((False, [sample]), (True, [sample]), (False, [other])):
        inputs.fill_ahead([sample], rng)
        if moved:
            rng.random(3)  # a draw between: the copy's uniforms are no longer the step's
        start = rng.bit_generator.state
        inputs.fill(samples_then, rng, 0.25)
        want, state = at_step(samples_then, start)
        assert rng.bit_generator.state == state
        for name, value in want.items():
            np.testing.assert_array_equal(inputs.host[name], value, err_msg=name)
        assert np.isfinite(inputs.host["images"]).all() and inputs.host["lengths"][0] == len(sample.labels)


@pytest.fixture(scope="module")
def trainer():
    """A stage-2 trainer on the GPU with graphs, and three samples: the benchmark's, one with fewer
    ground-truth points (the same graph), and one of more points than its ladder step holds (another)."""
    from xmesh.benchmarking import default_template
    from xmesh.io.weights import synthetic_weights
    from xmesh.train.bench import default_sample
    from xmesh.train.trainer import Trainer

    template, _ = default_template()
    sample, _ = default_sample(template)
    fewer = dataclasses.replace(sample, labels=sample.labels[: len(sample.labels) - 37])
    size = graph_step.padded_size(len(sample.labels))
    more = dataclasses.replace(sample, labels=np.resize(sample.labels, (size + 1, 6)))  # repeated points
    return Trainer(2, synthetic_weights(1), template, "cupy", graphs=True), [sample, fewer, more]


def assert_replayed_step_is_the_eager_one(trainer, batch: list, step: int, following: list | None) -> None:
    """A replayed step (after Adam moved the weights in place, writing the ``following`` step's inputs
    while it runs) against the eager step on the weights and draws it had. The projection's and losses'
    backward add atomically in any order, so a gradient is held to 1e-4 of its norm plus 1e-6 of the
    largest gradient element (the score layers' biases are zero but for rounding: a softmax ignores a
    shift)."""
    from xmesh.train.step import batch_loss_and_gradients

    rng = np.random.default_rng()
    rng.bit_generator.state = trainer.draw_rng.bit_generator.state
    reference = batch_loss_and_gradients(
        2,
        trainer.weights,
        trainer.template,
        np.stack([s.images for s in batch]),
        np.stack([s.cameras for s in batch]),
        [s.labels for s in batch],
        [s.start for s in batch],
        backend="cupy",
        rng=rng,
    )
    ours = trainer.step(batch, step, following=following)
    assert trainer.draw_rng.bit_generator.state == rng.bit_generator.state  # the same draws
    assert abs(ours.loss - reference.loss) <= 1e-5 * abs(reference.loss)
    for name, value in reference.terms.items():
        assert abs(ours.terms[name] - value) <= 1e-5 * abs(value) + 1e-7, name
    largest = max(np.abs(g).max() for g in reference.gradients.values())
    ratios = {}
    for name, want in reference.gradients.items():
        got = trainer.device.to_numpy(ours.gradients[name]).astype(np.float64)
        allowed = 1e-4 * np.linalg.norm(want) + 1e-6 * largest * np.sqrt(want.size)
        ratios[name] = np.linalg.norm(got - want) / allowed
    worst = max(ratios, key=ratios.get)
    print(
        f"step {step}, batch {len(batch)}: loss {ours.loss:.6f} / {reference.loss:.6f}; "
        f"worst gradient at {ratios[worst]:.2f} of its bound ({worst})"
    )
    assert ratios[worst] <= 1.0


@requires_cuda
@pytest.mark.gpu
def test_graph_steps_match_the_eager_step_on_the_same_weights(trainer, monkeypatch):
    """Four replayed steps of one sample, each writing the next one's inputs while it runs where that
    one's graph is captured (and sending them to the device's spare buffer), against the eager step; the
    first two samples share a ladder step, the third needs another graph. The second and fourth steps
    take their inputs from the spare buffer, the first and third from the host."""
    trainer, samples = trainer
    from_spare = []
    upload = graph_step.InputStaging.upload

    def recording(staging, ahead=False):
        from_spare.append(ahead and staging.ready)
        upload(staging, ahead)

    monkeypatch.setattr(graph_step.InputStaging, "upload", recording)
    order = [samples[0], samples[1], samples[2], samples[0]]
    for step, sample in enumerate(order, start=1):
        following = [order[step]] if step < len(order) else None
        assert_replayed_step_is_the_eager_one(trainer, [sample], step, following)
    assert len(trainer.captured_shapes) == 2
    assert from_spare == [False, True, False, True]


@requires_cuda
@pytest.mark.gpu
def test_a_large_batch_keeps_one_graph_padded_to_the_largest_ground_truth(trainer):
    """Above FEW_GRAPHS_BATCH samples the trainer keeps one graph: a batch with the larger ground truth
    releases the small batches' graphs, and a later batch of smaller ground truth replays the same graph
    (padded further), each step the eager one."""
    trainer, samples = trainer
    size = len(samples[0].labels)
    batch = graph_step.FEW_GRAPHS_BATCH + 1
    larger = [samples[2]] + [samples[0]] * (batch - 1)
    smaller = [samples[1]] * batch
    order = [larger, smaller, smaller]
    for step, chosen in enumerate(order, start=1):
        assert_replayed_step_is_the_eager_one(trainer, chosen, step, order[step] if step < len(order) else None)
        assert trainer.captured_shapes == [(batch, 3, graph_step.padded_size(len(samples[2].labels)))]
    assert graph_step.padded_size(size) < trainer.captured_shapes[0][2]


@requires_cuda
@pytest.mark.gpu
def test_restore_drops_the_graphs(trainer):
    trainer, samples = trainer
    trainer.step([samples[0]])
    assert trainer.captured_shapes
    trainer.restore(trainer.trained_weights(), trainer.adam_arrays(), trainer.draw_rng.bit_generator.state)
    assert trainer.captured_shapes == []
    result = trainer.step([samples[0]])  # captured again on the restored arrays
    assert np.isfinite(result.loss) and trainer.captured_shapes


def test_a_shape_whose_capture_fails_runs_eagerly_with_the_eager_draws(monkeypatch):
    """A capture that fails (a stand-in graph that runs out of memory) warns once, releases what it made,
    puts the draws back and runs the step eagerly; the shape stays eager after (CPU: NumPy's step)."""
    from xmesh.benchmarking import default_template
    from xmesh.io.weights import synthetic_weights
    from xmesh.train import mesh_losses
    from xmesh.train.bench import default_sample
    from xmesh.train.trainer import Trainer

    made, released = [], []

    class OutOfMemory:
        def __init__(self, device, weights, template, *key):
            made.append(key)

        def load(self, samples, rng, alpha):
            rng.random(5)  # draws taken, as the real load takes them

        def capture(self, variables, state):
            raise MemoryError("out of memory while capturing")

        def release(self):
            released.append(True)

    monkeypatch.setattr(graph_step, "StepGraph", OutOfMemory)
    template, _ = default_template()
    sample, _ = default_sample(template)
    trainer = Trainer(2, synthetic_weights(1), template, "numpy")
    trainer.graphs = True  # as on a GPU
    expected = np.random.default_rng()
    for step in (1, 2):
        expected.bit_generator.state = trainer.draw_rng.bit_generator.state
        mesh_losses.Uniforms.host(expected, 1, 2, np.float32)  # the eager step's own draws
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = trainer.step([sample], step)
        said = [str(w.message) for w in caught if "could not be captured" in str(w.message)]
        assert len(said) == (1 if step == 1 else 0) and (step > 1 or "MemoryError" in said[0])
        assert np.isfinite(result.loss)
        assert trainer.draw_rng.bit_generator.state == expected.bit_generator.state
    assert len(made) == 1 and released == [True] and trainer.captured_shapes == []


class StandInGraph:
    """A CPU stand-in for graph_step.StepGraph that records what the trainer asks of it in ``calls``."""

    calls: list = []
    loss = 2.5

    def __init__(self, device, weights, template, *key):
        pass

    def load(self, samples, rng, alpha):
        self.calls.append("load")

    def capture(self, variables, state):
        self.calls.append("capture")

    def prepare(self, samples, rng):
        self.calls.append(f"prepare {len(samples)}")

    def run(self, meanwhile=None):
        from xmesh.train.step import LossAndGradients

        self.calls.append("replay")
        meanwhile()
        return LossAndGradients(self.loss, {"chamfer": self.loss}, {}), []

    def release(self):
        pass


def stand_in_trainer(monkeypatch, graph: type):
    """A NumPy trainer whose steps go to ``graph`` as a GPU's go to their captured graphs; and a sample."""
    from xmesh.benchmarking import default_template
    from xmesh.io.weights import synthetic_weights
    from xmesh.train.bench import default_sample
    from xmesh.train.trainer import Trainer

    monkeypatch.setattr(graph_step, "StepGraph", graph)
    template, _ = default_template()
    sample, _ = default_sample(template)
    trainer = Trainer(2, synthetic_weights(1), template, "numpy")
    trainer.graphs = True  # as on a GPU
    return trainer, sample


def test_a_next_step_whose_inputs_cannot_be_made_is_left_to_its_own_step(monkeypatch):
    """Writing the next step's inputs runs while this step's device work, Adam's updates included, is
    under way: where it fails, this step still completes (Adam's state advances once) and the next step
    loads its own inputs (CPU: a stand-in graph whose prepare fails)."""

    class FailingPrepare(StandInGraph):
        calls = []

        def prepare(self, samples, rng):
            super().prepare(samples, rng)
            raise ValueError("a sample of another shape")

    trainer, sample = stand_in_trainer(monkeypatch, FailingPrepare)
    for step in (1, 2):
        result = trainer.step([sample], step, following=[sample])
        assert result.loss == 2.5 and trainer.adam.step == step
    assert FailingPrepare.calls == ["load", "capture", "replay", "prepare 1", "load", "replay", "prepare 1"]


def test_the_next_steps_samples_are_asked_for_once_the_device_works(monkeypatch):
    """``following`` given as a function is called after this step's replay is launched, so samples that
    finish loading during the step (the first step's capture) still have their inputs written ahead; a
    function that returns None (not loaded yet) leaves the next step to write its own (CPU: a stand-in
    graph)."""

    class Recording(StandInGraph):
        calls = []

    trainer, sample = stand_in_trainer(monkeypatch, Recording)

    def loaded():
        Recording.calls.append("asked")
        return [sample] if len(Recording.calls) > 4 else None

    for step in (1, 2):
        trainer.step([sample], step, following=loaded)
    assert Recording.calls == ["load", "capture", "replay", "asked", "load", "replay", "asked", "prepare 1"]
