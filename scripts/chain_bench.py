"""A deformation block's five wide layers in the 16-bit modes: five one-layer launches
(HopperGemm.drb_zlayer; the first, 339 -> 192, with 96-column tiles) against the chained kernel
(drb_chain16), which must give the same bits. X as the local projection writes it (rows of 344 16-bit
values, 339 used). Median us per sample over 5 x 3 calls (CUDA events), 2466 vertices, the
template's A1. Device only (H100/H200):

    XMESH_SHARED=../shared python3 scripts/chain_bench.py
"""
import cupy as cp
import numpy as np

from layer_timing import median_us, template_kernels
from xmesh.backends import hopper_gemm as hg

a1, mixing, h = template_kernels()
rng = np.random.default_rng(0)
CIN, LDX = 339, 344

for ops in ("fp16", "bf16"):
    shapes = [(CIN, 384)] + [(192, 384)] * 4
    weights = [h.prepare(cp.asarray((rng.standard_normal(s) / np.sqrt(s[1])).astype(np.float32)), ops) for s in shapes]
    biases = [cp.asarray((rng.standard_normal(192) * 0.1).astype(np.float32)) for _ in range(5)]
    chain = h.prepare_chain16(weights[0], weights[1:], biases)
    for batch in (1, 16, 64):
        x = hg.narrow16(cp, cp.random.default_rng(batch).random((batch, 43, 2466, LDX), dtype=cp.float32), ops)[..., :CIN]

        def single():
            x1 = h.drb_zlayer(x, weights[0], biases[0], None, mixing)
            x2 = h.drb_zlayer(x1, weights[1], biases[1], None, mixing)
            x3 = h.drb_zlayer(x2, weights[2], biases[2], x1, mixing)
            x4 = h.drb_zlayer(x3, weights[3], biases[3], None, mixing)
            return h.drb_zlayer(x4, weights[4], biases[4], x3, mixing)

        chained = lambda: h.drb_chain16(x, chain, mixing)
        same = bool((single().view(cp.uint16) == chained().view(cp.uint16)).all())
        print(f"{ops} b={batch}: five layers {median_us(single) / batch:.1f} us/sample, chained "
              f"{median_us(chained) / batch:.1f} us/sample; same bits: {same}", flush=True)
        del x
