"""Time the 16-bit chained deformation kernel (kernels/wgmma_drb16_chain.cu) alone on the model's shapes.

A deformation block's five wide layers and the score layer's products (``HopperGemm.drb_chain16`` with
``score_weight``, as the model runs it): X (B, 43, 2466, 339) in the mode's 16 bits, the template's
A1, random weights. Prints milliseconds per call (median of --repeat, CUDA events, after warm-up),
per sample, and TFLOP/s of useful work (the 43 x 43 mixing counted as the dense product it stands for,
as ``xmesh.benchmarking.flop_counts`` counts it: 99.0 GFLOP a sample) against the 16-bit wgmma peak.

It also prints the design's two floors at the device's clock: the wgmma work its tiles run (192 rows a
tile for the 172 hypotheses it holds) at the 16-bit peak, and the shared-memory traffic its tiles move
(``shared_bytes_per_tile``) at 128 bytes a clock per multiprocessor.

``--support`` swaps the template's A1 for one that takes the producer's Z = A1 X apart: ``identity``
keeps its loads and stores with one fmaf a row (43 instead of 367 a column), ``zero`` leaves only
its stores (the compiler drops loads whose values nothing uses). The products are then those of
another model; only the time means something.

Usage (H100/H200): python3 scripts/chain_bench.py [--batch 64] [--operands fp16] [--repeat 20]
                   [--support real identity zero]
Under Nsight Compute, ``--repeat 1`` launches the kernel twice (warm-up, then the timed call).
"""

from __future__ import annotations

import argparse

import numpy as np

WGMMA16_PEAK_TFLOPS = 989.0  # H100 SXM, dense
VERTICES, HYPOTHESES, CIN, WIDE = 2466, 43, 339, 192
TILE_VERTICES, TILE_ROWS, MMA_ROWS, K_SLICE = 4, 176, 192, 32  # kernels/drb16_tile.cuh, wgmma_drb16_chain.cu
SHARED_BYTES_PER_CLOCK = 128  # per multiprocessor


def chain_flop(batch: int, cin: int = CIN) -> float:
    """Useful FLOP of one call as ``xmesh.benchmarking.flop_counts`` counts a deformation block: each
    layer's rows x cin x 384 products and its mixing as A1 applied to the 192 outputs (43 x 43 x 192 a
    vertex), the score layer's 192 x 2 products and 43 x 43 mixing of one column."""
    rows = batch * HYPOTHESES * VERTICES
    wide = rows * (cin + 4 * WIDE) * 2 * WIDE + 5 * HYPOTHESES * HYPOTHESES * batch * VERTICES * WIDE
    score = rows * WIDE * 2 + HYPOTHESES * HYPOTHESES * batch * VERTICES
    return 2.0 * (wide + score)


def tile_slices(cin: int = CIN) -> int:
    """K slices of 32 columns a tile runs: ceil(cin / 32) for lc1, six for each 192-wide layer."""
    return -(-cin // K_SLICE) + 4 * (WIDE // K_SLICE)


def shared_bytes_per_tile(cin: int = CIN) -> dict[str, int]:
    """Shared-memory traffic of one tile (4 vertices) of the chain with the score layer, by what moves it.
    A warp's access of fewer than 128 bytes still takes a whole cycle of the shared memory's 128 bytes,
    so the producer's 16-bit accesses (one 64-byte row piece a warp) count as 128 bytes each."""
    slices, first = tile_slices(cin), -(-cin // K_SLICE)
    warpgroups, out_bytes = MMA_ROWS // 64, HYPOTHESES * TILE_VERTICES * WIDE * 2
    return {
        # each MMA warpgroup reads its 64 rows of Z and of the input, and all of W1's and W0's slice
        "wgmma A": slices * warpgroups * 2 * 64 * K_SLICE * 2,
        "wgmma B": slices * warpgroups * 2 * WIDE * K_SLICE * 2,
        "W copies in": slices * 2 * WIDE * K_SLICE * 2,
        "X copies in": first * TILE_ROWS * K_SLICE * 2,
        # four warps (a vertex each) load 43 rows and store 43 rows of Z a slice
        "producer": slices * TILE_VERTICES * 2 * HYPOTHESES * SHARED_BYTES_PER_CLOCK,
        # x1..x4 stored, x1 and x3 read again as lc3's and lc5's residuals
        "epilogues": (4 + 2) * out_bytes,
    }


def floors_ms(batch: int, sms: int, clock_hz: float, cin: int = CIN) -> tuple[float, float]:
    """(tensor floor, shared-memory floor) of one call in ms: each multiprocessor's share of the tiles at
    the 16-bit wgmma peak (the padded rows' work counted) and at 128 bytes of shared memory a clock."""
    tiles = batch * -(-VERTICES // TILE_VERTICES) / sms
    wgmma_flop = tile_slices(cin) * 2 * 2.0 * MMA_ROWS * WIDE * K_SLICE
    flop_per_clock = WGMMA16_PEAK_TFLOPS * 1e12 / (132 * 1.83e9)  # the H100 SXM's peak per SM and clock
    tensor = tiles * wgmma_flop / flop_per_clock / clock_hz
    shared = tiles * sum(shared_bytes_per_tile(cin).values()) / SHARED_BYTES_PER_CLOCK / clock_hz
    return tensor * 1e3, shared * 1e3


def support(kind: str, real):
    """The A1 a run mixes with: the template's, the identity or zeros (``--support``)."""
    return {"real": real, "identity": np.eye(HYPOTHESES), "zero": np.zeros((HYPOTHESES, HYPOTHESES))}[kind]


def main():
    import cupy as cp

    from xmesh.backends.cupy_backend import CupyBackend
    from xmesh.backends.cupy_backend.hopper import activation_dtype, mixing_source
    from xmesh.template_gen import template_dict

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--operands", default="fp16", choices=["fp16", "bf16"])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument(
        "--support",
        nargs="+",
        default=["real"],
        choices=["real", "identity", "zero"],
        help="A1 for the producer's Z: the template's, or one that takes its work apart",
    )
    args = parser.parse_args()
    hopper = CupyBackend().hopper
    if hopper is None:
        raise SystemExit("chain_bench: the chained kernel needs compute capability 9.0 (H100/H200)")
    a1 = template_dict()["sample_cheb_dense"][1]
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

    props = cp.cuda.runtime.getDeviceProperties(0)
    name, sms, clock_hz = props["name"].decode(), props["multiProcessorCount"], props["clockRate"] * 1e3
    tensor, shared = floors_ms(args.batch, sms, clock_hz)
    print(
        f"{name}: floors at {clock_hz / 1e9:.2f} GHz: tensor {tensor:.3f} ms, shared memory {shared:.3f} ms "
        f"({sum(shared_bytes_per_tile().values()) / tile_slices() / 1e3:.1f} KB a K slice)",
        flush=True,
    )
    for kind in args.support:
        mixing = mixing_source(support(kind, a1))

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
        print(
            f"{name}: chain+score {args.operands} b={args.batch} support {kind}: {ms:.3f} ms a call "
            f"(min {min(times):.3f}), {ms / args.batch * 1000:.1f} us a sample, {tflops:.1f} TFLOP/s "
            f"({tflops / WGMMA16_PEAK_TFLOPS:.0%} of {WGMMA16_PEAK_TFLOPS:.0f}); x{ms / tensor:.2f} the tensor "
            f"floor, x{ms / shared:.2f} the shared-memory floor",
            flush=True,
        )


if __name__ == "__main__":
    main()
