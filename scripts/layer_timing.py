"""What the deformation-layer timing scripts share (device only): the golden template's A1 with its
mixing source and the Hopper kernels, and the median time of a call by CUDA events."""
import os

import cupy as cp
import numpy as np

from xmesh.backends import hopper_gemm as hg
from xmesh.io.template import load_template


def template_kernels():
    """(A1 of the golden template as float32, hopper_gemm.mixing_source of it, a HopperGemm);
    the template is read from $XMESH_SHARED/golden/template.dat."""
    template = load_template(os.path.join(os.environ["XMESH_SHARED"], "golden", "template.dat"))
    a1 = np.asarray(template.sample_cheb[1], dtype=np.float32)
    return a1, hg.mixing_source(a1), hg.HopperGemm(cp)


def median_us(fn, rounds: int = 5, calls: int = 3) -> float:
    """Median over ``rounds`` of the mean us of ``calls`` back-to-back calls of fn (after one warm-up call)."""
    fn()
    cp.cuda.Device().synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(rounds):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / calls * 1000)
    return float(np.median(times))
