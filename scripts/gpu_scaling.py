"""`xmesh eval --cluster local-cuda` on 1, 2, ... GPUs of one host against the plain run, by both clocks.

    python3 scripts/gpu_scaling.py --samples 32768 --precisions fp16 [--gpus 1 2 4] [--variant "--workers 8" ...]

1. writes (or reuses: the dataset folder is kept) the synthetic dataset of ``scripts/pipeline_bench.py``
   (``make_dataset``); its writing is timed apart and counts in no figure;
2. compiles the bytecode of the packages a run imports where it is missing (``compile_bytecode``), then
   one short plain run per precision, so that neither kernel nor Python compilation is in the figures;
3. per precision: the plain single-process run on GPU 0, then ``--cluster local-cuda`` with
   ``CUDA_VISIBLE_DEVICES`` set to the first 1, 2, ... GPUs, each into a fresh output folder; then each
   ``--variant`` (extra ``xmesh eval`` arguments, e.g. ``"--workers 8"`` or ``"--shard-batches 4"``)
   on the most GPUs;
4. prints for each run both clocks: samples/s on the pipeline's own clock (summary.json, from the
   first batch) with its ratio to the plain run, the speed-up and efficiency against the 1-GPU
   cluster run, and the whole command's seconds (process start to exit) with how many times sooner
   than the plain command it finished; then the start-up split (summary.json's ``startup_*``:
   seconds from the process's start to the first batch), the seconds after the last batch (the
   run's ``finish``: outputs written; the rest: the cluster closed, the process's exit), the
   shards, each worker's loader processes and set-up, the per-worker stage timing, and whether
   every row equals the plain run's.
Full outputs go to ``$OUT`` (or /tmp/gpu_scaling).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dask_bench import agreement, figures, rows, run  # noqa: E402
from pipeline_bench import eval_arguments, make_dataset  # noqa: E402

STARTUP = "startup_"
FINISH = "finish"


# what ``xmesh eval --cluster local-cuda`` imports in its processes
IMPORTED = (
    "xmesh",
    "distributed",
    "dask",
    "tornado",
    "msgpack",
    "cloudpickle",
    "toolz",
    "tlz",
    "zict",
    "tblib",
    "psutil",
    "yaml",
    "jinja2",
    "click",
    "fsspec",
    "partd",
    "locket",
    "sortedcontainers",
    "array_api_compat",
    "numpy",
    "scipy",
    "cv2",
    "cupy",
    "cupyx",
    "fastrlock",
    "tqdm",
)


def compile_bytecode(names=IMPORTED) -> str:
    """Write the bytecode of ``names``' modules where it is missing or stale, as pip's install does: an
    interpreter that does not write it (PYTHONDONTWRITEBYTECODE, set on some shared GPU machines) compiles
    every module from source in every process, which on an H100 machine added 0.9 s to a one-GPU
    cluster's start and 0.2 s to a plain run's. Returns what was done, for the log."""
    import compileall
    import importlib.util

    folders = []
    for name in names:
        spec = importlib.util.find_spec(name)
        folders += list(spec.submodule_search_locations or []) if spec is not None else []
    ok = all([compileall.compile_dir(f, quiet=2, workers=0) for f in folders])
    return f"bytecode of {len(folders)} packages {'compiled' if ok else 'compiled where writable'}"


def visible_gpus() -> int:
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def startup_split(timing: dict) -> str:
    if "startup" not in timing:
        return "no start-up figures"
    parts = sorted(((k[len(STARTUP) :], v) for k, v in timing.items() if k.startswith(STARTUP)), key=lambda kv: -kv[1])
    return f"start-up {timing['startup']:.2f} s: " + ", ".join(f"{k} {v:.2f}" for k, v in parts if v >= 0.005)


def after_last_batch(timing: dict, seconds: float) -> str:
    """The command's seconds after its last batch: the run's own ``finish`` (last rows and meshes
    written, the summary made) and the rest (closing the cluster, the process's exit), which is the
    command's seconds less start-up, pipeline and finish."""
    if "startup" not in timing or FINISH not in timing:
        return "no figures after the last batch"
    after = seconds - timing["startup"] - timing["wall"]
    return (
        f"after the last batch {after:.2f} s: outputs {timing[FINISH]:.2f}, close and exit {after - timing[FINISH]:.2f}"
    )


def stage_timing(timing: dict) -> str:
    stages = [(k, v) for k, v in timing.items() if k not in ("wall", "startup", FINISH) and not k.startswith(STARTUP)]
    return ", ".join(f"{k} {v:.2f}" for k, v in sorted(stages, key=lambda kv: -kv[1]))


class Table:
    """The rows of one precision, each compared with its plain run and its 1-GPU cluster run."""

    def __init__(self, precision: str):
        self.precision = precision
        self.plain_rate = self.plain_wall = self.plain_rows = self.base_rate = None
        self.lines: list[str] = []

    def add(self, name: str, gpus: int, res: Path, seconds: float, ok: bool) -> None:
        info = figures(res) if ok else {}
        rate = info.get("samples_per_s")
        timing = info.get("timing", {})
        if gpus == 0:
            self.plain_rate, self.plain_wall, self.plain_rows = rate, seconds, rows(res) if ok else None
        elif gpus == 1 and name == "1 GPU":
            self.base_rate = rate
        cluster = gpus >= 1 and rate
        of_plain = f"{100 * rate / self.plain_rate:.0f}%" if cluster and self.plain_rate else ""
        speedup = rate / self.base_rate if cluster and self.base_rate else None
        sooner = f"{self.plain_wall / seconds:.2f}x" if gpus >= 1 and ok and self.plain_wall else ""
        same = agreement(self.plain_rows, rows(res)) if ok and self.plain_rows is not None and gpus >= 1 else ""
        setup = info.get("cluster", {})
        prepared = "; ".join(
            f"{w.get('loaders')} loaders on {w.get('cores')} cores, model {w.get('model_s', 0):.1f} s "
            f"+ kernels {w.get('kernels_s', 0):.1f} s"
            for w in setup.get("prepared", [])
        )
        line = (
            f"{self.precision:<5} {name:<26} {rate or float('nan'):>9.1f} {of_plain:>6} "
            f"{'' if speedup is None else f'{speedup:.2f}x':>7} "
            f"{'' if speedup is None else f'{100 * speedup / gpus:.0f}%':>5} {seconds:>8.1f} {sooner:>7} "
            f"{setup.get('shards', ''):>6}"
        )
        line += (
            f"\n{'':8}{startup_split(timing)}; {after_last_batch(timing, seconds)}"
            f"\n{'':8}per-worker stages: {stage_timing(timing)}"
        )
        if same:
            line += f"\n{'':8}rows against plain: {same}"
        if prepared:
            line += f"\n{'':8}workers: {prepared}"
        self.lines.append(line)
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--precisions", nargs="+", default=["fp16", "fp32"])
    parser.add_argument(
        "--gpus",
        type=int,
        nargs="+",
        default=None,
        help="GPU counts to run (default: 1, 2, 4, ... up to the GPUs visible)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="ARGS",
        help="extra xmesh eval arguments for one more cluster run on the most GPUs (repeatable)",
    )
    parser.add_argument("--data", default=None, help="dataset folder (made if missing, kept)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds after which a run is reported as hung")
    args = parser.parse_args()
    available = visible_gpus()
    counts = args.gpus or [n for n in (1, 2, 4, 8, 16) if n <= available]
    if max(counts) > available:
        parser.error(f"--gpus {max(counts)}: only {available} GPU(s) visible")
    out = Path(os.environ.get("OUT") or "/tmp/gpu_scaling")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.data or "/tmp/pipeline_bench_data")
    start = time.perf_counter()
    lst = make_dataset(work, args.samples, distinct_per_category=min(32, -(-args.samples // 4)))
    print(
        f"dataset: {args.samples} samples ready in {time.perf_counter() - start:.1f} s (not counted); "
        f"{available} GPU(s) visible, {os.cpu_count()} CPU cores; {compile_bytecode()}",
        flush=True,
    )
    py = sys.executable
    common = eval_arguments(work, lst, "cupy")
    for precision in args.precisions:
        run(
            [
                py,
                "-m",
                "xmesh",
                "eval",
                *common,
                "--precision",
                precision,
                "--out",
                str(work / "warmup"),
                "--limit",
                "128",
            ],
            out / f"warmup_{precision}.txt",
            timeout=args.timeout,
        )
        shutil.rmtree(work / "warmup", ignore_errors=True)

    tables = []
    for precision in args.precisions:
        table = Table(precision)
        tables.append(table)
        runs = [(("plain" if g == 0 else f"{g} GPU"), g, []) for g in [0, *counts]]
        runs += [(f"{max(counts)} GPU {v}", max(counts), shlex.split(v)) for v in args.variant]
        for number, (name, gpus, extra) in enumerate(runs):
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(str(i) for i in range(max(1, gpus))))
            res = work / f"scaling_{precision}_{number}"
            shutil.rmtree(res, ignore_errors=True)
            cluster = [] if gpus == 0 else ["--cluster", "local-cuda"]
            seconds, ok = run(
                [py, "-m", "xmesh", "eval", *common, "--precision", precision, "--out", str(res), *cluster, *extra],
                out / f"{precision}_{number}.txt",
                timeout=args.timeout,
                env=env,
            )
            table.add(name, gpus, res, seconds, ok)
            shutil.rmtree(res, ignore_errors=True)
            if not ok:
                break  # a failed or hung run: the others would fail the same way
    print(
        f"\n{'mode':<5} {'run':<26} {'samples/s':>9} {'plain':>6} {'speedup':>7} {'eff':>5} {'cmd s':>8} "
        f"{'sooner':>7} {'shards':>6}\n{'':8}(samples/s: the pipeline's clock from the first batch; cmd s: the "
        "whole command; sooner: the plain command's seconds over this one's)"
    )
    for table in tables:
        print("\n".join(table.lines))


if __name__ == "__main__":
    main()
