"""A deformation block's four 192-wide layers in the 16-bit modes: four one-layer launches
(HopperGemm.drb_zlayer) against the chained kernel (drb_chain16), which must give the same bits.
Median us per sample over 5 x 3 calls (CUDA events), 2466 vertices, the template's A1. Device only
(H100/H200):

    XMESH_SHARED=../shared python3 scripts/chain_bench.py
"""
import cupy as cp
import numpy as np

from layer_timing import median_us, template_kernels
from xmesh.backends import hopper_gemm as hg

a1, mixing, h = template_kernels()
rng = np.random.default_rng(0)

for ops in ("fp16", "bf16"):
    weights = [h.prepare(cp.asarray((rng.standard_normal((192, 384)) / np.sqrt(384)).astype(np.float32)), ops)
               for _ in range(4)]
    biases = [cp.asarray((rng.standard_normal(192) * 0.1).astype(np.float32)) for _ in range(4)]
    chain = h.prepare_chain16(weights, biases)
    for batch in (1, 16, 64):
        x1 = hg.narrow16(cp, cp.maximum(cp.asarray(rng.standard_normal((batch, 43, 2466, 192), dtype=np.float32)), 0), ops)

        def single():
            x2 = h.drb_zlayer(x1, weights[0], biases[0], None, mixing)
            x3 = h.drb_zlayer(x2, weights[1], biases[1], x1, mixing)
            x4 = h.drb_zlayer(x3, weights[2], biases[2], None, mixing)
            return h.drb_zlayer(x4, weights[3], biases[3], x3, mixing)

        chained = lambda: h.drb_chain16(x1, chain, mixing)
        same = bool((single().view(cp.uint16) == chained().view(cp.uint16)).all())
        print(f"{ops} b={batch}: four layers {median_us(single) / batch:.1f} us/sample, chained "
              f"{median_us(chained) / batch:.1f} us/sample; same bits: {same}", flush=True)
        del x1
