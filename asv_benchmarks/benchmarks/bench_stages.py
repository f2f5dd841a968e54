"""Time per call of each stage (one batch of ``batch`` samples); GPU calls synchronise inside the timing.

Stage definitions: ``xmesh/benchmarking.py``. Divide by ``batch`` for the time per sample.
"""

from __future__ import annotations

from .common import Benchmark, benchmarking, require


class CNN(Benchmark):
    """The two CNN18 passes over the B*3 images."""

    def time_cnn_stage1(self, inputs, backend, batch):
        self.work.cnn_stage1()

    def time_cnn_stage2(self, inputs, backend, batch):
        self.work.cnn_stage2()


class GraphStage1(Benchmark):
    """Stage 1 (MVP2M) after the CNN: graph projections and the three graph blocks."""

    prepare = ("graph_block_1",)

    def time_graph_projection(self, inputs, backend, batch):
        self.work.graph_projection()

    def time_graph_block_1(self, inputs, backend, batch):
        self.work.graph_block_1()

    def time_graph_block_2(self, inputs, backend, batch):
        self.work.graph_block_2()

    def time_graph_block_3(self, inputs, backend, batch):
        self.work.graph_block_3()


class DeformationReasoning(Benchmark):
    """Stage 2 (MeshNet) after the CNN: local projections and the two deformation reasoning blocks."""

    prepare = ("drb_1", "local_projection")

    def time_local_projection(self, inputs, backend, batch):
        self.work.local_projection()

    def time_drb_1(self, inputs, backend, batch):
        self.work.drb_1()

    def time_drb_2(self, inputs, backend, batch):
        self.work.drb_2()


class Stages(Benchmark):
    """Whole stages, and the whole reconstruction from host inputs to the host mesh."""

    prepare = ("stage1", "stage2")

    def time_stage1(self, inputs, backend, batch):
        self.work.stage1()

    def time_stage2(self, inputs, backend, batch):
        self.work.stage2()

    def time_total(self, inputs, backend, batch):
        """On CuPy: replays of the captured CUDA Graph (asv's warm-up calls capture it)."""
        self.work.total()

    def time_total_eager(self, inputs, backend, batch):
        """The same call with CUDA Graphs off: every kernel launched from Python."""
        self.work.total_eager()


class Speed16(Benchmark):
    """The whole reconstruction in the 16-bit speed modes (CuPy on a GPU with 16-bit tensor cores) at
    batch 64, where they are used: ``xmesh bench --precision fp16 --batch-sizes 64 --stages total``."""

    params = [["fp16", "bf16"], [64]]
    param_names = ["precision", "batch"]
    prepare = ("stage1", "stage2")

    def setup(self, inputs, precision, batch):
        from xmesh.errors import BackendUnavailableError

        require("cupy", batch)
        bm = benchmarking()
        try:  # bf16 needs a Hopper GPU
            self.work = bm.Workload(
                "cupy",
                batch,
                weights=inputs["weights"],
                template=inputs["template"],
                images=inputs["images"],
                cameras=inputs["cameras"],
                precision=precision,
            )
        except BackendUnavailableError as exc:
            raise NotImplementedError(str(exc)) from exc
        self.work.prepare(*self.prepare)

    def time_total(self, inputs, precision, batch):
        """Replays of the captured CUDA Graph (asv's warm-up calls capture it)."""
        self.work.total()


class Memory(Benchmark):
    """Host peak memory (RSS, setup included) of one reconstruction."""

    def peakmem_reconstruction(self, inputs, backend, batch):
        self.work.total()


class GpuMemory(Benchmark):
    """CuPy's memory pool after one reconstruction (GPU backends only: skipped in setup otherwise)."""

    def setup(self, inputs, backend, batch):
        if backend != "cupy":
            raise NotImplementedError("device memory is tracked for cupy only")
        super().setup(inputs, backend, batch)
        self.work.total()

    def track_gpu_memory(self, inputs, backend, batch):
        return self.work.gpu_pool_bytes()

    track_gpu_memory.unit = "bytes"


__all__ = ["CNN", "GraphStage1", "DeformationReasoning", "Stages", "Speed16", "Memory", "GpuMemory"]
