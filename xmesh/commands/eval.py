"""xmesh eval --images ROOT --gt ROOT --list FILE --weights W --out DIR"""

from __future__ import annotations

import sys

from ..io.weight_sources import describe_weights
from .common import (
    add_cluster_option,
    add_model_options,
    add_overwrite_option,
    add_views_option,
    check_batch_size,
    check_folder,
    describe_processes,
    run_dataset_command,
    run_identity,
)

IMAGES_ROOT = "the ShapeNetRendering folder ({synset}/{item}/rendering/NN.png), or a folder holding it"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate over a ShapeNet-style dataset (Chamfer distance, F-score)",
        description="Reconstruct every sample of a list in the official Pixel2Mesh++ layout and "
        "score it against its ground truth. Rows go to OUT/samples.csv as they are "
        "computed; running again with the same --out resumes. The per-category table "
        "is written to OUT/summary.txt and OUT/summary.json and printed.",
    )
    p.add_argument("--images", required=True, metavar="ROOT", help=IMAGES_ROOT)
    p.add_argument(
        "--gt", required=True, metavar="ROOT", help="folder of the ground truth {synset}_{item}_00.dat files"
    )
    p.add_argument("--list", required=True, metavar="FILE", help="test list: one {synset}_{item}_00.dat per line")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (samples.csv, summary.json, summary.txt)")
    p.add_argument(
        "--batch-size", type=int, default=None, help="samples per forward pass (default: 64 on the GPU, 1 on the CPU)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes decoding the next batches, and as many writing meshes (0: inline; default: "
        "up to 8 on the GPU, from the CPU count; 1 on the CPU)",
    )
    p.add_argument(
        "--save-meshes",
        action="store_true",
        help="also write OUT/predict/{id}_predict.xyz and {id}_predict.obj for every sample",
    )
    p.add_argument(
        "--save-ground",
        action="store_true",
        help="with --save-meshes, also write OUT/predict/{id}_ground.xyz (the .dat's points, as the "
        "original's test script writes them) so that its f_score.py and cd_distance.py read the "
        "folder; about 2.4 MB of text a sample",
    )
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N samples of the list")
    p.add_argument(
        "--metric-backend",
        default="auto",
        choices=("auto", "scipy", "faiss", "cupy"),
        help="nearest-neighbour backend of the metrics (default: auto = cupy on the GPU, else scipy)",
    )
    add_views_option(p)
    p.add_argument("--no-progress", action="store_true", help="do not draw the progress bar")
    p.add_argument(
        "--report",
        action="store_true",
        help="also write OUT/report.html (charts, timing, a gallery) and its pictures in OUT/report/; "
        'needs the report extra: pip install "xmesh-p2mpp[report]"',
    )
    add_overwrite_option(p, "samples.csv, summaries, logs, meshes and report")
    add_model_options(p)
    add_cluster_option(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from ..io.writable import check_writable_folder
    from ..pipeline.settings import RunSettings

    check_batch_size(args)
    check_folder(args.images, "--images", IMAGES_ROOT)
    check_folder(args.gt, "--gt", "the folder of the ground truth {synset}_{item}_00.dat files")
    check_writable_folder(args.out)

    if args.report:  # fail at once, before any work, where matplotlib is missing
        from ..report import require_matplotlib

        require_matplotlib()
    chosen = RunSettings.choose(args.backend == "cupy", args.batch_size, args.workers, args.save_meshes)
    from ..dataset import listing_args

    listing = listing_args(args.list, args.images, args.gt, args.views, args.limit, True)
    return run_dataset_command(
        args,
        chosen,
        ("images", "gt", "out"),
        lambda a, model, pool, client: _run(a, chosen, model, pool, client),
        listing,
    )


def _run(args, chosen, model, pool, client) -> int:
    from ..evaluate import evaluate_dataset, format_table, format_timing
    from ..pipeline.startup import format_startup

    identity = run_identity(args, model)
    said = describe_weights(args.weights)
    print(
        f"xmesh eval: {said}, backend {args.backend} ({args.precision}), batch size {chosen.batch_size}, "
        f"{describe_processes(chosen, args, client, 'mesh writer')}",
        file=sys.stderr,
    )
    summary = evaluate_dataset(
        model,
        args.list,
        args.images,
        args.gt,
        args.out,
        batch_size=args.batch_size,
        workers=args.workers,
        metric_backend=args.metric_backend,
        limit=args.limit,
        progress=not args.no_progress,
        views=args.views,
        save_meshes=args.save_meshes,
        save_ground=args.save_ground,
        loader_pool=pool,
        client=client,
        shard_batches=args.shard_batches,
        identity=identity,
        overwrite=args.overwrite,
        meta={
            "weights": said,
            "backend": args.backend,
            "precision": args.precision,
            "template": args.template or "built-in ellipsoid",
            "views": list(args.views),
            "synthetic_weights": said.startswith("synthetic"),
        },
    )
    info = summary["run"]
    if args.overwrite:  # the earlier run's report goes with its results
        import shutil
        from pathlib import Path

        from ..report import REPORT_FOLDER, REPORT_HTML

        Path(args.out, REPORT_HTML).unlink(missing_ok=True)
        shutil.rmtree(Path(args.out, REPORT_FOLDER), ignore_errors=True)
    if info["skipped"]:
        print(
            f"xmesh eval: resumed; {info['skipped']} sample(s) already in {args.out}/samples.csv were skipped",
            file=sys.stderr,
        )
    if info["repaired_last_line"]:
        print("xmesh eval: dropped an incomplete last line of samples.csv (an interrupted write)", file=sys.stderr)
    print(format_table(summary), end="")
    print(f"weights: {said}")
    print(
        f"wrote {args.out}/samples.csv, summary.json, summary.txt, f_score.log, cd.log"
        f"{', predict/' if args.save_meshes else ''} ({summary['samples']} samples; "
        f"{info['evaluated']} evaluated now in {info['seconds']:.1f} s, {info['samples_per_s']:.1f} samples/s)"
    )
    if "timing" in info:
        print(f"xmesh eval: {format_timing(info['timing'])}")
        if "startup" in info["timing"]:
            print(f"xmesh eval: {format_startup(info['timing'])}")
    if args.report:
        from ..report import write_report

        # on a cluster the gallery's predictions come from predict/, or a model built here for them
        painter = model if client is None else (None if args.save_meshes else model.build())
        page = write_report(args.out, args.images, args.gt, painter, args.views, progress=not args.no_progress)
        print(f"wrote {page} and its pictures")
    return 0
