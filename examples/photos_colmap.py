"""Reconstruct from a (synthetic) hand-held capture through COLMAP's text model, as with your own photos.

    python examples/photos_colmap.py                 # writes xmesh-photos/, its mesh.obj and mesh.png
    python examples/photos_colmap.py --keep DIR --backend cupy

``xmesh.synthetic.capture.write_capture`` stands in for the phone and COLMAP: 24 photos (640x480, a
little roll and aim error) of a procedural car, their masks, and the sparse model in a z-up world of
other units. The reconstruction runs with the synthetic weights (random, NOT the trained ones) unless
--weights is given, so the mesh shows the pipeline working, not reconstruction quality. The same
from the shell: ``xmesh reconstruct P1 P2 P3 --colmap DIR/sparse/0 --masks M1 M2 M3 --weights ...``, then
``xmesh render mesh.obj --colmap DIR/sparse/0 --images P1 P2 P3 --masks M1 M2 M3 --out mesh.png`` draws
the mesh (in COLMAP's world) from the three photos' network cameras.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from xmesh.cli import main as xmesh_main
from xmesh.synthetic.capture import write_capture

CHOSEN = (0, 8, 16)   # three photos 120 degrees apart


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", default="xmesh-photos", help="folder for the capture and the mesh")
    parser.add_argument("--weights", nargs="+", default=["synthetic:1"])
    parser.add_argument("--backend", default="numpy", choices=("numpy", "cupy"))
    args = parser.parse_args()
    folder = Path(args.keep)
    capture = write_capture(folder)
    photos = [str(capture["photos"][i]) for i in CHOSEN]
    cameras = ["--colmap", str(capture["sparse"]), "--masks", *(str(capture["masks"][i]) for i in CHOSEN)]
    reconstruct = ["reconstruct", *photos, *cameras, "--weights", *args.weights, "--backend", args.backend,
                   "--out", str(folder / "mesh.obj")]
    render = ["render", str(folder / "mesh.obj"), "--images", *photos, *cameras, "--out", str(folder / "mesh.png")]
    for argv in (reconstruct, render):
        print("xmesh " + " ".join(argv))
        status = xmesh_main(argv)
        if status:
            return status
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
