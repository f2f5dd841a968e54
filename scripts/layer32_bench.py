"""The TF32 modes' deformation layers through the output-side kernel (HopperGemm.drb_layer) and the
input-side one (drb_zlayer32): a block's first layer (cin 339, float32 X in rows of 340) and a
192 -> 192 layer with its residual, the template's A1; median us per call over 5 x 3 calls (CUDA
events) at b = 1 and 16, "3xtf32" (the fp32 mode) and "tf32", and the largest difference of the two
kernels' outputs relative to the output's largest value. Device only (H100/H200):

    XMESH_SHARED=../shared python3 scripts/layer32_bench.py
"""
import cupy as cp
import numpy as np

from layer_timing import median_us, template_kernels

a1, mixing, h = template_kernels()
rng = np.random.default_rng(0)

for ops in ("3xtf32", "tf32"):
    for batch in (1, 16):
        for cin, row, with_res in ((339, 340, False), (192, 192, True)):
            full = cp.asarray(rng.standard_normal((batch, 43, 2466, row)).astype(np.float32))
            x = full[..., :cin]
            w = cp.asarray((rng.standard_normal((cin, 384)) / np.sqrt(2 * cin)).astype(np.float32))
            bias = cp.asarray((rng.standard_normal(192) * 0.1).astype(np.float32))
            res = cp.asarray(rng.standard_normal((batch, 43, 2466, 192)).astype(np.float32)) if with_res else None
            paired, stacked = h.prepare(w, ops, paired=True), h.prepare(w, ops)
            old = lambda: h.drb_layer(x, paired, cp.asarray(a1), bias, res, mixing=mixing)
            new = lambda: h.drb_zlayer32(x, stacked, bias, res, mixing)
            diff = float(cp.abs(old() - new()).max() / cp.abs(old()).max())
            print(f"{ops} b={batch} cin={cin}: output-side {median_us(old):.1f} us, input-side "
                  f"{median_us(new):.1f} us; max |difference| / max |out| {diff:.2e}", flush=True)
