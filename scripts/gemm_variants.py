"""Build kernels/tc_gemm.cu with several compile-time settings and time each on the DRB's GEMM shapes.

Usage (GPU): python3 scripts/gemm_variants.py
For each variant (-D options: K slice XG_BK, ring depth XG_STAGES, XG_CVT_SPLIT = cvt.rna.tf32
instead of the integer split) and kernel (3xTF32, TF32), prints the median time (CUDA events,
10 runs after warm-up, two random input sets alternated), TFLOP/s and the relative error against
a float64 product of the same operands.
"""
from __future__ import annotations

import numpy as np

VARIANTS = {
    "cvt split, BK16 x3": ("-DXG_CVT_SPLIT",),
    "int split, BK16 x3": (),
    "int split, BK32 x3": ("-DXG_BK=32",),
    "int split, BK32 x4": ("-DXG_BK=32", "-DXG_STAGES=4"),
    "int split, BK16 x4": ("-DXG_STAGES=4",),
}
SHAPES = [(106038, 192, 384, "v"), (106038, 339, 384, "s"), (16 * 106038, 192, 384, "v")]


def main():
    import cupy as cp

    from xmesh.backends.cuda_kernels import kernel_source

    source = kernel_source("tc_gemm.cu")
    rng = cp.random.default_rng(0)
    data = {}
    for m, k, n, _ in SHAPES:
        data[(m, k, n)] = [(rng.standard_normal((m, k), dtype=cp.float32),
                            rng.standard_normal((k, n), dtype=cp.float32) / np.float32(np.sqrt(k))) for _ in range(2)]
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    print(f"{'variant':22s} {'kernel':14s} {'M x K x N':>18s} {'ms':>8s} {'TF/s':>7s} {'rel err':>9s}")
    for label, options in VARIANTS.items():
        bk = 32 if "-DXG_BK=32" in options else 16
        stages = 4 if "-DXG_STAGES=4" in options else 3
        module = cp.RawModule(code=source, options=("-std=c++17",) + options)
        for passes in (3, 1):
            for m, k, n, copy in SHAPES:
                fn = module.get_function(f"gemm_{passes}x_n128_{copy}")
                smem = stages * (128 * (bk + 4) + bk * (128 + 8)) * 4
                fn.max_dynamic_shared_size_bytes = smem
                out = cp.empty((m, n), cp.float32)
                tiles = -(-m // 128) * -(-n // 128)

                def call(i):
                    a, b = data[(m, k, n)][i]
                    fn((tiles, 1), (256,), (a, np.int64(k), b, np.int64(n), out, np.int64(n), np.int32(m),
                                            np.int32(n), np.int32(k), np.uint64(0), np.int32(0), np.int32(k),
                                            np.int64(0)), shared_mem=smem)

                for i in range(3):
                    call(i % 2)
                times = []
                for i in range(10):
                    start.record()
                    call(i % 2)
                    stop.record()
                    stop.synchronize()
                    times.append(cp.cuda.get_elapsed_time(start, stop))
                call(0)
                a, b = data[(m, k, n)][0]
                rows = slice(0, 20000)
                ref = a[rows].astype(cp.float64) @ b.astype(cp.float64)
                err = float(cp.linalg.norm(out[rows] - ref) / cp.linalg.norm(ref))
                ms = float(np.median(times))
                print(f"{label:22s} {f'{passes}x {copy}':14s} {f'{m}x{k}x{n}':>18s} {ms:8.3f} "
                      f"{2 * m * k * n / ms / 1e9:7.1f} {err:9.2e}", flush=True)


if __name__ == "__main__":
    main()
