"""One loader process's CPU cost a sample: ``xmesh.pipeline.loading.load_sample`` (three views decoded
and prepared as 8-bit, the cameras, the ground truth) over the benchmark's synthetic dataset.

    python3 scripts/loader_cost.py [--samples 256] [--rounds 3] [--data /tmp/loader_cost]

Prints per round the milliseconds a sample, split into images and cameras (``decode``) and ground
truth (``gt``). A loader's cost sets how many loader processes keep a GPU fed: at 1,000 samples/s a
GPU needs 1000 x (ms a sample) / 1000 cores of them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipeline_bench import make_dataset  # noqa: E402

from xmesh.dataset import list_samples  # noqa: E402
from xmesh.pipeline.loading import load_sample  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data", default="/tmp/loader_cost")
    args = parser.parse_args()
    root = Path(args.data)
    listing = make_dataset(root, args.samples, distinct_per_category=8)
    items = [(sample, paths) for sample, paths, _ in list_samples(listing, root, root / "gt")]
    for sample, paths in items[:16]:  # files into the page cache
        load_sample(sample, paths)
    for number in range(args.rounds):
        start = time.perf_counter()
        loaded = [load_sample(sample, paths) for sample, paths in items]
        ms = (time.perf_counter() - start) * 1000.0 / len(items)
        decode = statistics.fmean(x[3] for x in loaded) * 1000.0
        gt = statistics.fmean(x[4] for x in loaded) * 1000.0
        print(f"round {number + 1}: {ms:.2f} ms a sample (decode {decode:.2f}, gt {gt:.2f}) over {len(items)} samples")


if __name__ == "__main__":
    main()
