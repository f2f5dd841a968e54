"""The camera sources of ``xmesh reconstruct`` and ``xmesh render``: camera rows (--cameras), or posed
photos (--colmap, --poses) with optional masks, converted by :mod:`xmesh.photo`; meshes then live in
the photos' world."""

from __future__ import annotations

import sys

from ..errors import InputError

SOURCES = ("--cameras", "--colmap", "--poses")
PHOTO_ONLY = ("--masks", "--center", "--radius", "--up", "--first-azimuth")


def add_photo_options(p) -> None:
    p.add_argument(
        "--colmap",
        default=None,
        metavar="SPARSE_DIR",
        help="COLMAP sparse model in text form (cameras.txt, images.txt, points3D.txt); the images are "
        "its photos, found by file name; the mesh is written in COLMAP's world",
    )
    p.add_argument(
        "--poses",
        default=None,
        metavar="JSON",
        help="camera-to-world matrices and intrinsics per photo (see xmesh.cameras.from_poses); the mesh is "
        "written in their world",
    )
    p.add_argument(
        "--masks",
        nargs=3,
        default=None,
        metavar="M",
        help="with --colmap/--poses: one mask per photo (object white on black), else the photos' alpha",
    )
    p.add_argument(
        "--center",
        default=None,
        metavar="C",
        help="with --colmap/--poses: 'points' (the object's 3D points), 'axes' (the point nearest every "
        "optical axis) or X,Y,Z",
    )
    p.add_argument(
        "--radius", type=float, default=None, help="with --colmap/--poses: the object's radius in the input's units"
    )
    p.add_argument(
        "--up",
        type=float,
        nargs=3,
        default=None,
        metavar=("X", "Y", "Z"),
        help="with --colmap/--poses: the world's up direction (default: estimated from the cameras)",
    )
    p.add_argument(
        "--first-azimuth",
        type=float,
        default=None,
        metavar="DEG",
        help="with --colmap/--poses: the first view's azimuth (default 0)",
    )


def _given(args) -> list[str]:
    return [name for name in SOURCES if getattr(args, name[2:].replace("-", "_")) is not None]


def camera_source(args) -> str:
    """Which of --cameras, --colmap, --poses was given (exactly one must be); checks the options that go with it."""
    given = _given(args)
    if len(given) != 1:
        raise InputError(
            f"{'no camera source' if not given else 'several camera sources (' + ', '.join(given) + ')'}: "
            "give exactly one of --cameras FILE (camera rows), --colmap SPARSE_DIR or --poses JSON"
        )
    if given[0] == "--cameras":
        extra = [name for name in PHOTO_ONLY if getattr(args, name[2:].replace("-", "_")) is not None]
        if extra:
            raise InputError(
                f"{', '.join(extra)} go with --colmap or --poses (photos with their own cameras); "
                "--cameras rows take images already framed like ShapeNet renderings"
            )
    elif args.views is not None:
        raise InputError(f"--views picks rows of a --cameras file; with {given[0]} the three images are the views")
    return given[0]


def reject_photo_options(args) -> None:
    """--list reconstructs ShapeNet-layout samples only: no photo options."""
    extra = [
        name for name in ("--colmap", "--poses") + PHOTO_ONLY if getattr(args, name[2:].replace("-", "_")) is not None
    ]
    if extra:
        raise InputError(
            f"{', '.join(extra)} cannot be used with --list; reconstruct posed photos one object at a time"
        )


def _center(value):
    if value is None or value in ("points", "axes"):
        return value
    try:
        point = [float(v) for v in value.split(",")]
    except ValueError:
        point = []
    if len(point) != 3:
        raise InputError(f"--center {value}: expected 'points', 'axes' or X,Y,Z")
    return point


def photo_cameras(args, source: str):
    """The PhotoCameras of --colmap or --poses for the command's three images."""
    from ..cameras import from_colmap, from_poses

    center = _center(args.center)
    options = dict(masks=args.masks, radius=args.radius, up=args.up)
    if source == "--colmap":
        cameras = from_colmap(
            args.colmap, args.images, center=center or "points", first_azimuth=args.first_azimuth or 0.0, **options
        )
    else:
        cameras = from_poses(args.poses, args.images, center=center, first_azimuth=args.first_azimuth, **options)
    print(
        f"xmesh {args.command}: cameras from {source} {args.colmap or args.poses}:\n{cameras.describe()}",
        file=sys.stderr,
    )
    return cameras


def inputs_from_args(args):
    """(network images, camera rows, place) for the command's images: ``place(mesh)`` puts the network's
    mesh in the input's world (posed photos) or leaves it in camera 0's frame (camera rows)."""
    from ..io.cameras import load_cameras
    from ..io.images import load_images

    source = camera_source(args)
    if source == "--cameras":
        return load_images(args.images), load_cameras(args.cameras, views=args.views), lambda mesh: mesh
    cameras = photo_cameras(args, source)
    return cameras.prepare_images(args.images), cameras.rows, cameras.place
