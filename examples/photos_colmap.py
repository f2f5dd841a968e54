"""Reconstruct from a (synthetic) hand-held capture through COLMAP's text model, as with your own photos.

    python examples/photos_colmap.py                 # writes xmesh-photos/, its mesh.obj and mesh.png
    python examples/photos_colmap.py --keep DIR --backend cupy --weights official

``xmesh.synthetic.capture.write_capture`` stands in for the phone and COLMAP: 24 photos (640x480, a
little roll and aim error) of a procedural car, their masks, and the sparse model in a z-up world of
other units. Without --weights the reconstruction runs with the demo's synthetic weights (seed 1 of
the test recipe's small-move variant: random, NOT the trained ones), which deform the template by
the images rather than collapse it, and the picture's caption says so: the mesh shows the pipeline
working, not reconstruction quality. ``mesh.obj`` is in COLMAP's world; ``mesh.png`` shows the three
photos as the network sees them (resampled through its cameras, on white) beside the coarse and
refined meshes, as ``xmesh demo`` draws them. The same from the shell:
``xmesh reconstruct P1 P2 P3 --colmap DIR/sparse/0 --masks M1 M2 M3 --weights official --out mesh.obj``,
then ``xmesh render mesh.obj --colmap DIR/sparse/0 --images P1 P2 P3 --masks M1 M2 M3 --out mesh.png``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import xmesh
from xmesh.errors import XmeshError
from xmesh.io.weight_sources import resolve_weights
from xmesh.io.weights import synthetic_weights
from xmesh.pictures.demo import weights_caption, write_demo_picture
from xmesh.synthetic.capture import write_capture

CHOSEN = (0, 8, 16)  # three photos 120 degrees apart
RECIPE = "the test recipe's small-move variant"  # the demo's synthetic weights


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", default="xmesh-photos", help="folder for the capture and the mesh")
    parser.add_argument(
        "--weights",
        nargs="+",
        default=None,
        help="'official', an .npz or both checkpoint prefixes (default: the demo's synthetic weights)",
    )
    parser.add_argument("--backend", default="numpy", choices=("numpy", "cupy"))
    args = parser.parse_args()
    folder = Path(args.keep)
    capture = write_capture(folder)
    photos = [str(capture["photos"][i]) for i in CHOSEN]
    masks = [str(capture["masks"][i]) for i in CHOSEN]
    cams = xmesh.cameras.from_colmap(capture["sparse"], [Path(p).name for p in photos], masks=masks)
    print(cams.describe())
    weights = resolve_weights(args.weights) if args.weights else synthetic_weights(1, small_moves=True)
    model = xmesh.Reconstructor(weights, backend=args.backend)
    inputs = cams.prepare_images(photos)  # (3, 224, 224, 3) BGR in [0, 1], the network's views
    start = time.perf_counter()
    mesh = model(inputs, cams.rows)  # in camera 0's frame, as the network gives it
    elapsed = time.perf_counter() - start
    path = cams.place(mesh).to_obj(folder / "mesh.obj")  # in COLMAP's world
    seen = [np.round(255 * view[..., ::-1]).astype(np.uint8) for view in inputs]  # RGB pictures of the inputs
    picture = write_demo_picture(
        folder / "mesh.png",
        seen,
        cams.rows,
        mesh,
        weights_caption(args.weights, 1, RECIPE),
        f"from photos {', '.join(Path(p).name for p in photos)} through COLMAP; "
        f"reconstructed in {elapsed:.2f} s on {args.backend}",
    )
    print(f"wrote {path} ({len(mesh.vertices)} vertices) and {picture}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except XmeshError as exc:  # bad input, or a backend this machine lacks: one line, as the xmesh command says it
        print(f"{Path(__file__).name}: error: {exc}", file=sys.stderr)
        sys.exit(2)
