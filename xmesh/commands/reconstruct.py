"""xmesh reconstruct IMG IMG IMG --cameras F | --colmap DIR | --poses JSON --weights W --out mesh.obj"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..errors import InputError
from ..io.weight_sources import describe_weights
from ..io.writable import check_writable_file, check_writable_folder
from .common import (
    add_cluster_option,
    add_model_options,
    add_overwrite_option,
    check_batch_size,
    check_folder,
    check_weights_values,
    describe_processes,
    output_errors,
    resolve_weights,
    run_dataset_command,
    run_identity,
)
from .eval import IMAGES_ROOT
from .photo_options import add_photo_options, camera_source, inputs_from_args, reject_photo_options

WRITERS = {".obj": "to_obj", ".ply": "to_ply", ".xyz": "to_xyz", ".glb": "to_glb"}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "reconstruct",
        help="reconstruct a mesh from 3 images and their cameras, or a whole list",
        description="One object: IMG IMG IMG --cameras F --out mesh.obj. A whole list in the official "
        "layout: --list FILE --images ROOT --out DIR writes DIR/{id}_predict.xyz and "
        "{id}_predict.obj per sample, batched, skipping samples whose files exist.",
    )
    p.add_argument("images", nargs="*", metavar="IMG", help="three images (PNG/JPEG), in the order of the camera rows")
    p.add_argument("--cameras", default=None, help="cameras.txt (3 rows) or a ShapeNet rendering_metadata.txt")
    add_photo_options(p)
    p.add_argument(
        "--views",
        type=int,
        nargs=3,
        default=None,
        metavar="I",
        help="rows of the camera file to use (with --list: renderings, default 0 6 7)",
    )
    p.add_argument("--out", required=True, help="output mesh: .obj, .ply, .glb or .xyz (with --list: a folder)")
    p.add_argument("--list", default=None, metavar="FILE", help="reconstruct every sample of this list instead")
    p.add_argument(
        "--images",
        dest="images_root",
        default=None,
        metavar="ROOT",
        help="with --list: the ShapeNetRendering folder, or a folder holding it",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="with --list: samples per pass (default: 64 on the GPU, 1 on the CPU)",
    )
    p.add_argument("--workers", type=int, default=None, help="with --list: loader processes (and as many writers)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="with --list: only the first N samples")
    p.add_argument("--no-progress", action="store_true", help="with --list: do not draw the progress bar")
    p.add_argument("--coarse-out", default=None, help="also write the stage-1 coarse mesh here")
    p.add_argument(
        "--server",
        default=None,
        metavar="URL",
        help="send the images and --cameras or --poses to a running 'xmesh serve' at URL instead of "
        "reconstructing here (the model options are then the server's)",
    )
    add_overwrite_option(p, "meshes (with --list)")
    add_model_options(p, weights_required=False)
    add_cluster_option(p)
    p.set_defaults(run=run)


def writer(path: str, option: str = "--out"):
    suffix = Path(path).suffix.lower()
    if suffix not in WRITERS:
        raise InputError(f"{option} {path}: unknown mesh format {suffix!r}; use one of {', '.join(WRITERS)}")
    return WRITERS[suffix]


def _check_output(option: str, path: str | None) -> None:
    if path and Path(path).is_dir():
        raise InputError(
            f"{option} {path}: is a folder; expected the path of a mesh file to write "
            f"({', '.join(WRITERS)}); a folder goes with --list"
        )


def _write(mesh, method: str, option: str, path: str) -> None:
    with output_errors(f"{option} {path}: writing"):
        getattr(mesh, method)(path)


def run(args) -> int:
    from ..io.template import load_template
    from ..reconstruct import Reconstructor

    check_batch_size(args)
    check_weights_values(args)
    if args.list is not None:
        if args.server is not None:
            raise InputError("--server sends one object (three images); --list runs here")
        if args.weights is None:
            raise InputError("--weights is required with --list")
        return run_list(args)
    if args.server is not None:
        return run_remote(args)
    if args.weights is None:
        raise InputError("--weights is required (or --server URL, a running 'xmesh serve' that has its own)")
    if args.cluster is not None:
        raise InputError("--cluster goes with --list FILE (a whole list); one object runs here")
    if args.images_root is not None:
        raise InputError("--images ROOT goes with --list FILE; for one object give the three image files")
    camera_source(args)
    if len(args.images) != 3:
        raise InputError(f"got {len(args.images)} images: Pixel2Mesh++ needs exactly 3 views")
    _check_output("--out", args.out)
    _check_output("--coarse-out", args.coarse_out)
    out_writer = writer(args.out)
    coarse_writer = writer(args.coarse_out, "--coarse-out") if args.coarse_out else None
    check_writable_file(args.out)
    if args.coarse_out:
        check_writable_file(args.coarse_out, "--coarse-out")
    start = time.perf_counter()
    # validate every input before the (costly) model is built: images, cameras, template, then weights
    images, cameras, place = inputs_from_args(args)
    template = load_template(args.template) if args.template else None
    model = Reconstructor(
        resolve_weights(args.weights),
        template=template,
        backend=args.backend,
        precision=args.precision,
        view_quirk=not args.no_view_quirk,
    )
    mesh = place(model(images, cameras))
    _write(mesh, out_writer, "--out", args.out)
    if coarse_writer:
        _write(mesh.coarse(), coarse_writer, "--coarse-out", args.coarse_out)
    print(
        f"wrote {args.out} ({len(mesh.vertices)} vertices, {len(mesh.faces)} faces) in "
        f"{time.perf_counter() - start:.2f} s with {describe_weights(args.weights)} on {args.backend}",
        file=sys.stderr,
    )
    return 0


def run_remote(args) -> int:
    """One object reconstructed by the server at --server: the same request as xmesh.serve.client's."""
    from ..serve.client import check_url, remote_mesh, request_fields

    check_url(args.server)
    source = camera_source(args)
    extra = [
        name
        for name in ("--colmap", "--coarse-out", "--masks", "--center", "--radius", "--up", "--first-azimuth")
        if getattr(args, name[2:].replace("-", "_")) is not None
    ]
    if args.weights is not None:
        extra.append("--weights (the server has its own)")
    if extra or source == "--colmap":
        raise InputError(
            f"--server takes the three images and --cameras or --poses; {', '.join(extra) or '--colmap'} "
            "cannot go with it"
        )
    if len(args.images) != 3:
        raise InputError(f"got {len(args.images)} images: Pixel2Mesh++ needs exactly 3 views")
    _check_output("--out", args.out)
    out_writer = writer(args.out)
    start = time.perf_counter()
    fields = (
        request_fields(cameras=args.cameras, views=args.views)
        if source == "--cameras"
        else request_fields(poses=args.poses)
    )
    mesh, headers = remote_mesh(args.server, args.images, fields)
    _write(mesh, out_writer, "--out", args.out)
    print(
        f"wrote {args.out} ({len(mesh.vertices)} vertices, {len(mesh.faces)} faces) in "
        f"{time.perf_counter() - start:.2f} s from {args.server} (a batch of {headers.get('X-Xmesh-Batch-Size', '?')})",
        file=sys.stderr,
    )
    return 0


