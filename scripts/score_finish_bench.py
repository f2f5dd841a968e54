"""Time a deformation block's end kernel, ``drb_score_finish``, through the CuPy backend's launcher.

From each hypothesis row's two score products (``parts`` planes of (B, 43, N) float2: one after the
16-bit chain, two after the fp32 mode's last layer, one per 96-column group), it mixes the scores
with A1, takes the softmax over the 43 hypotheses and moves the vertices. Random inputs, the model's
N = 2466; prints microseconds per call (median of 50, CUDA events around the launch) for b = 1 and 64
and parts = 1 and 2, and with ``--save DIR`` writes each case's output there (``finish_B_PARTS.npy``),
so that two trees' outputs can be compared bit for bit.

Usage (GPU): python3 scripts/score_finish_bench.py [--save DIR]
"""

from __future__ import annotations

import argparse
import os

import numpy as np

VERTICES, HYPOTHESES = 2466, 43


def main():
    import cupy as cp

    from xmesh.backends.cupy_backend import CupyBackend

    parser = argparse.ArgumentParser()
    parser.add_argument("--save", help="write each case's moved vertices to this folder")
    args = parser.parse_args()
    backend = CupyBackend(precision="fp32")
    rng = np.random.default_rng(5)
    a1 = cp.asarray((rng.standard_normal((HYPOTHESES, HYPOTHESES)) / 6).astype(np.float32))
    bias = cp.asarray(np.float32([0.3]))
    offsets = cp.asarray((rng.standard_normal((HYPOTHESES, 3)) * 0.01).astype(np.float32))
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    for b in (1, 64):
        for parts in (1, 2):
            planes = cp.asarray(rng.standard_normal((parts, b, HYPOTHESES, VERTICES, 2)).astype(np.float32))
            centers = cp.asarray(rng.standard_normal((b, VERTICES, 3)).astype(np.float32))

            def call():
                return backend._move_vertices(
                    "drb_score_finish",
                    (planes, np.int32(parts), np.int64(b * HYPOTHESES * VERTICES)),
                    a1,
                    bias,
                    centers,
                    offsets,
                )

            out = call()
            cp.cuda.Device().synchronize()
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            times = []
            for _ in range(50):
                start.record()
                call()
                stop.record()
                stop.synchronize()
                times.append(cp.cuda.get_elapsed_time(start, stop))
            if args.save:
                os.makedirs(args.save, exist_ok=True)
                np.save(os.path.join(args.save, f"finish_{b}_{parts}.npy"), out.get())
            print(
                f"{name}: drb_score_finish b={b} parts={parts}: {np.median(times) * 1e3:.1f} us a call "
                f"(min {min(times) * 1e3:.1f})",
                flush=True,
            )


if __name__ == "__main__":
    main()
