"""The whole evaluation job, `xmesh eval`'s pipeline end to end: samples/s over a synthetic dataset
in the official layout (decoding, upload, network, metrics, CSV), beside the network-only benchmarks.

The dataset (64 procedural objects, ``xmesh.synthetic.write_dataset``) is written once by
``setup_cache``; NumPy evaluates its first 4 samples in batches of 1, CuPy all 64 in batches of 32.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from .common import benchmarking, require

SAMPLES = {"numpy": (4, 1), "cupy": (64, 32)}  # samples evaluated, batch size


class Pipeline:
    params = [["numpy", "cupy"]]
    param_names = ["backend"]
    timeout = 900
    number = 1
    repeat = 1

    def setup_cache(self):
        from xmesh.synthetic.dataset import write_dataset

        root = Path(tempfile.mkdtemp(prefix="xmesh-asv-pipeline-"))
        write_dataset(root, n_per_category=16, seed=0)
        return str(root)

    def setup(self, root, backend):
        require(backend)
        try:
            from xmesh.evaluate import evaluate_dataset
        except ImportError as exc:
            raise NotImplementedError(f"this xmesh has no batched evaluate_dataset ({exc})") from exc
        from xmesh.reconstruct import Reconstructor

        bm = benchmarking()
        self.root = Path(root)
        self.model = Reconstructor(bm.synthetic_weights(bm.WEIGHTS_SEED), backend=backend)
        self.count, self.batch = SAMPLES[backend]
        self.evaluate = evaluate_dataset
        self.out = Path(tempfile.mkdtemp(prefix="xmesh-asv-eval-"))
        self._run(self.out / "warmup", self.batch)  # compiles and allocates outside the figure

    def teardown(self, root, backend):
        if hasattr(self, "out"):  # setup ran (not skipped)
            shutil.rmtree(self.out, ignore_errors=True)

    def _run(self, out: Path, limit: int) -> dict:
        return self.evaluate(
            self.model,
            self.root / "test_list.txt",
            self.root,
            self.root / "gt",
            out,
            batch_size=self.batch,
            limit=limit,
            progress=False,
        )

    def track_eval_samples_per_s(self, root, backend):
        """samples/s of the whole evaluation (the run's wall time, its pools' start included)."""
        return self._run(self.out / "run", self.count)["run"]["samples_per_s"]

    track_eval_samples_per_s.unit = "samples/s"
