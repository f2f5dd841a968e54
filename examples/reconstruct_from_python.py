"""Reconstruct a mesh from Python: renders a procedural object, reconstructs it, writes OBJ + PNG.

    python examples/reconstruct_from_python.py [OUT_DIR] [--backend cupy]

Uses the synthetic test weights (seed 1) unless XMESH_WEIGHTS names real ones (an .npz, or the
two official checkpoint prefixes separated by a comma).
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import xmesh
from xmesh.io.weights import synthetic_weights
from xmesh.synthetic.dataset import demo_inputs
from xmesh.pictures.views import render_mesh_file


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="?", default="example-out")
    parser.add_argument("--backend", default="numpy", choices=("numpy", "cupy"))
    args = parser.parse_args()
    out = Path(args.out)
    images, cameras = demo_inputs(out / "inputs")
    weights = os.environ.get("XMESH_WEIGHTS")
    weights = weights.split(",") if weights else synthetic_weights(1)
    model = xmesh.Reconstructor(weights, backend=args.backend)   # weights + template stay loaded
    start = time.perf_counter()
    mesh = model(images, cameras)
    print(f"reconstructed {len(mesh.vertices)} vertices in {time.perf_counter() - start:.2f} s on {args.backend}")
    path = mesh.to_obj(out / "mesh.obj")
    print("wrote", path, render_mesh_file(path, cameras, out / "mesh.png", size=224))


if __name__ == "__main__":
    main()
