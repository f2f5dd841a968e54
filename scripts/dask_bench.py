"""`xmesh eval` on one GPU: the plain pipeline beside the same run on a Dask cluster (`--cluster`).

    python3 scripts/dask_bench.py --samples 2048 --precisions fp16 fp32 --rounds 2 [--cluster local-cuda]

1. writes (or reuses) the synthetic dataset of ``scripts/pipeline_bench.py`` (``make_dataset``);
2. one short plain run per precision first, so that kernel compilation stays out of the figures;
3. per precision, ``--rounds`` times in turn: ``xmesh eval`` plain, then with ``--cluster``, each into
   a fresh output folder, with the same settings (default batch size, loaders and metrics);
4. prints samples/s of each run (both from summary.json: the pipeline's own wall time, after the
   model is built, and on the cluster after every worker has built its model), the whole command's
   seconds (process, cluster and model start included), the median ratio cluster / plain, and
   whether every row's metrics agree between the two.
Full outputs go to ``$OUT`` (or /tmp/dask_bench).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_bench import eval_arguments, make_dataset  # noqa: E402

from xmesh.evaluate import read_csv  # noqa: E402


def run(cmd: list[str], log: Path, timeout: int = 300, env: dict | None = None) -> tuple[float, bool]:
    """Run one command (at most ``timeout`` s: a run that hangs is reported and killed with every
    process it started, not waited for); its output goes to ``log``."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the command, its cluster's workers and their pools
        stdout, stderr = proc.communicate()
        log.write_text(f"$ {' '.join(cmd)}\n[TIMED OUT after {timeout} s]\n--- stdout\n{stdout}\n--- stderr\n{stderr}")
        print(f"TIMED OUT after {timeout} s: {' '.join(cmd)}\n{stderr[-6000:]}", flush=True)
        return float(timeout), False
    seconds = time.perf_counter() - start
    log.write_text(
        f"$ {' '.join(cmd)}\n[{seconds:.1f} s, exit {proc.returncode}]\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    )
    if proc.returncode != 0:
        print(f"FAILED ({proc.returncode}): {' '.join(cmd)}\n{stderr[-3000:]}", flush=True)
    return seconds, proc.returncode == 0


def figures(out: Path) -> dict:
    try:
        return json.loads((out / "summary.json").read_text())["run"]
    except (OSError, KeyError, ValueError):
        return {}


def rows(out: Path) -> dict:
    return {r["id"]: (r["chamfer"], tuple(r["fscore"].values())) for r in read_csv(out / "samples.csv")}


def agreement(a: dict, b: dict) -> str:
    if a.keys() != b.keys():
        return f"different samples ({len(a)} and {len(b)} rows)"
    worst = max(abs(a[k][0] - b[k][0]) / max(abs(a[k][0]), 1e-30) for k in a)
    same = sum(a[k] == b[k] for k in a)
    return f"{same}/{len(a)} rows identical, largest relative Chamfer difference {worst:.2e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--precisions", nargs="+", default=["fp16", "fp32"])
    parser.add_argument("--rounds", type=int, default=2, help="plain and cluster runs, alternated, per precision")
    parser.add_argument("--cluster", default="local-cuda", help="the --cluster SPEC to compare (default local-cuda)")
    parser.add_argument("--backend", default="cupy")
    parser.add_argument("--save-meshes", action="store_true", help="also write the meshes in every run")
    parser.add_argument("--data", default=None, help="dataset folder (made if missing)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds after which a run is reported as hung")
    args = parser.parse_args()
    out = Path(os.environ.get("OUT") or "/tmp/dask_bench")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.data or "/tmp/pipeline_bench_data")
    start = time.perf_counter()
    lst = make_dataset(work, args.samples, distinct_per_category=min(32, -(-args.samples // 4)))
    print(f"dataset: {args.samples} samples in {time.perf_counter() - start:.1f} s", flush=True)
    py = sys.executable
    common = eval_arguments(work, lst, args.backend) + (["--save-meshes"] if args.save_meshes else [])
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
                str(min(128, args.samples)),
            ],
            out / f"warmup_{precision}.txt",
            args.timeout,
        )
        shutil.rmtree(work / "warmup", ignore_errors=True)

    table, summary = [], []
    for precision in args.precisions:
        rates = {"plain": [], "cluster": []}
        last = {}
        for k in range(args.rounds):
            for name, extra in (("plain", []), ("cluster", ["--cluster", args.cluster])):
                res = work / f"res_{name}_{precision}"
                shutil.rmtree(res, ignore_errors=True)
                seconds, ok = run(
                    [py, "-m", "xmesh", "eval", *common, "--precision", precision, "--out", str(res), *extra],
                    out / f"{name}_{precision}_{k}.txt",
                    args.timeout,
                )
                info = figures(res) if ok else {}
                rate = info.get("samples_per_s")
                if rate:
                    rates[name].append(rate)
                last[name] = res
                cluster = info.get("cluster", {})
                table.append(
                    (
                        f"{name} {precision} #{k + 1}",
                        rate,
                        seconds,
                        cluster.get("setup_s"),
                        cluster.get("shards"),
                        info.get("timing", {}),
                    )
                )
                print(f"{name} {precision} #{k + 1}: {rate} samples/s, {seconds:.1f} s in all", flush=True)
        ratio = (
            statistics.median(rates["cluster"]) / statistics.median(rates["plain"])
            if rates["plain"] and rates["cluster"]
            else None
        )
        agree = agreement(rows(last["plain"]), rows(last["cluster"])) if len(last) == 2 else "not compared"
        summary.append((precision, rates, ratio, agree))

    print(f"\n{'run':<22} {'samples/s':>10} {'command s':>10} {'setup s':>8} {'shards':>7}  timing (s)")
    for name, rate, seconds, setup, shards, timing in table:
        stages = ", ".join(f"{k} {v:.2f}" for k, v in sorted(timing.items(), key=lambda kv: -kv[1]) if k != "wall")
        print(
            f"{name:<22} {rate if rate is not None else float('nan'):>10.1f} {seconds:>10.1f} "
            f"{'' if setup is None else f'{setup:.1f}':>8} {'' if shards is None else shards:>7}  {stages}"
        )
    print()
    for precision, rates, ratio, agree in summary:
        shown = "n/a" if ratio is None else f"{100 * ratio:.1f}%"
        print(
            f"{precision}: plain {[round(r, 1) for r in rates['plain']]} samples/s, --cluster {args.cluster} "
            f"{[round(r, 1) for r in rates['cluster']]} samples/s; cluster / plain (medians) = {shown}; {agree}"
        )


if __name__ == "__main__":
    main()
