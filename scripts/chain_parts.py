"""What bounds the chained deformation layers (kernels/wgmma_drb16_chain.cu): the kernel timed with
parts of it taken out (its source patched before compiling: Z not made, W or x1 not copied, no
epilogue stores, no wgmmas, and combinations), fp16, b=16, 2466 vertices, the template's A1, median
us per sample over 5 x 3 calls (CUDA events), two rounds. The patched kernels compute nonsense; only
their times matter. Without the epilogue's stores the compiler may drop the wgmmas whose sums are
never read, so the variants without the epilogue say nothing about the MMAs. The patterns are those
of fe6fe62's kernel, which printed the figures of docs/PERFORMANCE.md (session 14); give that source
as the argument to time it again, from a tree of the four-layer kernel's API (prepare_chain16(weights,
biases), commits up to ef31e56; since then the kernel runs a block's five layers). Device only
(H100/H200):

    git show fe6fe62:kernels/wgmma_drb16_chain.cu > /tmp/chain.cu
    mkdir /tmp/four && git archive ef31e56 | tar -x -C /tmp/four && cd /tmp/four
    XMESH_SHARED=../shared python3 scripts/chain_parts.py /tmp/chain.cu
"""
import sys

import cupy as cp
import numpy as np

import xmesh.backends.cuda_kernels as ck
from layer_timing import median_us, template_kernels
from xmesh.backends import hopper_gemm as hg

base_src = open(sys.argv[1]).read() if len(sys.argv) > 1 else ck._read_kernel_file("wgmma_drb16_chain.cu")
P = {
 "no_z": [("zl_mix_slice_column<OPS>(base_ptr + (src - base), base_ptr + (z_smem - base), v, 32 * (ks % 2) + lane);", ";")],
 "no_wcopy": [("wg_copy(w_dst + slot * ZC_PIECE_BYTES, reinterpret_cast<const float*>(src), 16, 16);", ";"),
              ("wg_copy(w_dst + slot * ZC_PIECE_BYTES + ZL_MMA_THREADS * 16,", "if (0) wg_copy(w_dst + slot * ZC_PIECE_BYTES + ZL_MMA_THREADS * 16,")],
 "no_epilogue": [("        if (i >= ZL_HYP || n0 + v >= N) continue;", "        if (i >= 0) continue;")],
 "no_mma": [("zl_mma<OPS>(acc, zs, w1, ks > 0);", ";"), ("zl_mma<OPS>(acc, zs + 2, w1 + 2, 1);", ";"),
            ("zl_mma<OPS>(acc, xs, w0, 1);", ";"), ("zl_mma<OPS>(acc, xs + 2, w0 + 2, 1);", ";")],
 "no_x1": [("                        wg_copy(p_smem + (c / 8) * ZC_KBUF_BYTES", "                        if (0) wg_copy(p_smem + (c / 8) * ZC_KBUF_BYTES")],
}
variants = {"base": []}
for k, v in P.items(): variants[k] = v
variants["no_z_epilogue"] = P["no_z"] + P["no_epilogue"]
variants["no_z_epi_w"] = P["no_z"] + P["no_epilogue"] + P["no_wcopy"]
variants["only_mma"] = P["no_z"] + P["no_epilogue"] + P["no_wcopy"] + P["no_x1"]
variants["skeleton"] = variants["only_mma"] + P["no_mma"]
cur = {"v": "base"}
orig = ck._read_kernel_file
def patched(name):
    if name == "wgmma_drb16_chain.cu":
        s = base_src
        for a, b in variants[cur["v"]]:
            assert a in s, (cur["v"], a[:50]); s = s.replace(a, b)
        return s
    return orig(name)
ck._read_kernel_file = patched
a1, mixing, h = template_kernels()
rng = np.random.default_rng(0)
ws = [h.prepare(cp.asarray((rng.standard_normal((192, 384)) / np.sqrt(384)).astype(np.float32)), "fp16") for _ in range(4)]
bs = [cp.asarray((rng.standard_normal(192) * 0.1).astype(np.float32)) for _ in range(4)]
chain = h.prepare_chain16(ws, bs)
b = 16
x1 = hg.narrow16(cp, cp.maximum(cp.asarray(rng.standard_normal((b, 43, 2466, 192), dtype=np.float32)), 0), "fp16")
for rnd in range(2):
    line = []
    for v in variants:
        cur["v"] = v; h._kernels.clear(); ck.forget_loaded()
        line.append(f"{v} {median_us(lambda: h.drb_chain16(x1, chain, mixing)) / b:.1f}")
    print(f"round {rnd} (us/sample, b={b}): " + ", ".join(line), flush=True)
