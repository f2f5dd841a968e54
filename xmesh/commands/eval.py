"""xmesh eval --images ROOT --gt ROOT --list FILE --weights W --out DIR"""
from __future__ import annotations

import sys

from .common import add_model_options, describe_weights, reconstructor_from_args


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="evaluate over a ShapeNet-style dataset (Chamfer distance, F-score)",
                       description="Reconstruct every sample of a list in the official Pixel2Mesh++ layout and "
                                   "score it against its ground truth. Rows go to OUT/samples.csv as they are "
                                   "computed; running again with the same --out resumes. The per-category table "
                                   "is written to OUT/summary.txt and OUT/summary.json and printed.")
    p.add_argument("--images", required=True, metavar="ROOT",
                   help="the ShapeNetRendering folder ({synset}/{item}/rendering/NN.png), or a folder holding it")
    p.add_argument("--gt", required=True, metavar="ROOT", help="folder of the ground truth {synset}_{item}_00.dat files")
    p.add_argument("--list", required=True, metavar="FILE", help="test list: one {synset}_{item}_00.dat per line")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (samples.csv, summary.json, summary.txt)")
    p.add_argument("--batch-size", type=int, default=1, help="samples per forward pass (default: 1)")
    p.add_argument("--workers", type=int, default=2, help="threads decoding the next batches (0: inline; default: 2)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N samples of the list")
    p.add_argument("--metric-backend", default="auto", choices=("auto", "scipy", "faiss", "cupy"),
                   help="nearest-neighbour backend of the metrics (default: auto = cupy on the GPU, else scipy)")
    p.add_argument("--views", type=int, nargs=3, default=[0, 6, 7], metavar="I",
                   help="renderings used as the 3 input views (default: 0 6 7)")
    p.add_argument("--measure-overlap", type=int, nargs="?", const=8, default=None, metavar="N",
                   help="also time N samples (default 8) with inline decoding vs --workers threads; "
                        "adds a 'throughput' section to summary.json")
    p.add_argument("--no-progress", action="store_true", help="do not draw the progress bar")
    add_model_options(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from ..evaluate import evaluate_dataset, format_table

    said = describe_weights(args.weights)
    model = reconstructor_from_args(args)
    print(f"xmesh eval: {said}, backend {args.backend} ({args.precision})", file=sys.stderr)
    summary = evaluate_dataset(
        model, args.list, args.images, args.gt, args.out, batch_size=args.batch_size, workers=args.workers,
        metric_backend=args.metric_backend, limit=args.limit, progress=not args.no_progress, views=args.views,
        measure_overlap=args.measure_overlap or False,
        meta={"weights": said, "backend": args.backend, "precision": args.precision,
              "template": args.template or "built-in ellipsoid", "views": list(args.views)},
    )
    info = summary["run"]
    if info["skipped"]:
        print(f"xmesh eval: resumed; {info['skipped']} sample(s) already in {args.out}/samples.csv were skipped",
              file=sys.stderr)
    if info["repaired_last_line"]:
        print("xmesh eval: dropped an incomplete last line of samples.csv (an interrupted write)", file=sys.stderr)
    print(format_table(summary), end="")
    print(f"weights: {said}")
    if "throughput" in summary:
        t = summary["throughput"]
        print(f"throughput over {t['samples']} samples: {t['inline']['samples_per_s']:.3f} samples/s inline, "
              f"{t['prefetch']['samples_per_s']:.3f} samples/s with {t['prefetch']['workers']} workers")
    print(f"wrote {args.out}/samples.csv, summary.json, summary.txt ({summary['samples']} samples; "
          f"{info['evaluated']} evaluated now in {info['seconds']:.1f} s)")
    return 0
