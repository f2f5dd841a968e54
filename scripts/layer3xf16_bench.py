"""Time the fp32 mode's deformation layer kernel alone (kernels/wgmma_drb32h.cu through
HopperGemm.drb_layer_3xf16) on the model's shapes: a block's first layer (339 inputs, rows of 340, no
residual), a 192-wide layer with its residual, and the last wide layer with the score layer's products
(``_score``), over the template's A1, at each batch size.

Usage (GPU, compute capability 9.0): python3 scripts/layer3xf16_bench.py [--batch-sizes 1 64] [--repeat 20]
    [--cases first hidden last_score] [--save DIR] [--compare DIR]
Prints ms a call (median of --repeat, CUDA events, after warm-up) and useful TFLOP/s (each product
counted once, as docs/PERFORMANCE.md counts them). Inputs come from a seeded generator, so two trees
see the same ones: ``--save DIR`` keeps the outputs of the batches up to 4, ``--compare DIR`` reports
whether this tree's are the same bit for bit.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

VERTICES = 2466
CASES = (("first", 339, False, False), ("hidden", 192, True, False), ("last_score", 192, True, True))


def median_ms(cp, fn, repeat):
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


def operands(cp, b, cin, with_residual, with_score, seed):
    """X (b, 43, N, cin) in rows a multiple of 4 floats apart, [W0 | W1], bias, residual, score W."""
    rng = cp.random.default_rng(seed)
    rows = rng.standard_normal((b, 43, VERTICES, -(-cin // 4) * 4), dtype=cp.float32)[..., :cin]
    w = rng.standard_normal((cin, 384), dtype=cp.float32) / np.float32(np.sqrt(2 * cin))
    bias = rng.standard_normal(192, dtype=cp.float32) * np.float32(0.1)
    res = rng.standard_normal((b, 43, VERTICES, 192), dtype=cp.float32) if with_residual else None
    score = rng.standard_normal((192, 2), dtype=cp.float32) / np.float32(14) if with_score else None
    return rows, w, bias, res, score


def main():
    import cupy as cp

    from xmesh.backends.cupy_backend import CupyBackend
    from xmesh.backends.cupy_backend.hopper import mixing_source
    from xmesh.template_gen import template_dict

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--cases", nargs="+", choices=[c[0] for c in CASES], default=[c[0] for c in CASES])
    parser.add_argument("--save", type=Path)
    parser.add_argument("--compare", type=Path)
    args = parser.parse_args()
    hopper = CupyBackend().hopper
    if hopper is None:
        raise SystemExit("layer3xf16_bench: the layer needs compute capability 9.0 (H100, H200)")
    mixing = mixing_source(template_dict()["sample_cheb_dense"][1])
    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)
    print(f"{'layer':12s} {'B x 43 x N x cin':>20s} {'ms a call':>10s} {'TFLOP/s':>8s}  bits", flush=True)
    for b in args.batch_sizes:
        for label, cin, with_residual, with_score in (c for c in CASES if c[0] in args.cases):
            x, w, bias, res, score = operands(cp, b, cin, with_residual, with_score, seed=1000 * b + cin)
            halves = hopper.prepare_halves(w)

            def layer():
                return hopper.drb_layer_3xf16(x, halves, bias, res, mixing, score_weight=score)

            ms = median_ms(cp, layer, args.repeat)
            flop = 2.0 * b * 43 * VERTICES * cin * 384 + (2.0 * b * 43 * VERTICES * 192 * 2 if with_score else 0.0)
            name, bits = f"{label}_b{b}", ""
            if b <= 4 and (args.save or args.compare):
                out = layer().get()
                if args.save:
                    np.save(args.save / f"{name}.npy", out)
                if args.compare:
                    ref = np.load(args.compare / f"{name}.npy")
                    same = ref.shape == out.shape and np.array_equal(ref.view(np.uint32), out.view(np.uint32))
                    bits = "same" if same else f"DIFFER (max abs {np.nanmax(np.abs(ref - out)):.3e})"
            shape = f"{b}x43x{VERTICES}x{cin}"
            print(f"{label:12s} {shape:>20s} {ms:10.3f} {flop / ms / 1e9:8.1f}  {bits}", flush=True)
            x = w = res = halves = None
            cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
