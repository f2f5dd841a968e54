"""The network alone on 1, 2, ... GPUs of one host at the same time: does a GPU's network slow down
when its neighbours run too?

    python3 scripts/concurrent_bench.py --precision fp16 --batch 64 --gpus 1 4 --seconds 8

For each count N, N processes (one per GPU, ``CUDA_VISIBLE_DEVICES`` set before CuPy loads) build the
benchmark's model (``xmesh.benchmarking.Workload``, synthetic weights), warm it up, wait for each
other at a barrier, then call the whole network (``Workload.total``: images and cameras from the
host, the refined mesh back) for ``--seconds``. Each prints its samples/s; the table gives each
process's rate against the first GPU alone, and the GPUs' SM clocks and power read by ``nvidia-smi``
in the middle of the timed window. ``scripts/gpu_scaling.py`` measures the whole pipeline; this one
tells what of its per-GPU loss the host and the GPUs cause with no pipeline around the network.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WARMUP_CALLS = 3


def _worker(gpu: int, backend: str, precision: str, batch: int, seconds: float, barrier, results) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    from xmesh.benchmarking import Workload

    work = Workload(backend, batch=batch, precision=precision)
    for _ in range(WARMUP_CALLS):
        work.total()
    barrier.wait()
    calls, times = 0, []
    start = time.perf_counter()
    while (now := time.perf_counter()) - start < seconds:
        work.total()
        times.append(time.perf_counter() - now)
        calls += 1
    elapsed = time.perf_counter() - start
    results.put((gpu, calls * batch / elapsed, statistics.median(times) * 1000.0))


def gpu_clocks() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi: {exc}"
    return "; ".join(line.strip() for line in out.splitlines() if line.strip())


def run_count(count: int, args) -> list[tuple[int, float, float]]:
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(count + 1), ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(g, args.backend, args.precision, args.batch, args.seconds, barrier, results))
        for g in range(count)
    ]
    for p in procs:
        p.start()
    barrier.wait()
    time.sleep(args.seconds / 2)
    clocks = gpu_clocks()
    rows = sorted(results.get(timeout=args.seconds + 600) for _ in procs)
    for p in procs:
        p.join()
    print(f"  {count} GPU(s) at once: nvidia-smi mid-run (index, SM MHz, W, C): {clocks}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="cupy", help="cupy (default) or numpy (to try the script on a CPU)")
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    alone = None
    print(
        f"{args.precision} b={args.batch}, {args.seconds:.0f} s timed per count, {os.cpu_count()} CPU cores", flush=True
    )
    for count in args.gpus:
        rows = run_count(count, args)
        alone = alone or rows[0][1]
        total = sum(rate for _, rate, _ in rows)
        for gpu, rate, ms in rows:
            print(
                f"  GPU {gpu}: {rate:8.1f} samples/s ({100 * rate / alone:5.1f}% of GPU 0 alone), "
                f"median call {ms:.2f} ms",
                flush=True,
            )
        print(f"{count} GPU(s): {total:.1f} samples/s together, {total / alone:.2f}x GPU 0 alone", flush=True)


if __name__ == "__main__":
    main()