def run_list(args) -> int:
    from ..pipeline.settings import RunSettings

    reject_photo_options(args)
    if args.images:
        raise InputError(f"--list reconstructs the samples of a list: drop the image arguments {args.images[:3]}")
    if args.images_root is None:
        raise InputError("--list needs --images ROOT, the ShapeNetRendering folder (or a folder holding it)")
    check_folder(args.images_root, "--images", IMAGES_ROOT)
    if Path(args.out).is_file():
        raise InputError(f"--out {args.out}: is a file; with --list, --out is the folder the meshes go to")
    check_writable_folder(args.out)
    chosen = RunSettings.choose(args.backend == "cupy", args.batch_size, args.workers, save_meshes=True)
    from ..dataset import DEFAULT_VIEWS, listing_args

    args.views = args.views or DEFAULT_VIEWS  # one value for the listing started ahead and the run that takes it
    listing = listing_args(args.list, args.images_root, args.out, args.views, args.limit, False)
    return run_dataset_command(
        args,
        chosen,
        ("images_root", "out"),
        lambda a, model, pool, client: _run(a, chosen, model, pool, client),
        listing,
    )


def _run(args, chosen, model, pool, client) -> int:
    from ..evaluate import format_timing, reconstruct_dataset
    from ..pipeline.startup import format_startup

    identity = run_identity(args, model)
    print(
        f"xmesh reconstruct: {describe_weights(args.weights)}, backend {args.backend} ({args.precision}), "
        f"batch size {chosen.batch_size}, {describe_processes(chosen, args, client)}",
        file=sys.stderr,
    )
    info = reconstruct_dataset(
        model,
        args.list,
        args.images_root,
        args.out,
        batch_size=args.batch_size,
        workers=args.workers,
        limit=args.limit,
        progress=not args.no_progress,
        views=args.views,
        loader_pool=pool,
        client=client,
        shard_batches=args.shard_batches,
        identity=identity,
        overwrite=args.overwrite,
    )
    print(
        f"wrote {info['evaluated']} sample(s) to {args.out} ({info['skipped']} already there) in "
        f"{info['seconds']:.1f} s, {info['samples_per_s']:.1f} samples/s",
        file=sys.stderr,
    )
    if "timing" in info:
        print(f"xmesh reconstruct: {format_timing(info['timing'])}", file=sys.stderr)
        if "startup" in info["timing"]:
            print(f"xmesh reconstruct: {format_startup(info['timing'])}", file=sys.stderr)
    return 0
