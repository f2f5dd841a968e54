"""Chamfer distance between a predicted mesh (2466 vertices) and ground truth (10000 points), per backend.

The three nearest-neighbour backends of ``xmesh.metrics`` in one run: SciPy's cKDTree and FAISS on
the CPU, xmesh's own CUDA kernel on CuPy arrays (GPU work synchronised inside the timed call).
"""

from __future__ import annotations

import numpy as np


class Chamfer:
    params = [["scipy", "faiss", "cupy"]]
    param_names = ["backend"]
    timeout = 300

    def setup(self, backend):
        from xmesh import metrics

        rng = np.random.default_rng(0)
        pred = rng.normal(size=(2466, 3)).astype(np.float32) * 0.2
        gt = rng.normal(size=(10000, 3)).astype(np.float32) * 0.2
        self.sync = lambda: None
        if backend == "faiss":
            from xmesh.metrics import nn_faiss

            if not nn_faiss.available():
                raise NotImplementedError("faiss is not installed")
        if backend == "cupy":
            from xmesh.backends import available_backends

            if "cupy" not in available_backends():
                raise NotImplementedError("no CUDA device / CuPy here")
            import cupy

            pred, gt = cupy.asarray(pred), cupy.asarray(gt)
            self.sync = cupy.cuda.Device().synchronize
        self.metrics, self.pred, self.gt, self.backend = metrics, pred, gt, backend
        self._chamfer()  # warm: kernel compile, FAISS code paths

    def _chamfer(self):
        self.metrics.chamfer(self.pred, self.gt, backend=self.backend)
        self.sync()

    def time_chamfer_2466x10000(self, backend):
        self._chamfer()
