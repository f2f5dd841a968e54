"""xmesh reconstruct IMG IMG IMG --cameras F --weights W --out mesh.obj"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from ..errors import InputError
from .common import add_model_options, describe_weights, reconstructor_from_args

WRITERS = {".obj": "to_obj", ".ply": "to_ply", ".xyz": "to_xyz"}


def add_parser(sub) -> None:
    p = sub.add_parser("reconstruct", help="reconstruct a mesh from 3 images and their cameras")
    p.add_argument("images", nargs="+", metavar="IMG", help="three images (PNG/JPEG), in the order of the camera rows")
    p.add_argument("--cameras", required=True, help="cameras.txt (3 rows) or a ShapeNet rendering_metadata.txt")
    p.add_argument("--views", type=int, nargs=3, default=None, metavar="I", help="rows of the camera file to use")
    p.add_argument("--out", required=True, help="output mesh: .obj, .ply or .xyz")
    p.add_argument("--coarse-out", default=None, help="also write the stage-1 coarse mesh here")
    add_model_options(p)
    p.set_defaults(run=run)


def writer(path: str):
    suffix = Path(path).suffix.lower()
    if suffix not in WRITERS:
        raise InputError(f"--out {path}: unknown mesh format {suffix!r}; use one of {', '.join(WRITERS)}")
    return WRITERS[suffix]


def run(args) -> int:
    if len(args.images) != 3:
        raise InputError(f"got {len(args.images)} images: Pixel2Mesh++ needs exactly 3 views")
    out_writer = writer(args.out)
    coarse_writer = writer(args.coarse_out) if args.coarse_out else None
    start = time.perf_counter()
    model = reconstructor_from_args(args)
    mesh = model(args.images, args.cameras, views=args.views)
    getattr(mesh, out_writer)(args.out)
    if coarse_writer:
        getattr(mesh.coarse(), coarse_writer)(args.coarse_out)
    print(f"wrote {args.out} ({len(mesh.vertices)} vertices, {len(mesh.faces)} faces) in "
          f"{time.perf_counter() - start:.2f} s with {describe_weights(args.weights)} on {args.backend}", file=sys.stderr)
    return 0
