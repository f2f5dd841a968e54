"""xmesh render MESH --cameras F --out PNG"""
from __future__ import annotations

import sys


def add_parser(sub) -> None:
    p = sub.add_parser("render", help="draw a mesh (and optional ground-truth points) from the cameras' directions into a PNG, framed to fit")
    p.add_argument("mesh", help="mesh file (.obj or .ply), in camera 0's frame as xmesh writes it")
    p.add_argument("--cameras", required=True, help="cameras.txt or rendering_metadata.txt")
    p.add_argument("--out", required=True, help="output PNG (the views side by side)")
    p.add_argument("--points", default=None, help="ground-truth points to overlay (.xyz, .npy or a ground-truth .dat)")
    p.add_argument("--size", type=int, default=224, help="pixels per view (default 224)")
    p.add_argument("--camera-view", action="store_true",
                   help="draw what the cameras themselves see (no framing, transparent background): "
                        "the mesh over the input views, to check their alignment")
    p.set_defaults(run=run)


MAX_SIZE = 4096


def run(args) -> int:
    from pathlib import Path

    from ..errors import InputError
    from ..io.writable import check_writable_file
    from .common import output_errors
    from ..synthetic.render import load_points, render_mesh_file

    if not 1 <= args.size <= MAX_SIZE:
        raise InputError(f"--size {args.size}: expected a whole number of pixels per view from 1 to {MAX_SIZE}")
    if Path(args.out).suffix.lower() != ".png":
        raise InputError(f"--out {args.out}: expected a .png file name (the picture is written as PNG)")
    if Path(args.out).is_dir():
        raise InputError(f"--out {args.out}: is a folder; expected the path of a .png file to write")
    check_writable_file(args.out)
    points = load_points(args.points) if args.points else None
    with output_errors(f"--out {args.out}: writing"):
        path = render_mesh_file(args.mesh, args.cameras, args.out, gt_points=points, size=args.size,
                                camera_view=args.camera_view)
    print(f"wrote {path}", file=sys.stderr)
    return 0
