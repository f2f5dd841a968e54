"""The training step as a timed workload: one :meth:`Trainer.step` on a batch, for the benchmark script
(``scripts/train_bench.py``) and the asv suite alike.

The sample is the golden training sample where ``../shared`` is there (the demo images and cameras,
3000 ground-truth points with normals, stage 1's mesh as stage 2's start), else the procedural demo
renderings with their object's surface samples and stage 1's mesh of the synthetic weights. A batch of
B repeats it B times: the arithmetic of B different samples, without B files to read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..benchmarking import default_template, golden_path
from ..io.weights import synthetic_weights
from .data import Sample
from .trainer import Trainer

WEIGHTS_SEED = 1


def default_sample(template) -> tuple[Sample, str]:
    """One training sample and where it comes from."""
    from ..dataset import SampleId

    sample_id = SampleId.parse("02691156_benchmark_00.dat")
    path = golden_path("train_seed1.npz")
    if path is not None:
        with np.load(path) as data:
            return Sample(
                sample_id,
                np.asarray(data["images"], np.float32),
                np.asarray(data["cameras"], np.float32),
                np.asarray(data["labels"], np.float32),
                np.asarray(data["s2_features"], np.float32),
            ), f"golden training sample ({path})"
    from ..benchmarking import default_inputs
    from ..synthetic.dataset import demo_scene, ground_truth_points
    from .starts import Stage1Model

    images, cameras, _ = default_inputs()
    vertices, faces, rows = demo_scene(0)
    labels = ground_truth_points(vertices, faces, rows[0], 3000, np.random.default_rng(0)).astype(np.float32)
    coarse, _ = Stage1Model(synthetic_weights(WEIGHTS_SEED, stages=1), template).run(images[None], cameras[None])
    return Sample(
        sample_id, images, cameras, labels, np.asarray(coarse, np.float32)[0]
    ), "procedural demo renderings (synthetic.dataset.demo_scene, seed 0)"


@dataclass
class StepWorkload:
    """A Trainer of ``stage`` on ``backend`` (synthetic weights) and a batch of ``batch`` samples;
    ``graphs``: the trainer's CUDA Graphs (its default) or every step eager."""

    stage: int
    backend: str
    batch: int
    graphs: bool = True

    def __post_init__(self) -> None:
        template, self.template_source = default_template()
        sample, self.sample_source = default_sample(template)
        self.samples = [sample] * self.batch
        self.trainer = Trainer(self.stage, synthetic_weights(WEIGHTS_SEED), template, self.backend, graphs=self.graphs)

    def step(self) -> float:
        """One Adam step on the batch; its loss. The next step's samples are known, as in ``xmesh train``,
        whose loader has them ready: a replayed step writes their inputs while the device works."""
        return self.trainer.step(self.samples, following=self.samples).loss

    def release(self) -> None:
        """Give back the trainer's captured graphs and cached device memory (a graph of 32 samples holds
        about 70 GiB) before other work runs in the process."""
        self.trainer.drop_graphs()
        self.trainer.device.release_memory()

    def time_steps(self, steps: int, warmup: int = 1) -> dict:
        """Median seconds a step over ``steps`` steps after ``warmup`` untimed ones, and samples/s."""
        for _ in range(warmup):
            self.step()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            self.step()  # the loss and gradients come back to the host: the step is over
            times.append(time.perf_counter() - start)
        median = float(np.median(times))
        return {
            "stage": self.stage,
            "backend": self.backend,
            "batch": self.batch,
            "steps": steps,
            "median_s": median,
            "min_s": float(np.min(times)),
            "samples_per_s": self.batch / median,
        }
