"""Reconstruct a mesh from Python: renders a procedural object, reconstructs it, writes OBJ + PNG.

    python examples/reconstruct_from_python.py [OUT_DIR] [--backend cupy]

Uses synthetic weights (seed 1 of the test recipe's small-move variant, as ``xmesh demo``) unless
XMESH_WEIGHTS names real ones (an .npz, or the two official checkpoint prefixes separated by a comma).
The picture shows the inputs beside the coarse and refined meshes, with a caption naming the weights.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import xmesh
from xmesh.errors import XmeshError
from xmesh.io.cameras import load_cameras
from xmesh.io.weights import synthetic_weights
from xmesh.pictures.demo import weights_caption, write_demo_picture
from xmesh.synthetic.dataset import demo_inputs

RECIPE = "the test recipe's small-move variant"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="?", default="example-out")
    parser.add_argument("--backend", default="numpy", choices=("numpy", "cupy"))
    args = parser.parse_args()
    out = Path(args.out)
    images, cameras = demo_inputs(out / "inputs")
    named = os.environ.get("XMESH_WEIGHTS")
    named = named.split(",") if named else None
    weights = named or synthetic_weights(1, small_moves=True)
    model = xmesh.Reconstructor(weights, backend=args.backend)  # weights + template stay loaded
    start = time.perf_counter()
    mesh = model(images, cameras)
    elapsed = time.perf_counter() - start
    print(f"reconstructed {len(mesh.vertices)} vertices in {elapsed:.2f} s on {args.backend}")
    path = mesh.to_obj(out / "mesh.obj")
    picture = write_demo_picture(
        out / "mesh.png",
        images,
        load_cameras(cameras),
        mesh,
        weights_caption(named, 1, RECIPE),
        f"reconstructed in {elapsed:.2f} s on {args.backend}",
    )
    print("wrote", path, picture)


if __name__ == "__main__":
    try:
        main()
    except XmeshError as exc:  # bad input, or a backend this machine lacks: one line, as the xmesh command says it
        print(f"{Path(__file__).name}: error: {exc}", file=sys.stderr)
        sys.exit(2)
