"""xmesh render MESH (--cameras F | --colmap DIR --images P P P | --poses JSON --images P P P) --out PNG"""

from __future__ import annotations

import sys

from .photo_options import add_photo_options, camera_source, photo_cameras


def add_parser(sub) -> None:
    p = sub.add_parser(
        "render",
        help="draw a mesh (and optional ground-truth points) from the cameras' directions into a PNG, framed to fit",
    )
    p.add_argument(
        "mesh",
        help="mesh file (.obj or .ply): in camera 0's frame as xmesh writes it from camera rows, "
        "or in the photos' world with --colmap/--poses",
    )
    p.add_argument("--cameras", default=None, help="cameras.txt or rendering_metadata.txt")
    p.add_argument(
        "--images",
        nargs=3,
        default=None,
        metavar="PHOTO",
        help="with --colmap/--poses: the three photos (names or paths) the mesh was reconstructed from",
    )
    add_photo_options(p)
    p.add_argument("--out", required=True, help="output PNG (the views side by side)")
    p.add_argument(
        "--points",
        default=None,
        help="ground-truth points to overlay (.xyz, .npy or a ground-truth .dat), in the mesh's frame",
    )
    p.add_argument("--size", type=int, default=224, help="pixels per view (default 224)")
    p.add_argument(
        "--camera-view",
        action="store_true",
        help="draw what the cameras themselves see (no framing, transparent background): "
        "the mesh over the input views, to check their alignment",
    )
    p.set_defaults(run=run, views=None)


MAX_SIZE = 4096


def run(args) -> int:
    from pathlib import Path

    from ..errors import FileFormatError, InputError
    from ..io.writable import check_writable_file
    from ..mesh import Mesh, read_mesh
    from ..pictures.views import render_mesh_file, render_mesh_picture
    from ..render.draw import load_points
    from .common import output_errors

    if not 1 <= args.size <= MAX_SIZE:
        raise InputError(f"--size {args.size}: expected a whole number of pixels per view from 1 to {MAX_SIZE}")
    if Path(args.out).suffix.lower() != ".png":
        raise InputError(f"--out {args.out}: expected a .png file name (the picture is written as PNG)")
    if Path(args.out).is_dir():
        raise InputError(f"--out {args.out}: is a folder; expected the path of a .png file to write")
    source = camera_source(args)
    check_writable_file(args.out)
    points = load_points(args.points) if args.points else None
    if source == "--cameras":
        if args.images is not None:
            raise InputError("--images names the photos of --colmap/--poses; --cameras rows need no photos")
        with output_errors(f"--out {args.out}: writing"):
            path = render_mesh_file(
                args.mesh, args.cameras, args.out, gt_points=points, size=args.size, camera_view=args.camera_view
            )
    else:  # the mesh (and points) in the photos' world, as xmesh reconstruct --colmap/--poses writes it
        mesh = read_mesh(args.mesh)
        if len(mesh.faces) == 0:
            raise FileFormatError(f"{args.mesh}: the mesh has no faces; nothing to render")
        cameras = photo_cameras(args, source)
        moved = Mesh(cameras.input_to_camera0(mesh.vertices), mesh.faces)
        points = None if points is None else cameras.input_to_camera0(points)
        with output_errors(f"--out {args.out}: writing"):
            path = render_mesh_picture(
                moved, cameras.rows, args.out, points, size=args.size, camera_view=args.camera_view
            )
    print(f"wrote {path}", file=sys.stderr)
    return 0
