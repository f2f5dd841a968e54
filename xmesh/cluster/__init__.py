"""Dataset evaluation and batch reconstruction on a Dask cluster (``--cluster``, or ``client=``).

Each worker builds its own model from a :class:`~xmesh.reconstruct.ModelSpec` (also importable
from here).

- :mod:`.connect`: the ``--cluster`` SPEC forms and the client that reaches them;
- :mod:`.worker`: the worker plugin that keeps one model per worker, and the shard task;
- :mod:`.driver`: :class:`~xmesh.cluster.driver.DaskExecutor`, the client's loop: shards out, rows in
  to the one writer of samples.csv.

Only :mod:`.worker` and :mod:`.driver` import Dask; the rest works without the extra installed.
"""

from ..reconstruct import ModelSpec
from .connect import open_client, parse_cluster_spec

__all__ = ["ModelSpec", "open_client", "parse_cluster_spec"]
