"""Training steps a second: ``Trainer.step`` (loss, backward, Adam) at each batch size, then ``xmesh train``.

    python3 scripts/train_bench.py --backend cupy --batch-sizes 1 32 --steps 20
    python3 scripts/train_bench.py --backend numpy --batch-sizes 1 --steps 3 --no-command

1. the step alone (:class:`xmesh.train.bench.StepWorkload`: stage 2 by default, synthetic weights, the
   golden training sample repeated B times): median ms a step and samples/s after a warm-up step;
2. unless ``--no-command``, ``xmesh train`` over a synthetic list (``--samples`` objects in the official
   layout, stage 2's starts computed first and not timed) for one epoch at each batch size: the run's
   samples/s by the wall clock over its steps after the first (train_log.csv's ``wall_s``), data loading,
   logging and the epoch's checkpoint included, and the mean ms of those steps' compute alone (its
   ``seconds``: the rest of the wall clock is loading, logging and waiting).
Prints one table.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from xmesh.train.bench import StepWorkload


def command_rate(root: Path, args, batch: int) -> tuple[float, float]:
    """``xmesh train``'s samples/s by the wall clock from the first step's end to the last's, and the mean
    seconds of those steps' compute alone (``Trainer.step``; the rest of the wall clock is loading,
    logging and waiting), from its train_log.csv."""
    from xmesh.backends import get_backend
    from xmesh.cli import main
    from xmesh.train.logs import read_rows

    out = root / f"run_b{batch}"
    argv = [
        "train",
        "--stage",
        str(args.stage),
        "--images",
        str(root / "data"),
        "--gt",
        str(root / "data" / "gt"),
        "--list",
        str(root / "data" / "test_list.txt"),
        "--weights",
        "synthetic:1",
        "--out",
        str(out),
        "--epochs",
        "1",
        "--batch-size",
        str(batch),
        "--backend",
        args.backend,
        "--no-progress",
        "--overwrite",
    ]
    if args.stage == 2:
        argv += ["--starts", str(root / "starts")]
    gc.collect()  # the runs before and their graphs' memory, given back before this one
    get_backend(args.backend).release_memory()
    with contextlib.redirect_stdout(io.StringIO()):
        status = main(argv)
    if status != 0:
        raise SystemExit(f"xmesh train failed at batch size {batch}")
    rows = read_rows(out / "train_log.csv")[1:]
    rate = sum(len(r["samples"].split(";")) for r in rows) / sum(float(r["wall_s"]) for r in rows)
    return rate, sum(float(r["seconds"]) for r in rows) / len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="numpy", choices=("numpy", "cupy"))
    parser.add_argument("--stage", type=int, default=2, choices=(1, 2))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per batch size (after one warm-up)")
    parser.add_argument("--samples", type=int, default=64, help="objects in the synthetic list of xmesh train")
    parser.add_argument("--no-command", action="store_true", help="time the step alone, not xmesh train")
    parser.add_argument(
        "--no-graphs", action="store_true", help="run every step eagerly (no CUDA Graph of the small batches' step)"
    )
    args = parser.parse_args()

    rows = []
    for batch in args.batch_sizes:
        work = StepWorkload(args.stage, args.backend, batch, graphs=not args.no_graphs)
        rows.append(work.time_steps(args.steps))
        work.release()
        print(f"step b={batch}: {rows[-1]['median_s'] * 1e3:.1f} ms", file=sys.stderr)
    sources = (work.sample_source, work.template_source)
    if not args.no_command:
        from xmesh.io.weights import synthetic_weights
        from xmesh.synthetic.dataset import write_dataset
        from xmesh.template_gen import generate_template
        from xmesh.train.starts import compute_starts

        with tempfile.TemporaryDirectory(prefix="xmesh-train-bench-", dir=os.environ.get("OUT")) as tmp:
            root = Path(tmp)
            data = write_dataset(root / "data", n_per_category=max(1, args.samples // 4), seed=11)
            if args.stage == 2:
                compute_starts(
                    synthetic_weights(1),
                    generate_template(),
                    data["test_list"],
                    root / "data",
                    root / "starts",
                    backend=args.backend,
                    progress=False,
                )
            for row in rows:
                row["command_samples_per_s"], row["command_step_s"] = command_rate(root, args, row["batch"])
    print(f"stage {args.stage} training on {args.backend}; sample: {sources[0]}; template: {sources[1]}")
    print(
        f"{'batch':>5} {'ms/step':>9} {'min ms':>8} {'samples/s':>10} {'xmesh train samples/s':>22} {'its step ms':>12}"
    )
    for row in rows:
        command, step = row.get("command_samples_per_s"), row.get("command_step_s")
        print(
            f"{row['batch']:>5} {row['median_s'] * 1e3:>9.2f} {row['min_s'] * 1e3:>8.2f} "
            f"{row['samples_per_s']:>10.2f} {'' if command is None else f'{command:.2f}':>22} "
            f"{'' if step is None else f'{step * 1e3:.2f}':>12}"
        )
    if np.isfinite([r["samples_per_s"] for r in rows]).all():
        print(
            "(step: median of the timed steps; xmesh train: the wall clock over its steps after the first, "
            "loading, logging and checkpoints included, and the mean of those steps' compute alone)"
        )


if __name__ == "__main__":
    main()
