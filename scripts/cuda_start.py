"""CUDA's start in a fresh process: ``cuInit`` by GPUs visible and processes at once, and how soon a
model is ready with the driver started first in a thread (``xmesh.backends.cuda_driver``) or not.

    python3 scripts/cuda_start.py [--rounds 4] [--precision fp16]

1. ``cuInit`` (through ctypes) in a new process with ``CUDA_VISIBLE_DEVICES`` naming GPU 0 alone, then
   every GPU; each alone and in as many processes at once as there are GPUs (each with its own GPU
   alone, or every GPU with its own first);
2. ``--rounds`` times in turn, a new process on GPU 0 that builds the model (synthetic weights) and
   loads its kernels, as ``xmesh eval`` does, with ``start_driver()`` called first ("early") or not
   ("late"): the seconds from the process's start to the model ready. A first build fills the
   kernel caches and is not counted.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])

BUILD = """
import sys
if sys.argv[1] == "early":
    from xmesh.backends.cuda_driver import start_driver
    start_driver()
from xmesh.pipeline.startup import process_age
from xmesh.reconstruct import ModelSpec
model = ModelSpec.of("synthetic:1", backend="cupy", precision=sys.argv[2]).build()
model.backend.load_kernels()
print(f"{process_age():.3f}")
"""


def _cuinit() -> None:
    start = time.perf_counter()
    ctypes.CDLL("libcuda.so.1").cuInit(0)
    print(f"{time.perf_counter() - start:.3f}", flush=True)


def _env(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])), **extra)


def cuinit_table(gpus: int) -> None:
    every = [str(i) for i in range(gpus)]
    for alone in (True, False):
        for count in sorted({1, gpus}):
            seen = [every[i] if alone else ",".join(every[i:] + every[:i]) for i in range(count)]
            start = time.perf_counter()
            procs = [
                subprocess.Popen(
                    [sys.executable, __file__, "--cuinit"],
                    env=_env(CUDA_VISIBLE_DEVICES=s),
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for s in seen
            ]
            times = [float(p.communicate()[0]) for p in procs]
            wall = time.perf_counter() - start
            what = "its own GPU alone" if alone else f"all {gpus} GPUs"
            print(
                f"cuInit, {what} visible, {count} process(es) at once: "
                + ", ".join(f"{t:.2f}" for t in times)
                + f" s (all done {wall:.2f} s after the first began)",
                flush=True,
            )


def build_seconds(mode: str, precision: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", BUILD, mode, precision],
        env=_env(CUDA_VISIBLE_DEVICES="0"),
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--cuinit", action="store_true", help=argparse.SUPPRESS)  # one child's cuInit
    args = parser.parse_args()
    if args.cuinit:
        _cuinit()
        return
    import cupy

    cuinit_table(cupy.cuda.runtime.getDeviceCount())
    build_seconds("late", args.precision)  # the kernel caches filled
    seen: dict[str, list[float]] = {"late": [], "early": []}
    for _ in range(args.rounds):
        for mode in seen:
            seen[mode].append(build_seconds(mode, args.precision))
    for mode, times in seen.items():
        print(
            f"model ready ({mode}): "
            + ", ".join(f"{t:.2f}" for t in times)
            + f" s after the process's start (median {statistics.median(times):.2f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
