"""The dataset pipeline against the network alone, in one process tree on one machine.

    python3 scripts/pipeline_bench.py --samples 2048 --precisions fp16 fp32 --batch-size 64 [--old DIR]

1. writes a synthetic dataset in the official layout: 128 distinct objects (``write_dataset``, a few
   per process), repeated under new item ids (symbolic links) up to ``--samples``; kept for later runs;
2. for each precision: ``xmesh bench`` (the network alone, ``total`` stage, samples/s), then
   ``xmesh eval`` over the whole list with the default settings, again with ``--save-meshes``, with
   ``--cluster SPEC`` if given (Dask), then ``xmesh reconstruct --list`` (first precision only);
3. with ``--old DIR`` (an older tree of xmesh), its ``xmesh eval`` on the same data, for a before/after;
4. prints one table: samples/s of each run, its ratio to the bench figure, and each run's timing line.
Full outputs go to ``$OUT`` (or /tmp/pipeline_bench).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from xmesh.synthetic.dataset import DEFAULT_CATEGORIES, write_dataset


def _write_part(args) -> list[tuple[str, str]]:
    root, synset, first, count = args
    written = write_dataset(root, n_per_category=count, categories=(synset,), seed=7, first_index=first)
    return [(str(i), str(root)) for i in written["ids"]]


def make_dataset(root: Path, samples: int, distinct_per_category: int = 32) -> Path:
    """The official layout with ``samples`` entries: ``distinct_per_category`` objects of each category
    (written once, a few objects per process), listed again and again under new item ids (symbolic
    links); returns the list file, kept for later calls with the same counts."""
    lst = root / f"bench_list_{samples}_{distinct_per_category}.txt"
    if lst.exists():
        return lst
    chunk = 4
    parts = [
        (root / f"part{synset}_{first}", synset, first, min(chunk, distinct_per_category - first))
        for synset in DEFAULT_CATEGORIES
        for first in range(0, distinct_per_category, chunk)
    ]
    with ProcessPoolExecutor(min(len(parts), os.cpu_count() or 1)) as pool:
        ids = [pair for part in pool.map(_write_part, parts) for pair in part]
    render = root / "ShapeNetRendering"
    (root / "gt").mkdir(parents=True, exist_ok=True)
    lines = []
    for k in range(samples):
        base, part = ids[k % len(ids)]
        synset, item, view = base[:-4].split("_")
        new_item = f"{item}r{k // len(ids)}"
        target = render / synset / new_item
        if not target.is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to((Path(part) / "ShapeNetRendering" / synset / item).resolve())
        sid = f"{synset}_{new_item}_{view}.dat"
        gt = root / "gt" / sid
        if not gt.is_symlink():
            gt.symlink_to((Path(part) / "gt" / base).resolve())
        lines.append(sid)
    lst.write_text("".join(f"{s}\n" for s in lines))
    return lst


def eval_arguments(work: Path, lst: Path, backend: str) -> list[str]:
    """`xmesh eval`'s arguments for the synthetic dataset in ``work`` (its list ``lst``), the benchmarks'
    weights and ``backend``, without a progress bar."""
    return [
        "--images",
        str(work),
        "--gt",
        str(work / "gt"),
        "--list",
        str(lst),
        "--weights",
        "synthetic:1",
        "--backend",
        backend,
        "--no-progress",
    ]


def run(cmd: list[str], log: Path, cwd: str | None = None, env: dict | None = None, timeout: int = 900) -> str:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
    log.write_text(
        f"$ {' '.join(cmd)}\n[{time.perf_counter() - start:.1f} s, exit {proc.returncode}]\n"
        f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )
    if proc.returncode != 0:
        print(f"FAILED ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}", flush=True)
    return proc.stdout + proc.stderr


def bench_rate(text: str) -> float | None:
    try:
        data = json.loads(text[text.index("{") : text.rindex("}") + 1])
    except ValueError:
        return None
    for entry in data.get("results", []):
        if "samples_per_s" in entry:
            return float(entry["samples_per_s"])
    return None


def eval_rate(out: Path) -> tuple[float | None, dict]:
    try:
        run_info = json.loads((out / "summary.json").read_text())["run"]
    except (OSError, KeyError, ValueError):
        return None, {}
    return run_info.get("samples_per_s"), run_info.get("timing", {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--precisions", nargs="+", default=["fp16", "fp32"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--backend", default="cupy")
    parser.add_argument("--old", default=None, help="an older xmesh tree to run `xmesh eval` from, for a before figure")
    parser.add_argument("--data", default=None, help="dataset folder (made if missing)")
    parser.add_argument(
        "--cluster",
        default=None,
        metavar="SPEC",
        help="also run `xmesh eval --cluster SPEC` (e.g. local-cuda) beside the plain run",
    )
    args = parser.parse_args()
    out = Path(os.environ.get("OUT") or "/tmp/pipeline_bench")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.data or "/tmp/pipeline_bench_data")
    start = time.perf_counter()
    lst = make_dataset(work, args.samples)
    print(f"dataset: {args.samples} samples in {time.perf_counter() - start:.1f} s", flush=True)
    py = sys.executable
    common = eval_arguments(work, lst, args.backend)
    table = []
    for precision in args.precisions:  # first use compiles (GPU kernels, numba): keep that out of the figures
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
                str(2 * args.batch_size),
                "--save-meshes",
            ],
            out / f"warmup_{precision}.txt",
        )
        shutil.rmtree(work / "warmup", ignore_errors=True)
    for k, precision in enumerate(args.precisions):
        text = run(
            [
                py,
                "-m",
                "xmesh",
                "bench",
                "--backend",
                args.backend,
                "--precision",
                precision,
                "--batch-sizes",
                str(args.batch_size),
                "--repeat",
                "5",
                "--stages",
                "total",
                "--json",
            ],
            out / f"bench_{precision}.txt",
        )
        bench = bench_rate(text)
        table.append((f"xmesh bench {precision} b={args.batch_size}", bench, None, ""))
        runs = [("eval", []), ("eval --save-meshes", ["--save-meshes"])]
        if args.cluster:
            runs.append((f"eval --cluster {args.cluster}", ["--cluster", args.cluster]))
        for name, extra in runs:
            res = work / f"res_{precision}_{name.replace(' ', '_').replace('-', '').replace(':', '')}"
            shutil.rmtree(res, ignore_errors=True)
            text = run(
                [py, "-m", "xmesh", "eval", *common, "--precision", precision, "--out", str(res), *extra],
                out / f"{name.replace(' ', '').replace('-', '_').replace(':', '')}_{precision}.txt",
            )
            rate, timing = eval_rate(res)
            line = next((ln for ln in text.splitlines() if ln.startswith("xmesh eval: time")), "")
            if extra[:1] == ["--cluster"] and rate:
                plain = next((r for n, r, _, _ in table if n == f"xmesh eval {precision}"), None)
                line = f"{line} (Dask over the plain run: {100 * rate / plain:.0f}%)" if plain else line
            table.append((f"xmesh {name} {precision}", rate, rate / bench if rate and bench else None, line))
        if k == 0:
            res = work / f"rec_{precision}"
            shutil.rmtree(res, ignore_errors=True)
            text = run(
                [
                    py,
                    "-m",
                    "xmesh",
                    "reconstruct",
                    "--list",
                    str(lst),
                    "--images",
                    str(work),
                    "--weights",
                    "synthetic:1",
                    "--backend",
                    args.backend,
                    "--precision",
                    precision,
                    "--out",
                    str(res),
                    "--no-progress",
                ],
                out / f"reconstruct_list_{precision}.txt",
            )
            m = re.search(r"([0-9.]+) samples/s", text)
            rate = float(m.group(1)) if m else None
            line = next((ln for ln in text.splitlines() if ln.startswith("xmesh reconstruct: time")), "")
            table.append(
                (f"xmesh reconstruct --list {precision}", rate, rate / bench if rate and bench else None, line)
            )
        if args.old:
            res = work / f"old_{precision}"
            shutil.rmtree(res, ignore_errors=True)
            env = dict(
                os.environ,
                PYTHONPATH=os.pathsep.join([str(Path(args.old).resolve()), os.environ.get("PYTHONPATH", "")]),
            )
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
                    str(res),
                    "--batch-size",
                    str(args.batch_size),
                    "--workers",
                    "8",
                ],
                out / f"old_eval_{precision}.txt",
                cwd=args.old,
                env=env,
            )
            rate, _ = eval_rate(res)
            table.append(
                (
                    f"old xmesh eval {precision} (b={args.batch_size}, 8 threads)",
                    rate,
                    rate / bench if rate and bench else None,
                    "",
                )
            )
    print(f"\n{'run':<44} {'samples/s':>10} {'of bench':>9}")
    for name, rate, ratio, _ in table:
        print(
            f"{name:<44} {rate if rate is not None else float('nan'):>10.1f} "
            f"{'' if ratio is None else f'{100 * ratio:.0f}%':>9}"
        )
    for name, _, _, line in table:
        if line:
            print(f"{name}: {line}")


if __name__ == "__main__":
    main()
