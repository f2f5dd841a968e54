"""Time per training step (loss, backward and Adam) of stage 2 on a batch; divide by ``batch`` for a sample.

The workload is ``xmesh.train.bench.StepWorkload`` (``scripts/train_bench.py`` times the same).
"""

from __future__ import annotations

from .common import BACKENDS, require

TRAIN_BATCH_SIZES = [1, 32]


class TrainStep:
    """One ``Trainer.step`` of stage 2 (the original's training takes batch 1)."""

    params = [BACKENDS, TRAIN_BATCH_SIZES]
    param_names = ["backend", "batch"]
    timeout = 600
    repeat = (1, 5, 20.0)
    warmup_time = 0.0
    processes = 1

    def setup(self, backend, batch):
        require(backend, batch)
        try:
            from xmesh.train.bench import StepWorkload
        except ImportError as exc:
            raise NotImplementedError(f"this xmesh has no training step ({exc})") from exc
        self.work = StepWorkload(2, backend, batch)
        self.work.step()  # the first step builds what later steps reuse

    def teardown(self, backend, batch):
        # asv sets up each repeat anew: a batch of 32's graph (about 70 GiB) goes before the next is made
        work = self.__dict__.pop("work", None)  # none where setup skipped the combination
        if work is not None:
            work.release()

    def time_stage2_step(self, backend, batch):
        self.work.step()
