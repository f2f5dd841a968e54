"""The local graph convolution's training passes on the GPU, part by part, at a batch's shapes: the
forward and the input gradient in the lent layer kernel (at 192 inputs also the forward with a skip
connection and the input gradient carried through the ReLU before), the backward's one-pass mask and mixing, and
the weights' gradient X^T [dZ | A1^T dZ] (K = every hypothesis row) in the lent 3xTF32 GEMM
(``xmesh.model.products.matmul``: on Hopper wgmma_wgrad.cu's kernel, timed beside its other build and
tc_gemm.cu's gemm_t3x_n128; K split) against cuBLAS's float32 SGEMM, all against float64.

    python3 scripts/weight_gradient_bench.py --batch 32 --repeat 5

Prints ms a call (CUDA events, median) and the relative error (Frobenius) against float64 products.
"""

from __future__ import annotations

import argparse

import numpy as np

from xmesh.backends import get_backend
from xmesh.backends.cupy_backend import hopper
from xmesh.model import epilogues_cupy, products

HYPOTHESES, VERTICES, COUT = 43, 2466, 192


def timed(cp, fn, repeat: int) -> tuple[float, object]:
    out = fn()
    times = []
    for _ in range(repeat):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        out = fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return float(np.median(times)), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    backend = get_backend("cupy")
    cp = backend.cupy
    rng = cp.random.default_rng(0)
    a1 = cp.asarray(np.where(np.random.default_rng(1).random((HYPOTHESES,) * 2) < 0.2, 0.3, 0.0).astype(np.float32))
    print(f"batch {args.batch}: {args.batch * HYPOTHESES * VERTICES} hypothesis rows")
    for cin in (339, 192):
        layer(backend, rng, a1, args, cin)
        cp.get_default_memory_pool().free_all_blocks()


def layer(backend, rng, a1, args, cin: int) -> None:
    """Time one layer's parts at ``cin`` inputs."""
    cp = backend.cupy
    shape = (args.batch, HYPOTHESES, VERTICES)
    rows_of = cp.zeros(shape + (-(-cin // 4) * 4,), dtype=cp.float32)  # padded as the projection's
    x = rows_of[..., :cin]
    x[...] = cp.maximum(rng.standard_normal(shape + (cin,), dtype=cp.float32), 0)
    w0, w1 = (rng.standard_normal((cin, COUT), dtype=cp.float32) / np.float32(np.sqrt(cin)) for _ in range(2))
    bias = cp.zeros(COUT, dtype=cp.float32)
    dout = rng.standard_normal(shape + (COUT,), dtype=cp.float32) * 1e-3
    ms, relu_out = timed(cp, lambda: products.deformation_layer(x, w0, w1, bias, a1), args.repeat)
    print(f"cin {cin}: forward, the layer kernel {ms:.2f} ms")
    if cin == COUT:  # a skip connection's layer: the residual added in the pass, the ReLU output kept
        res = dout * 1e3
        ms, _ = timed(
            cp, lambda: products.deformation_layer(x, w0, w1, bias, a1, residual=res, keep_activation=True), args.repeat
        )
        print(f"cin {cin}: forward with a skip connection, its ReLU output kept {ms:.2f} ms")
        del res
        ms, _ = timed(cp, lambda: products.layer_input_gradient(dout, w0, w1, a1, x), args.repeat)
        print(f"cin {cin}: input gradient carried through the ReLU before (x its output) {ms:.2f} ms")
    ms, (dy, _) = timed(cp, lambda: epilogues_cupy.relu_gradient_mixed(dout, relu_out, a1), args.repeat)
    print(f"cin {cin}: mask, mixing and bias sums in one pass {ms:.2f} ms")
    dz = dy[..., :COUT]
    ms, _ = timed(
        cp,
        lambda: products.deformation_layer(dz, w0.T, w1.T, None, a1, relu=False, support_transposed=True),
        args.repeat,
    )
    print(f"cin {cin}: input gradient, the layer kernel without the ReLU {ms:.2f} ms")
    flat, rows = x.reshape(-1, cin), dy.reshape(-1, 2 * COUT)
    exact = flat.astype(cp.float64).T @ rows.astype(cp.float64)

    def error(ours):
        return float(cp.linalg.norm(ours - exact) / cp.linalg.norm(exact))

    ms, ours = timed(cp, lambda: flat.T @ rows, args.repeat)
    print(f"cin {cin}: weight gradient, cuBLAS SGEMM {ms:.2f} ms, error {error(ours):.2e}")
    ms, ours = timed(cp, lambda: products.matmul(flat.T, rows), args.repeat)
    print(f"cin {cin}: weight gradient, the lent 3xTF32 product (A transposed) {ms:.2f} ms, error {error(ours):.2e}")
    ms, ours = timed(cp, lambda: backend.gemm_transposed_a(flat, rows, wgmma=False), args.repeat)
    print(f"cin {cin}: weight gradient, tc_gemm.cu's gemm_t3x_n128 {ms:.2f} ms, error {error(ours):.2e}")
    if backend.hopper is not None:
        for bn in hopper.WEIGHT_GRADIENT.widths:
            ms, ours = timed(cp, lambda bn=bn: backend.hopper.transposed_product(flat, rows, bn), args.repeat)
            print(f"cin {cin}: weight gradient, wg_wgrad_n{bn} {ms:.2f} ms, error {error(ours):.2e}")


if __name__ == "__main__":
    main()
