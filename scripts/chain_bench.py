"""Time the 16-bit chained deformation kernel (kernels/wgmma_drb16_chain.cu) alone on the model's shapes.

A deformation block's five wide layers and the score layer's products (``HopperGemm.drb_chain16`` with
``score_weight``, as the model runs it): X (B, 43, 2466, 339) in the mode's 16 bits, the template's
A1, random weights. Prints milliseconds per call (median of --repeat, CUDA events, after warm-up),
per sample, and TFLOP/s of useful work (the 43 x 43 mixing counted as the dense product it stands for,
as ``xmesh.benchmarking.flop_counts`` counts it: 99.0 GFLOP a sample) against the 16-bit wgmma peak.

Usage (H100/H200): python3 scripts/chain_bench.py [--batch 64] [--operands fp16] [--repeat 20]
Under Nsight Compute, ``--repeat 1`` launches the kernel twice (warm-up, then the timed call).
"""
from __future__ import annotations

import argparse

import numpy as np

WGMMA16_PEAK_TFLOPS = 989.0   # H100 SXM, dense
VERTICES, HYPOTHESES, CIN, WIDE = 2466, 43, 339, 192


def chain_flop(batch: int, cin: int = CIN) -> float:
    """Useful FLOP of one call as ``xmesh.benchmarking.flop_counts`` counts a deformation block: each
    layer's rows x cin x 384 products and its mixing as A1 applied to the 192 outputs (43 x 43 x 192 a
    vertex), the score layer's 192 x 2 products and 43 x 43 mixing of one column."""
    rows = batch * HYPOTHESES * VERTICES
    wide = rows * (cin + 4 * WIDE) * 2 * WIDE + 5 * HYPOTHESES * HYPOTHESES * batch * VERTICES * WIDE
    score = rows * WIDE * 2 + HYPOTHESES * HYPOTHESES * batch * VERTICES
    return 2.0 * (wide + score)


def main():
    import cupy as cp

    from xmesh.backends.cupy_backend import CupyBackend
    from xmesh.backends.cupy_backend.hopper import activation_dtype, mixing_source
    from xmesh.template_gen import template_dict

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--operands", default="fp16", choices=["fp16", "bf16"])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    hopper = CupyBackend().hopper
    if hopper is None:
        raise SystemExit("chain_bench: the chained kernel needs compute capability 9.0 (H100/H200)")
    a1 = template_dict()["sample_cheb_dense"][1]
    mixing = mixing_source(a1)
    rng = np.random.default_rng(3)
    act = activation_dtype(cp, args.operands)
    ldx = (CIN + 7) // 8 * 8
    x = cp.asarray(rng.uniform(0, 1, (args.batch, HYPOTHESES, VERTICES, ldx)).astype(np.float32)).astype(act)[..., :CIN]
    ws = [rng.standard_normal((CIN, 2 * WIDE)) / np.sqrt(2 * CIN)]
    ws += [rng.standard_normal((WIDE, 2 * WIDE)) / np.sqrt(2 * WIDE) for _ in range(4)]
    weights = [hopper.prepare(cp.asarray(w, dtype=cp.float32), args.operands) for w in ws]
    biases = [cp.asarray(rng.standard_normal(WIDE) * 0.1, dtype=cp.float32) for _ in range(5)]
    chain = hopper.prepare_chain16(weights[0], weights[1:], biases)
    score = cp.asarray(rng.standard_normal((WIDE, 2)) / np.sqrt(WIDE), dtype=cp.float32)

    def call():
        return hopper.drb_chain16(x, chain, mixing, score_weight=score)

    call()
    cp.cuda.Device().synchronize()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(args.repeat):
        start.record()
        call()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    ms = float(np.median(times))
    tflops = chain_flop(args.batch) / ms / 1e9
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"{name}: chain+score {args.operands} b={args.batch}: {ms:.3f} ms a call (min {min(times):.3f}), "
          f"{ms / args.batch * 1000:.1f} us a sample, {tflops:.1f} TFLOP/s ({tflops / WGMMA16_PEAK_TFLOPS:.0%} of "
          f"{WGMMA16_PEAK_TFLOPS:.0f})", flush=True)


if __name__ == "__main__":
    main()
