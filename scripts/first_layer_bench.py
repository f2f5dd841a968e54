"""A block's first deformation layer (cin 339, 16-bit X in rows of 344, the template's A1) through the
output-side kernel (HopperGemm.drb_layer, _h16) and the input-side 96-column kernel (drb_zlayer, _n96):
median us per sample over 5 x 3 calls (CUDA events), fp16 and bf16 at b=16 and 64. Device only (H100/H200):

    XMESH_SHARED=../shared python3 scripts/first_layer_bench.py
"""
import cupy as cp
import numpy as np

from layer_timing import median_us, template_kernels
from xmesh.backends import hopper_gemm as hg

a1, mixing, h = template_kernels()
rng = np.random.default_rng(0)
for ops in ("fp16", "bf16"):
    for batch in (16, 64):
        full = hg.narrow16(cp, cp.asarray(rng.standard_normal((batch, 43, 2466, 344)).astype(np.float32)), ops)
        x = full[..., :339]
        w = cp.asarray((rng.standard_normal((339, 384)) / 20).astype(np.float32))
        paired, stacked = h.prepare(w, ops, paired=True), h.prepare(w, ops)
        bias = cp.zeros(192, cp.float32)
        runs = {"output_side": lambda: h.drb_layer(x, paired, cp.asarray(a1), bias, None, mixing=mixing, out16=True),
                "input_side_n96": lambda: h.drb_zlayer(x, stacked, bias, None, mixing)}
        line = []
        for name, fn in runs.items():
            line.append(f"{name} {median_us(fn) / batch:.1f}")
        print(f"{ops} b={batch} first layer us/sample: " + ", ".join(line), flush=True)
