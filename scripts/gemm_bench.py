"""Time xmesh's tensor-core GEMMs (3xTF32 and TF32) against cuBLAS (float32 and TF32) on the model's shapes.

Columns: the wgmma kernel (kernels/wgmma_gemm.cu, compute capability 9.0 only; its weight prepared
beforehand, as the model does once per layer), the mma.sync kernel (kernels/tc_gemm.cu), cuBLAS.

Usage (GPU): python3 scripts/gemm_bench.py [--repeat 20]
Prints, per shape, milliseconds (median of --repeat, CUDA events, after warm-up) and TFLOP/s.
Inputs are random (never zeros) and rotated between two sets so repeated runs do not time the cache.
"""

from __future__ import annotations

import argparse

import numpy as np

SHAPES = {  # name: (M, K, N)
    "DRB layer 1, b=1 (X[W0|W1])": (106038, 339, 384),
    "DRB layer 2-5, b=1": (106038, 192, 384),
    "DRB layer 2-5, b=16": (16 * 106038, 192, 384),
    "graph block 3 (stage 1), b=1": (2466, 192, 384),
    "CNN conv 2 (224x224, 16->16), 3 views": (3 * 224 * 224, 144, 16),
    "CNN conv 13 (14x14, 256->256), 3 views": (3 * 14 * 14, 2304, 256),
}


def median_ms(cp, fn, repeat):
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(3):
        fn(0)
    for i in range(repeat):
        start.record()
        fn(i % 2)
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


def main():
    import cupy as cp
    from cupy._core import _routines_linalg as linalg

    from xmesh.backends.cupy_backend import CupyBackend

    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    gb = CupyBackend()
    hopper, gb.hopper = gb.hopper, None  # gb.gemm: always the mma.sync kernel
    rows = []
    for name, (m, k, n) in SHAPES.items():
        rng = cp.random.default_rng(m + k + n)
        sets = [
            (rng.standard_normal((m, k), dtype=cp.float32), rng.standard_normal((k, n), dtype=cp.float32))
            for _ in range(2)
        ]
        out = cp.empty((m, n), cp.float32)
        flop = 2.0 * m * k * n
        result = {}
        if hopper is not None:
            for operands, label in (("3xtf32", "wgmma 3xTF32"), ("tf32", "wgmma TF32")):
                ready = [(a, hopper.prepare(b, operands)) for a, b in sets]
                result[label] = median_ms(cp, lambda i: hopper(*ready[i], out), args.repeat)
        result["mma.sync 3xTF32"] = median_ms(cp, lambda i: gb.gemm(*sets[i], out=out, passes=3), args.repeat)
        result["mma.sync TF32"] = median_ms(cp, lambda i: gb.gemm(*sets[i], out=out, passes=1), args.repeat)
        for label, ctype in (("cuBLAS fp32", linalg.COMPUTE_TYPE_DEFAULT), ("cuBLAS TF32", linalg.COMPUTE_TYPE_TF32)):
            old = linalg.get_compute_type(np.float32)
            linalg.set_compute_type(np.float32, ctype)
            try:
                result[label] = median_ms(cp, lambda i: cp.matmul(*sets[i], out=out), args.repeat)
            finally:
                linalg.set_compute_type(np.float32, old)
        rows.append((name, (m, k, n), result, flop))
        sets = out = None  # free the operands before the next shape's
        cp.get_default_memory_pool().free_all_blocks()
    print(f"{'shape':42s} {'M x K x N':>22s} " + " ".join(f"{c:>20s}" for c in rows[0][2]), flush=True)
    for name, (m, k, n), result, flop in rows:
        cells = " ".join(f"{v:8.3f} ms {flop / v / 1e9:6.1f} TF" for v in result.values())
        print(f"{name:42s} {f'{m}x{k}x{n}':>22s} {cells}")
    if hopper is not None:
        deformation_layers(cp, gb, hopper, args.repeat)


def deformation_layers(cp, gb, hopper, repeat):
    """A whole 192-wide deformation block layer (product, 43 x 43 mixing over the template's A1, bias,
    ReLU, residual): the fused Hopper kernel in each operand mode against the GEMM + drb_mix_epilogue
    path of other GPUs (3xTF32)."""
    from types import SimpleNamespace

    from xmesh.backends.cupy_backend.hopper import OPERANDS, mixing_source
    from xmesh.template_gen import template_dict

    a1_host = template_dict()["sample_cheb_dense"][1]  # the model's support (367 of 1849 nonzero)
    a1, mixing = cp.asarray(a1_host), mixing_source(a1_host)
    heads = [f"fused {mode}" for mode in OPERANDS] + ["mma.sync + mix"]
    print(
        f"\n{'deformation layer (cin -> 192, residual)':42s} {'B x 43 x N x cin':>22s} "
        + " ".join(f"{h:>20s}" for h in heads)
    )
    for b, cin in ((1, 339), (1, 192), (16, 192)):
        rng = cp.random.default_rng(b + cin)
        layer = SimpleNamespace(
            weight=rng.standard_normal((cin, 384), dtype=cp.float32) / 14,
            bias=rng.standard_normal(192, dtype=cp.float32),
            cout=192,
            weight0=None,
            relu=True,
        )
        xs = [rng.standard_normal((b, 43, 2466, cin), dtype=cp.float32) for _ in range(2)]
        res = rng.standard_normal((b, 43, 2466, 192), dtype=cp.float32)
        flop = 2.0 * b * 43 * 2466 * cin * 384
        times = []
        for mode in OPERANDS:
            weight = hopper.prepare(layer.weight, mode, paired=True)
            times.append(
                median_ms(cp, lambda i: hopper.drb_layer(xs[i], weight, a1, layer.bias, res, mixing=mixing), repeat)
            )
        gb.hopper = None
        times.append(median_ms(cp, lambda i: gb.op_local_gconv(layer, xs[i], a1, residual=res), repeat))
        print(
            f"{'':42s} {f'{b}x43x2466x{cin}':>22s} "
            + " ".join(f"{f'{ms:8.3f} ms {flop / ms / 1e9:6.1f} TF':>20s}" for ms in times),
            flush=True,
        )
        xs = res = None
        cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
