"""xmesh reconstruct IMG IMG IMG --cameras F --weights W --out mesh.obj"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from ..errors import InputError
from .common import add_model_options, describe_weights, output_errors, resolve_weights

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


def writer(path: str, option: str = "--out"):
    suffix = Path(path).suffix.lower()
    if suffix not in WRITERS:
        raise InputError(f"{option} {path}: unknown mesh format {suffix!r}; use one of {', '.join(WRITERS)}")
    return WRITERS[suffix]


def _check_output(option: str, path: str | None) -> None:
    if path and Path(path).is_dir():
        raise InputError(f"{option} {path}: is a folder; expected the path of a mesh file to write (.obj, .ply or .xyz)")


def _write(mesh, method: str, option: str, path: str) -> None:
    with output_errors(f"{option} {path}: writing"):
        getattr(mesh, method)(path)


def run(args) -> int:
    from ..io.cameras import load_cameras
    from ..io.images import load_images
    from ..io.template import load_template
    from ..reconstruct import Reconstructor

    if len(args.images) != 3:
        raise InputError(f"got {len(args.images)} images: Pixel2Mesh++ needs exactly 3 views")
    out_writer = writer(args.out)
    coarse_writer = writer(args.coarse_out, "--coarse-out") if args.coarse_out else None
    _check_output("--out", args.out)
    _check_output("--coarse-out", args.coarse_out)
    start = time.perf_counter()
    # validate every input before the (costly) model is built: images, cameras, template, then weights
    images = load_images(args.images)
    cameras = load_cameras(args.cameras, views=args.views)
    template = load_template(args.template) if args.template else None
    model = Reconstructor(resolve_weights(args.weights), template=template, backend=args.backend,
                          precision=args.precision, view_quirk=not args.no_view_quirk)
    mesh = model(images, cameras)
    _write(mesh, out_writer, "--out", args.out)
    if coarse_writer:
        _write(mesh.coarse(), coarse_writer, "--coarse-out", args.coarse_out)
    print(f"wrote {args.out} ({len(mesh.vertices)} vertices, {len(mesh.faces)} faces) in "
          f"{time.perf_counter() - start:.2f} s with {describe_weights(args.weights)} on {args.backend}", file=sys.stderr)
    return 0
