"""How a dataset run is carried out: an :class:`Executor` runs (sample, paths) items with
:class:`~xmesh.pipeline.settings.RunSettings` and hands back the rows of each finished part.

Two implementations: :class:`LocalExecutor`, this process with its loader and writer processes,
and :class:`xmesh.cluster.driver.DaskExecutor`, a Dask cluster's workers. Either calls
``commit(text)`` with the CSV lines of finished samples (empty without ground truth) once their
mesh files are on disk, advances ``progress`` (anything with ``update(n)``) by the samples done,
and returns this run's figures: ``evaluated``, ``seconds``, ``samples_per_s`` and ``timing``
(seconds per stage, and the start-up's phases from ``clock``, a
:class:`~xmesh.pipeline.startup.StartupClock`, closed at the first batch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..results.samples_csv import format_rows
from .loop import BatchResult, check_finite, run_batches
from .settings import RunSettings
from .startup import StartupClock
from .writing import BatchFinisher, MeshWriter, prediction_stem


class Executor(Protocol):
    def run(
        self,
        todo: list,
        settings: RunSettings,
        commit: Callable[[str], None],
        progress,
        clock: StartupClock | None = None,
    ) -> dict:
        """Run ``todo``; see the module docstring."""


class LocalExecutor:
    """The pipeline in this process: ``model`` a Reconstructor; ``loader_pool`` an executor from
    :func:`xmesh.pipeline.loading.start_pool` started before the model was built, so that their
    start-ups overlapped (else one is started for the run)."""

    def __init__(self, model, loader_pool=None):
        self.model = model
        self.loader_pool = loader_pool

    def run(
        self,
        todo: list,
        settings: RunSettings,
        commit: Callable[[str], None],
        progress,
        clock: StartupClock | None = None,
    ) -> dict:
        writer = (
            MeshWriter(settings.mesh_dir, self.model.faces, settings.writers, settings.formats, settings.ground_root)
            if settings.mesh_dir is not None
            else None
        )

        def finish(result: BatchResult) -> None:  # the finisher's thread, in order, after the meshes
            commit(format_rows(result) if settings.with_gt else "")
            progress.update(len(result.samples))

        finisher = BatchFinisher(finish)

        def on_batch(result: BatchResult) -> None:
            check_finite(result)
            futures = writer.submit([prediction_stem(s) for s in result.samples], result.vertices) if writer else []
            finisher.put(result, futures)

        started = (clock or StartupClock()).first_batch()
        try:
            timing = run_batches(self.model, settings.batches(todo), on_batch, settings, loader_pool=self.loader_pool)
        finally:
            try:
                finisher.close()  # commit every batch that completed, also when the run failed
            finally:
                if writer is not None:
                    writer.close()
        timing.write = finisher.busy_s + finisher.mesh_s / max(1, settings.writers)
        return {
            "evaluated": len(todo),
            "seconds": timing.wall,
            "samples_per_s": len(todo) / timing.wall if timing.wall > 0 else 0.0,
            "timing": {**timing.as_dict(), **started},
        }
