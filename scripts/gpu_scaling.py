"""`xmesh eval --cluster local-cuda` on 1, 2, ... GPUs of one host: samples/s, speed-up, efficiency.

    python3 scripts/gpu_scaling.py --samples 8192 --precisions fp16 fp32 [--gpus 1 2 4]

1. writes (or reuses) the synthetic dataset of ``scripts/pipeline_bench.py`` (``make_dataset``);
2. one short plain run per precision first, so that kernel compilation stays out of the figures;
3. per precision: the plain single-process run on GPU 0, then ``--cluster local-cuda`` with
   ``CUDA_VISIBLE_DEVICES`` set to the first 1, 2, ... GPUs, each into a fresh output folder;
4. prints each run's samples/s (the pipeline's own wall time from summary.json, after every worker
   has built its model), its ratio to the plain run, the speed-up and efficiency against the 1-GPU
   cluster run, the cluster's set-up seconds and shard count, the per-worker stage timing, and
   whether every row's metrics are identical to the plain run's.
Full outputs go to ``$OUT`` (or /tmp/gpu_scaling).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dask_bench import agreement, figures, rows, run  # noqa: E402
from pipeline_bench import make_dataset  # noqa: E402


def visible_gpus() -> int:
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--precisions", nargs="+", default=["fp16", "fp32"])
    parser.add_argument("--gpus", type=int, nargs="+", default=None,
                        help="GPU counts to run (default: 1, 2, 4, ... up to the GPUs visible)")
    parser.add_argument("--data", default=None, help="dataset folder (made if missing)")
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
    print(f"dataset: {args.samples} samples in {time.perf_counter() - start:.1f} s; {available} GPU(s) visible",
          flush=True)
    py = sys.executable
    common = ["--images", str(work), "--gt", str(work / "gt"), "--list", str(lst), "--weights", "synthetic:1",
              "--backend", "cupy", "--no-progress"]
    for precision in args.precisions:
        run([py, "-m", "xmesh", "eval", *common, "--precision", precision, "--out", str(work / "warmup"),
             "--limit", "128"], out / f"warmup_{precision}.txt", timeout=args.timeout)
        shutil.rmtree(work / "warmup", ignore_errors=True)

    lines, failed = [], False
    for precision in args.precisions:
        if failed:
            break
        plain_rate, plain_rows, base_rate = None, None, None
        for gpus in [0, *counts]:   # 0: the plain run on GPU 0
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(str(i) for i in range(max(1, gpus))))
            name = "plain" if gpus == 0 else f"{gpus} GPU"
            res = work / f"scaling_{precision}_{gpus}"
            shutil.rmtree(res, ignore_errors=True)
            extra = [] if gpus == 0 else ["--cluster", "local-cuda"]
            seconds, ok = run([py, "-m", "xmesh", "eval", *common, "--precision", precision, "--out", str(res),
                               *extra], out / f"{precision}_{gpus}.txt", timeout=args.timeout, env=env)
            info = figures(res) if ok else {}
            rate = info.get("samples_per_s")
            if gpus == 0:
                plain_rate, plain_rows = rate, rows(res) if ok else None
            if gpus == 1:
                base_rate = rate
            speedup = rate / base_rate if rate and base_rate and gpus >= 1 else None
            of_plain = f"{100 * rate / plain_rate:.0f}%" if rate and plain_rate and gpus >= 1 else ""
            same = agreement(plain_rows, rows(res)) if ok and plain_rows is not None and gpus >= 1 else ""
            setup = info.get("cluster", {}).get("setup_s")
            shards = info.get("cluster", {}).get("shards", "")
            prepared = "; ".join(f"{w['loaders']} loaders on {w['cores']} cores"
                                 for w in info.get("cluster", {}).get("prepared", []))
            timing = ", ".join(f"{k} {v:.2f}" for k, v in sorted(info.get("timing", {}).items(), key=lambda kv: -kv[1])
                               if k != "wall")
            lines.append(f"{precision:<5} {name:<6} {rate or float('nan'):>9.1f} {of_plain:>6} "
                         f"{'' if speedup is None else f'{speedup:.2f}x':>7} "
                         f"{'' if speedup is None else f'{100 * speedup / gpus:.0f}%':>5} {seconds:>8.1f} "
                         f"{'' if setup is None else f'{setup:.1f}':>7} {shards:>6}  {timing}" + (f"\n{'':13}rows against plain: {same}" if same else "")
                         + (f"\n{'':13}workers: {prepared}" if prepared else ""))
            print(lines[-1], flush=True)
            if not ok:
                failed = True   # a failed or hung run: the others would fail the same way
                break
    print(f"\n{'mode':<5} {'run':<6} {'samples/s':>9} {'plain':>6} {'speedup':>7} {'eff':>5} {'cmd s':>8} {'setup':>7} "
          f"{'shards':>6}  per-worker timing (s)")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
