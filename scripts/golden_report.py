"""Print the figures behind tests/test_golden.py: every stage against the original TF outputs.

    python scripts/golden_report.py            # NumPy backend
    XMESH_TEST_BACKEND=cupy XMESH_SHARED=... python3 scripts/golden_report.py

Uses the test module's own fixtures, so the numbers are exactly what the tests check.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_golden as T  # noqa: E402
from conftest import SHARED  # noqa: E402

golden = dict(np.load(SHARED / "golden" / "demo_seed1.npz"))
inputs = T.inputs.__wrapped__(SHARED / "demo")
run = T.run.__wrapped__(SHARED / "golden", inputs)
print(f"backend: {T.BACKEND}")
for i, key in enumerate(["stage1_feat56", "stage1_feat28", "stage1_feat14", "stage1_feat7"]):
    print(f"{key:22s} relative error {T.relative(run[1].stage1_maps[i], golden[key]):.2e}")
for i, key in enumerate(["stage2_feat224_view0", "stage2_feat112", "stage2_feat56"]):
    ours = run[1].stage2_maps[i]
    print(f"{key:22s} relative error {T.relative(ours[0] if key.endswith('view0') else ours, golden[key]):.2e}")


def blocks_line(label, blocks):
    for i in range(3):
        err = np.abs(blocks[i][0] - golden[f"stage1_block{i + 1}"]).max(axis=1)
        print(
            f"{label} block {i + 1}: {np.mean(err <= T.BLOCK_ATOL):7.2%} of vertices within {T.BLOCK_ATOL}, "
            f"max {err.max():.2e}"
        )


blocks_line("stage 1 as computed      ", run[1].stage1_blocks)
choice, blocks, count, extra = T.stage1_with_resolved_edges.__wrapped__(SHARED / "golden", golden, inputs, run)
print(
    f"edge samples: {count}, the original's noise put {int(choice.sum())} at the cell edge and "
    f"{count - int(choice.sum())} below it"
)
print(f"near-edge samples of the later projections searched: {extra}")
blocks_line("stage 1, edges recovered ", blocks)
stage2 = T.stage2_from_golden.__wrapped__(golden, inputs, run)
for b in (1, 2):
    previous = golden["stage1_block3"] if b == 1 else golden["stage2_block1"]
    ours_previous = golden["stage1_block3"] if b == 1 else stage2[0][0]
    ours, ref = stage2[b - 1][0] - ours_previous, golden[f"stage2_block{b}"] - previous
    err = np.linalg.norm(ours - ref, axis=1)
    keep = np.argsort(err)[: int(np.ceil(len(err) * (1 - T.OUTLIER_FRACTION)))]
    print(
        f"stage 2 block {b} from the original's input: displacement relative error {T.relative(ours, ref):.2e} (all), "
        f"{T.relative(ours[keep], ref[keep]):.2e} (best {1 - T.OUTLIER_FRACTION:.1%}); "
        f"{np.mean(err == 0):.1%} of vertices bit-identical, {(err > 1e-6).sum()} off by more than 1e-6"
    )
