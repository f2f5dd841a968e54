"""xmesh bench: time the network's stages per backend and batch size (the code the asv suite runs)."""

from __future__ import annotations

import json
import sys

GPU_BATCH_SIZES = (1, 16, 64)
CPU_BATCH_SIZES = (1,)


def add_parser(sub) -> None:
    from ..benchmarking import STAGES

    p = sub.add_parser(
        "bench",
        help="time the stages (median ms per call and per sample) on numpy and/or cupy",
        description="Time each stage of Pixel2Mesh++ with synthetic weights (seed 1) on the golden "
        "demo inputs (or procedural renderings when ../shared is absent). GPU timings "
        "synchronise the device inside the timed region.",
    )
    p.add_argument(
        "--backend",
        default="all",
        choices=("numpy", "cupy", "all"),
        help="backend to time; 'all' (default) = every backend that runs here, numpy included as the CPU comparison",
    )
    p.add_argument(
        "--batch-sizes",
        type=int,
        nargs="+",
        default=None,
        metavar="B",
        help=f"samples per call (default: {' '.join(map(str, GPU_BATCH_SIZES))} when cupy runs, else "
        f"{' '.join(map(str, CPU_BATCH_SIZES))})",
    )
    p.add_argument("--repeat", type=int, default=3, help="timed calls per stage; the median is reported (default: 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls before timing each stage (default: 1)")
    p.add_argument(
        "--stages",
        nargs="+",
        default=None,
        choices=STAGES,
        metavar="STAGE",
        help=f"stages to time (default: all): {', '.join(STAGES)}",
    )
    p.add_argument(
        "--numpy-max-batch",
        type=int,
        default=2,
        help="next to a GPU backend, run numpy only up to this batch size (default: 2; a numpy sample takes seconds)",
    )
    p.add_argument(
        "--precision",
        default="fp32",
        choices=("fp32", "tf32", "fp16", "bf16"),
        help="the GPU backend's mode (default fp32, float32-faithful; tf32, fp16 and bf16 are speed modes, "
        "their errors in docs/PERFORMANCE.md); numpy always runs float32",
    )
    p.add_argument("--json", action="store_true", help="print the full report as JSON on stdout")
    p.add_argument(
        "--explain",
        action="store_true",
        help="time nothing: print which kernel runs each step on this machine in --precision, and why "
        "(the routing table of xmesh/backends/plan.py)",
    )
    p.set_defaults(run=run)


def run(args) -> int:
    from ..benchmarking import format_table, resolve_backends, run_bench
    from ..errors import InputError

    if args.batch_sizes and min(args.batch_sizes) < 1:
        raise InputError(f"--batch-sizes {' '.join(map(str, args.batch_sizes))}: expected whole numbers >= 1")
    names = resolve_backends(args.backend)
    if args.explain:
        return explain(names, args.precision)
    batch_sizes = args.batch_sizes or (GPU_BATCH_SIZES if any(n != "numpy" for n in names) else CPU_BATCH_SIZES)
    with Progress() as progress:
        report = run_bench(
            names,
            batch_sizes,
            repeat=args.repeat,
            warmup=args.warmup,
            stages=args.stages,
            numpy_max_batch=args.numpy_max_batch,
            precision=args.precision,
            progress=progress,
        )
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_table(report))
    return 0


class Progress:
    """What bench shows while it runs: on a terminal a bar over the planned network calls with the time
    left (averaged over the whole run, as stages differ in length), elsewhere one line per stage."""

    def __init__(self):
        from tqdm import tqdm

        self.bar = tqdm(total=0, unit="call", file=sys.stderr, disable=None, dynamic_ncols=True, smoothing=0)
        self.said = None

    def __call__(self, what: str, done: int, planned: int) -> None:
        if self.bar.disable:
            if what != self.said:
                print(f"xmesh bench: {what}", file=sys.stderr, flush=True)
                self.said = what
            return
        self.bar.total = planned
        self.bar.set_description(what, refresh=False)
        self.bar.update(done - self.bar.n)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()


def explain(names, precision: str) -> int:
    from ..backends import get_backend
    from ..backends.plan import explain_backend

    for name in names:
        backend = get_backend(name) if name == "numpy" else get_backend(name, precision=precision)
        print(f"== {name}\n{explain_backend(backend)}")
    return 0
