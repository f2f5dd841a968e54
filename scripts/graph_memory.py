"""What a Reconstructor's CUDA graphs hold and gain, by batch size (GPU).

For each batch size: the call eagerly (``graphs=False``) and from its captured graphs, median
milliseconds of ``Workload.total`` (host images in, the mesh back on the host), and the bytes the
four graphs keep (``Reconstructor.graph_bytes``) in all and per sample, beside the bytes the CuPy pool
held after the eager calls. Every size is captured here; a Reconstructor captures sizes up to its
``graph_max_batch`` while the graphs of all sizes fit ``graph_memory_share`` of the device's memory.

Usage: python3 scripts/graph_memory.py --precision fp16 --batch-sizes 1 16 64 [--repeat 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def median_ms(cp, work, graphs: bool, repeat: int) -> float:
    """The median time of ``work``'s whole reconstruction, eager or through CUDA graphs."""
    work.model.graphs = graphs
    for _ in range(3):  # eager, then (with graphs) capture and replay
        work.total()
    times = []
    for _ in range(repeat):
        cp.cuda.Device().synchronize()
        start = time.perf_counter()
        work.total()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def main():
    import cupy as cp

    from xmesh.benchmarking import Workload

    parser = argparse.ArgumentParser()
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    pool = cp.get_default_memory_pool()
    for batch in args.batch_sizes:
        work = Workload("cupy", batch=batch, precision=args.precision)
        model = work.model
        model.graph_memory_share, model.graph_max_batch = 1.0, batch  # measure every size
        eager = median_ms(cp, work, False, args.repeat)
        held = work.backend.held_bytes()
        graphed = median_ms(cp, work, True, args.repeat)
        held_by_graphs = model.graph_bytes().get(batch)
        total = work.backend.memory_bytes()[1]
        if held_by_graphs is None:
            print(f"{args.precision} b={batch}: eager {eager:.2f} ms; not captured (no room on the device)", flush=True)
        else:
            print(
                f"{args.precision} b={batch}: eager {eager:.2f} ms, graphs {graphed:.2f} ms ({eager / graphed:.2f}x); "
                f"graphs hold {held_by_graphs / 1e9:.3f} GB ({held_by_graphs / batch / 1e9:.3f} a sample, "
                f"{held_by_graphs / total:.1%} of the device), the eager pool {held / 1e9:.3f} GB",
                flush=True,
            )
        del work, model
        pool.free_all_blocks()


if __name__ == "__main__":
    main()
