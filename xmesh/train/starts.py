"""Stage 2's starting meshes: stage 1's predictions, as the original trains stage 2 on them.

The original runs its trained stage-1 model over the training list once, keeps each sample's coarse
mesh as ``{synset}_{item}_00_predict.xyz`` (its ``coarse_intermediate`` folder) and feeds that mesh
to stage 2 at every step. :class:`StartMeshes` reads such a folder (the sample's own
``{id}_predict.xyz`` first, then the original's ``_00`` name); :func:`compute_starts` makes one from
stage-1 weights through the batch pipeline (:func:`xmesh.evaluate.reconstruct_dataset`, with
:class:`Stage1Model` in place of the whole network), once: the files are the run's cache, and a
sample whose file is there is not computed again.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..backends import get_backend
from ..dataset import DEFAULT_VIEWS, SampleId
from ..errors import FileFormatError, MissingFileError
from ..evaluate import reconstruct_dataset
from ..model import network
from ..model.params import prepare_stage1
from ..model.projection import DeviceTransforms
from ..pipeline.writing import XYZ_SUFFIX, prediction_stem


class Stage1Model:
    """Stage 1 alone with the pipeline's model interface (``backend``, ``faces``, ``run``): ``run``
    returns the coarse mesh in both places of (coarse, refined), so the pipeline writes stage 1's
    mesh where it writes a prediction."""

    def __init__(self, weights: dict, template, backend: str = "numpy", view_quirk: bool = True):
        self.backend = get_backend(backend)
        self.stage1 = prepare_stage1(self.backend, weights, template)
        self.view_quirk = bool(view_quirk)
        self.faces = np.asarray(template.faces_triangle[-1], dtype=np.int64)

    def run(self, images, cameras: np.ndarray):
        batch, views = cameras.shape[:2]
        tf = DeviceTransforms.from_cameras(self.backend, cameras)
        flat = self.backend.xp.reshape(self.backend.asarray(images), (batch * views, 224, 224, 3))
        coarse = network.run_stage1(self.backend, self.stage1, flat, tf, self.view_quirk)[-1]
        return coarse, coarse


class StartMeshes:
    """The starting meshes in ``folder`` (``*_predict.xyz``, one vertex a line), each checked to hold
    ``vertices`` rows of 3 finite numbers when read."""

    def __init__(self, folder: str | os.PathLike, vertices: int, option: str = "--starts"):
        self.folder = Path(folder)
        self.vertices = int(vertices)
        self.option = option

    def candidates(self, sample: SampleId) -> list[Path]:
        own = self.folder / f"{prediction_stem(sample)}{XYZ_SUFFIX}"
        original = self.folder / f"{sample.synset}_{sample.item}_00{XYZ_SUFFIX}"
        return [own] if own == original else [own, original]

    def path(self, sample: SampleId) -> Path | None:
        return next((p for p in self.candidates(sample) if p.is_file()), None)

    def check(self, samples: Sequence[SampleId]) -> None:
        """MissingFileError for the first sample without a starting mesh (before any compute)."""
        for sample in samples:
            if self.path(sample) is None:
                raise MissingFileError(
                    f"{self.option} {self.folder}: sample {sample} has no starting mesh "
                    f"({' or '.join(p.name for p in self.candidates(sample))}); stage 2 trains on stage 1's "
                    "predictions: give stage-1 weights to compute them, or a folder holding them"
                )

    def load(self, sample: SampleId) -> np.ndarray:
        path = self.path(sample)
        if path is None:
            self.check([sample])
        try:
            mesh = np.loadtxt(path, dtype=np.float64, ndmin=2)
        except ValueError as exc:
            raise FileFormatError(f"sample {sample}: starting mesh {path} is not a table of numbers ({exc})") from None
        if mesh.shape != (self.vertices, 3) or not np.isfinite(mesh).all():
            raise FileFormatError(
                f"sample {sample}: starting mesh {path} holds {mesh.shape[0]}x{mesh.shape[1]} "
                f"values{'' if np.isfinite(mesh).all() else ' with NaN or infinity'}; expected "
                f"{self.vertices} finite vertices of 3 coordinates, stage 1's mesh of this template"
            )
        return mesh.astype(np.float32)


def compute_starts(
    weights: dict,
    template,
    list_file,
    images_root,
    folder,
    backend: str = "numpy",
    views: Sequence[int] = DEFAULT_VIEWS,
    view_quirk: bool = True,
    batch_size: int | None = None,
    progress: bool = True,
) -> dict:
    """Stage 1's mesh of every sample of ``list_file`` into ``folder/{id}_predict.xyz``, through the batch
    pipeline; samples whose file is there already are skipped. Returns the pipeline's run figures."""
    model = Stage1Model(weights, template, backend, view_quirk)
    return reconstruct_dataset(
        model, list_file, images_root, folder, batch_size=batch_size, progress=progress, views=views, formats=("xyz",)
    )
