"""The TF32 modes' deformation layers through the output-side kernel (HopperGemm.drb_layer), the
input-side one (drb_zlayer32) and, for the fp32 mode, the three-float16-products one (drb_hlayer32, what
the model runs since session 22): a block's first layer (cin 339, float32 X in rows of 340) and a
192 -> 192 layer with its residual, the template's A1; median us per call over 5 x 3 calls (CUDA
events) at b = 1 and 16, "3xtf32" (the fp32 mode) and "tf32", and each kernel's largest difference
from the output-side one relative to the output's largest value. Device only (H100/H200):

    XMESH_SHARED=../shared python3 scripts/layer32_bench.py [3xtf32] [tf32]
"""
import sys

import cupy as cp
import numpy as np

from layer_timing import median_us, template_kernels

a1, mixing, h = template_kernels()
rng = np.random.default_rng(0)

for ops in sys.argv[1:] or ("3xtf32", "tf32"):
    for batch in (1, 16):
        for cin, row, with_res in ((339, 340, False), (192, 192, True)):
            full = cp.asarray(rng.standard_normal((batch, 43, 2466, row)).astype(np.float32))
            x = full[..., :cin]
            w_host = (rng.standard_normal((cin, 384)) / np.sqrt(2 * cin)).astype(np.float32)
            w = cp.asarray(w_host)
            bias = cp.asarray((rng.standard_normal(192) * 0.1).astype(np.float32))
            res = cp.asarray(rng.standard_normal((batch, 43, 2466, 192)).astype(np.float32)) if with_res else None
            paired, stacked = h.prepare(w, ops, paired=True), h.prepare(w, ops)
            kernels = {"output-side": lambda: h.drb_layer(x, paired, cp.asarray(a1), bias, res, mixing=mixing),
                       "input-side": lambda: h.drb_zlayer32(x, stacked, bias, res, mixing)}
            if ops == "3xtf32":
                halves = h.prepare_halves(w)
                kernels["3xf16"] = lambda: h.drb_hlayer32(x, halves, bias, res, mixing)
            base = kernels["output-side"]()
            scale = float(cp.abs(base).max())
            parts = []
            for name, fn in kernels.items():
                diff = float(cp.abs(fn() - base).max()) / scale
                parts.append(f"{name} {median_us(fn):.1f} us ({diff:.1e})")
            print(f"{ops} b={batch} cin={cin}: " + ", ".join(parts), flush=True)
