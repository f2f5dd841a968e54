"""What a dataset run does, as one frozen value that an executor and a cluster's workers share."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..dataset import DEFAULT_VIEWS
from .loading import default_workers

GPU_BATCH = 64  # the default batch size on the GPU: within 5% of the best samples/s on an H100
MESH_FORMATS = ("xyz", "obj")


@dataclass(frozen=True)
class RunSettings:
    """``batch_size``; ``loaders`` and ``writers``: decoding and mesh-writing processes (None: each
    cluster worker chooses from its own cores); ``views``: the renderings used as the 3 inputs;
    ``with_gt``: score against ground truth (evaluation) or not (list reconstruction);
    ``metric_backend``; ``mesh_dir``: where meshes go (None: not written), in ``formats``;
    ``ground_root``: the ground truth whose ``{id}_ground.xyz`` goes beside them (None: none). The
    precision is the model's (:class:`xmesh.reconstruct.ModelSpec`), not the run's."""

    batch_size: int
    loaders: int | None
    writers: int | None
    views: tuple = DEFAULT_VIEWS
    with_gt: bool = True
    metric_backend: str = "auto"
    mesh_dir: str | None = None
    formats: tuple = MESH_FORMATS
    ground_root: str | None = None

    def __post_init__(self) -> None:  # lists given for views or formats: kept as tuples, so settings compare
        object.__setattr__(self, "views", tuple(int(v) for v in self.views))
        object.__setattr__(self, "formats", tuple(self.formats))

    @classmethod
    def choose(
        cls, gpu: bool, batch_size: int | None = None, workers: int | None = None, save_meshes: bool = False, **rest
    ) -> RunSettings:
        """Given values, else the GPU's or the CPU's defaults (:func:`xmesh.pipeline.loading.default_workers`).
        ``workers`` given sets the loaders and, with meshes, as many writers. ``rest``: the other fields."""
        loaders, writers = default_workers(gpu, save_meshes)
        if workers is not None:
            loaders, writers = int(workers), (max(1, int(workers)) if save_meshes else 0)
        return cls(int(batch_size) if batch_size is not None else (GPU_BATCH if gpu else 1), loaders, writers, **rest)

    def chosen_by_workers(self) -> RunSettings:
        """The same run with each cluster worker choosing its loader and writer processes."""
        return replace(self, loaders=None, writers=None)

    def batches(self, items: list) -> list[list]:
        """``items`` cut into batches of ``batch_size``."""
        return [items[i : i + self.batch_size] for i in range(0, len(items), self.batch_size)]

    def as_summary(self) -> dict:
        """The batch size and process counts as a run's summary reports them."""
        return {"batch_size": self.batch_size, "workers": self.loaders, "writers": self.writers}
