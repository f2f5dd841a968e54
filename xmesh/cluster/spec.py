"""How to build a model, as a small picklable value a cluster worker can act on.

A :class:`ModelSpec` travels to every worker once (inside a worker plugin) and each worker builds
its own :class:`~xmesh.reconstruct.Reconstructor` from it. Weights and template given as paths are
made absolute, since a worker's working folder may differ from the client's (the files must be
readable from the workers: a shared file system on a cluster).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..commands.common import SYNTHETIC_PREFIX, resolve_weights


def _absolute(value: Any) -> Any:
    """Paths -> absolute text paths ('synthetic:N' and arrays as they are); lists element-wise."""
    if isinstance(value, (list, tuple)):
        return [_absolute(v) for v in value]
    if isinstance(value, os.PathLike) or (isinstance(value, str) and not value.startswith(SYNTHETIC_PREFIX)):
        return os.path.abspath(os.fspath(value))
    return value


@dataclass(frozen=True)
class ModelSpec:
    """The arguments of :class:`~xmesh.reconstruct.Reconstructor`: ``weights`` (a path, a list of
    paths, a dict of arrays, or ``"synthetic:SEED"`` for the synthetic test recipe), ``template``
    (None for the built-in ellipsoid, a path, or a Template), ``backend`` ("numpy" or "cupy"),
    ``precision``, ``view_quirk`` and ``graphs``."""

    weights: Any
    template: Any = None
    backend: str = "numpy"
    precision: str = "fp32"
    view_quirk: bool = True
    graphs: bool = True

    @classmethod
    def of(cls, weights, template=None, backend: str = "numpy", precision: str = "fp32", view_quirk: bool = True,
           graphs: bool = True) -> "ModelSpec":
        """A spec with its paths made absolute; ``weights`` as one-element lists are unwrapped."""
        if isinstance(weights, (list, tuple)) and len(weights) == 1:
            weights = weights[0]
        return cls(_absolute(weights), _absolute(template), str(backend), str(precision), bool(view_quirk),
                   bool(graphs))

    @property
    def gpu(self) -> bool:
        return self.backend == "cupy"

    def build(self):
        """The Reconstructor this spec describes."""
        from ..reconstruct import Reconstructor

        weights = self.weights
        if isinstance(weights, str) and weights.startswith(SYNTHETIC_PREFIX):
            weights = resolve_weights([weights])
        return Reconstructor(weights, template=self.template, backend=self.backend, precision=self.precision,
                             view_quirk=self.view_quirk, graphs=self.graphs)
