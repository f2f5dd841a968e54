"""The samples a training run reads: the official layout, as the original's training loader reads it.

A list file names ``{synset}_{item}_{view}.dat`` entries; each sample is the renderings ``rendering/00.png``,
``06.png`` and ``07.png`` of ``{images}/{synset}/{item}/`` with their camera rows, loaded as the test loader
loads them (:mod:`xmesh.pipeline.loading`: alpha 0 to white, 224x224, /255, BGR), and the ground truth
``{gt}/{id}``: the original's training ``.dat`` (a bare (N, 6) array of points and unit normals) or the
evaluation form ``(image, points)`` that ``xmesh ground-truth`` and :mod:`xmesh.synthetic` write, so a
user's own objects train from their renderings plus ``xmesh ground-truth``. Stage 2 also reads each
sample's starting mesh (:mod:`xmesh.train.starts`).

Every file of every listed sample is looked for before any compute (:meth:`TrainingSet.check`); a
ground truth that is there but unreadable, or without normals, is named with its sample when loaded.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..dataset import DEFAULT_VIEWS, SampleId, SamplePaths, list_samples, load_ground_truth_array
from ..errors import FileFormatError
from ..io.images import UINT8_TO_UNIT
from ..pipeline.loading import load_sample


@dataclass
class Sample:
    """One loaded training sample: images (3,224,224,3) float32 BGR in [0,1], cameras (3,5) float32,
    labels (N,6) float32 (points, unit normals) and, for stage 2, the starting mesh (2466,3) float32."""

    id: SampleId
    images: np.ndarray
    cameras: np.ndarray
    labels: np.ndarray
    start: np.ndarray | None = None


def load_labels(sample: SampleId, path: str) -> np.ndarray:
    """The (N, 6) float32 points and normals of a ground-truth ``.dat``; errors name the sample and file."""
    points = load_ground_truth_array(path)
    if points.shape[1] < 6:
        raise FileFormatError(
            f"sample {sample}: ground truth {path} holds {points.shape[1]} columns; training "
            "needs 6 (xyz and the unit normal), as the original's .dat and xmesh ground-truth write"
        )
    labels = np.ascontiguousarray(points[:, :6], dtype=np.float32)
    bad = np.flatnonzero(~np.isfinite(labels).all(axis=1))
    if bad.size:
        raise FileFormatError(
            f"sample {sample}: ground truth {path} has {bad.size} row(s) with NaN or infinite "
            f"values (first at row {bad[0]}); expected finite points and normals"
        )
    return labels


class TrainingSet:
    """The samples of ``list_file`` in the official layout (``images_root``: the ShapeNetRendering folder or
    one holding it; ``gt_root``: the ``.dat`` files). ``option`` names the list in messages."""

    def __init__(
        self,
        list_file: str | os.PathLike,
        images_root: str | os.PathLike,
        gt_root: str | os.PathLike,
        views: Sequence[int] = DEFAULT_VIEWS,
        option: str = "--list",
    ):
        self.list_file = os.fspath(list_file)
        self.option = option
        self.views = tuple(views)
        listed = list_samples(list_file, images_root, gt_root, self.views)
        self.ids: list[SampleId] = [s for s, _, _ in listed]
        self.paths: list[SamplePaths] = [p for _, p, _ in listed]
        self.problems = [problem for _, _, problem in listed]

    def __len__(self) -> int:
        return len(self.ids)

    def check(self) -> None:
        """Raise the first listed sample's missing rendering, camera file or ground truth, naming the list."""
        for problem in self.problems:
            if problem is not None:
                raise type(problem)(
                    f"{self.option} {self.list_file}: {problem}; every listed sample needs its "
                    "renderings, rendering_metadata.txt and ground-truth .dat"
                )

    def load(self, index: int) -> Sample:
        sample, paths = self.ids[index], self.paths[index]
        images, cameras, _, _, _ = load_sample(sample, paths, self.views, with_gt=False)
        if images.dtype == np.uint8:
            images = UINT8_TO_UNIT[images]
        return Sample(
            sample,
            np.ascontiguousarray(images, dtype=np.float32),
            np.asarray(cameras, np.float32),
            load_labels(sample, paths.gt),
        )
