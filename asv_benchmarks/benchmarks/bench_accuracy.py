"""Agreement with the original TensorFlow outputs (../shared/golden/demo_seed1.npz), per backend.

Skipped where ../shared (or $XMESH_SHARED) is missing. Definitions: ``xmesh.benchmarking.golden_errors``.
"""

from __future__ import annotations

from .common import benchmarking, require


class GoldenError:
    params = [["numpy", "cupy"]]
    param_names = ["backend"]
    timeout = 600

    def setup(self, backend):
        require(backend)
        bm = benchmarking()
        try:
            self.errors = bm.golden_errors(backend)
        except FileNotFoundError as exc:
            raise NotImplementedError(str(exc)) from exc

    def track_golden_error_stage1_block3(self, backend):
        """max |coarse mesh - original's| (coordinate units)."""
        return self.errors["stage1_block3_max_abs"]

    track_golden_error_stage1_block3.unit = "absolute"

    def track_golden_error_stage2_displacement(self, backend):
        """|stage-2 move - original's| / |original's move|."""
        return self.errors["stage2_displacement_rel"]

    track_golden_error_stage2_displacement.unit = "relative"
