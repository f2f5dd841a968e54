"""The H100/H200 tensor cores' rate for the training layer kernels' 3xTF32 warpgroup MMAs (A in
registers, B in shared memory), alone and with the work that feeds A (kernels/wgmma_rate.cu): the
unit floor the local graph convolutions' timings are measured against.

    python3 scripts/wgmma_rate.py --iters 20000

One block a multiprocessor, of 1-3 warpgroups, each running ``--iters`` K slices of 32 with a wait and
a float32 sum after each slice, as the layer kernels do. ``fixed``: the same A fragments every slice;
``split``: each slice's A split into TF32 parts in registers; ``loaded``: and read from global memory
first, one slice ahead (the held layer kernel's loop), ``loaded2`` two slices ahead; ``shared``: read
from a slice in shared memory instead, one slice ahead; ``streamed``: from a ring of three slots in
shared memory that a producer warp fills through the Tensor Memory Accelerator. A streamed from a
buffer that stays in L2 (13.6 MB) or one that does not (326 MB: a 192-wide layer input at batch 4).
Prints ms and TFLOP/s: of TF32 (every product) and of float32 (a third of them, the useful rate).
"""

from __future__ import annotations

import argparse

import numpy as np

KERNELS = [  # name, N, warpgroups
    ("wg_rate_n64_fixed", 64, (1, 2, 3)),
    ("wg_rate_n64_split", 64, (3,)),
    ("wg_rate_n64_loaded", 64, (3,)),
    ("wg_rate_n64_loaded2", 64, (3,)),
    ("wg_rate_n64_shared", 64, (3,)),
    ("wg_rate_n64_streamed", 64, (3,)),
    ("wg_rate_n96_fixed", 96, (1, 2)),
    ("wg_rate_n96_split", 96, (2,)),
    ("wg_rate_n96_loaded", 96, (2,)),
    ("wg_rate_n128_fixed", 128, (1, 2)),
]
COLUMNS = 192  # WGR_COLUMNS
L2_ROWS = 43 * 2466 * 4 // 24  # 13.6 MB of A rows
DRAM_ROWS = 43 * 2466 * 4  # 326 MB
SMEM = 120 * 1024  # enough to keep a second block off a multiprocessor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=20000, help="K slices a warpgroup (even)")
    args = parser.parse_args()
    import cupy as cp

    from xmesh.backends import tensor_map
    from xmesh.backends.cuda_kernels import get_arch_function

    iters = args.iters + args.iters % 2
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    x = cp.random.default_rng(0).standard_normal((DRAM_ROWS, COLUMNS), dtype=cp.float32)
    out = cp.empty(sms * 384, dtype=cp.float32)
    print(f"{sms} multiprocessors, {iters} K slices a warpgroup")
    print(f"{'kernel':22s} {'warpgroups':>10s} {'A from':>8s} {'ms':>8s} {'TF32 TFLOP/s':>13s} {'float32':>8s}")
    for name, n, groups in KERNELS:
        kernel = get_arch_function("wgmma_rate.cu", name, "sm_90a", ("-std=c++17",))
        kernel.max_dynamic_shared_size_bytes = SMEM
        streams = "loaded" in name or "streamed" in name
        sources = [("L2", L2_ROWS), ("DRAM", DRAM_ROWS)] if streams else [("-", 0)]
        for warpgroups in groups:
            for where, rows in sources:
                threads = 128 * warpgroups + (32 if "streamed" in name else 0)
                if "shared" in name or "streamed" in name:  # A through a tensor map, (192, rows, 1)
                    a = tensor_map.tiled(
                        x.data.ptr,
                        (COLUMNS, max(rows, 192), 1),
                        (COLUMNS * 4, COLUMNS * 4 * max(rows, 192)),
                        (32, 192, 1),
                        4,
                    )
                else:
                    a = x

                def run(count, rows=rows, threads=threads, kernel=kernel, a=a):
                    kernel((sms,), (threads,), (np.int32(count), a, np.int64(max(rows, 1)), out), shared_mem=SMEM)

                run(200)
                start, stop = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                run(iters)
                stop.record()
                stop.synchronize()
                ms = cp.cuda.get_elapsed_time(start, stop)
                flops = sms * warpgroups * iters * 4 * 3 * 64 * n * 8 * 2
                print(
                    f"{name:22s} {warpgroups:10d} {where:>8s} {ms:8.2f} {flops / ms / 1e9:13.0f} "
                    f"{flops / 3 / ms / 1e9:8.0f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
