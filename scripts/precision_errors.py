"""Error of each precision mode against the golden TF outputs (run on a GPU machine).

    XMESH_SHARED=path/to/shared python3 scripts/precision_errors.py [fp32 tf32 fp16 bf16]

Prints, per mode: CNN map relative errors (worst of the 7 golden maps), the coarse mesh's max
deviation from the fp32 run, and the stage-2 displacement relative errors computed from the
original's own coarse mesh (all vertices, and the best 99.5% as in tests/test_golden.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from xmesh import Reconstructor
from xmesh.io.cameras import load_cameras
from xmesh.io.images import load_images
from xmesh.io.template import load_template
from xmesh.io.weights import synthetic_weights
from xmesh.model import network, projection

shared = Path(os.environ.get("XMESH_SHARED", Path(__file__).resolve().parents[1] / ".." / "shared"))
g = dict(np.load(shared / "golden" / "demo_seed1.npz"))
images = load_images([shared / "demo" / f"plane{i}.png" for i in (1, 2, 3)])
cameras = load_cameras(shared / "demo" / "cameras.txt")
template = load_template(shared / "golden" / "template.dat")
weights = synthetic_weights(1)


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


reference_coarse = None
print(
    f"{'mode':6s} {'worst CNN map':>14s} {'coarse vs fp32':>15s} "
    f"{'DRB1 all':>9s} {'DRB1 99.5%':>11s} {'DRB2 all':>9s} {'DRB2 99.5%':>11s}"
)
for mode in sys.argv[1:] or ["fp32", "tf32", "fp16", "bf16"]:
    model = Reconstructor(weights, template=template, backend="cupy", precision=mode)
    host = model.backend.to_numpy
    trace = network.Trace()
    coarse, _ = model.run(images[None], cameras[None], trace=trace)
    maps = [host(m) for m in trace.stage1_maps] + [host(m) for m in trace.stage2_maps]
    keys = [
        "stage1_feat56",
        "stage1_feat28",
        "stage1_feat14",
        "stage1_feat7",
        "stage2_feat224_view0",
        "stage2_feat112",
        "stage2_feat56",
    ]
    worst = max(rel(m[0] if k.endswith("view0") else m, g[k]) for m, k in zip(maps, keys))
    coarse = host(coarse)[0]
    if reference_coarse is None:
        reference_coarse = coarse
    tf = projection.DeviceTransforms.from_cameras(model.backend, cameras[None])
    t2 = network.Trace()
    network.run_stage2(
        model.backend,
        model.stage2,
        model.backend.asarray(images),
        model.backend.asarray(g["stage1_block3"][None]),
        tf,
        t2,
    )
    blocks = [host(b)[0] for b in t2.stage2_blocks]
    out = []
    for b in (1, 2):
        prev = g["stage1_block3"] if b == 1 else g["stage2_block1"]
        ours_prev = g["stage1_block3"] if b == 1 else blocks[0]
        ours, ref = blocks[b - 1] - ours_prev, g[f"stage2_block{b}"] - prev
        err = np.linalg.norm(ours - ref, axis=1)
        keep = np.argsort(err)[: int(np.ceil(len(err) * 0.995))]
        out += [rel(ours, ref), rel(ours[keep], ref[keep])]
    print(
        f"{mode:6s} {worst:14.2e} {np.abs(coarse - reference_coarse).max():15.2e} "
        + " ".join(f"{v:10.2e}" for v in out)
    )
