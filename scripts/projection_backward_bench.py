"""The local projection's backward on the training step's own hypotheses, the float4 kernel against the
grouped one in the windows and map sets given (a GPU is needed).

    python3 scripts/projection_backward_bench.py --batch-sizes 1 32 --repeat 10

For each batch size (the golden training sample repeated, synthetic weights), each deformation block's
projection cache from stage 2's forward: the mean time of ``--repeat`` backwards after one untimed,
with the device synchronised around them, and the largest relative difference of any result (the
points' and the three maps' gradients) from the float4 kernel's. Variants: ``float4`` (no grouping),
then ``grouped C+ wW`` for each ``--variants`` pair C:W (maps of at least C channels grouped, a window of
W floats of shared memory).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--variants", nargs="+", default=["64:8192", "64:16384", "32:16384", "16:32768"])
    args = parser.parse_args()

    import cupy

    from xmesh.benchmarking import default_template
    from xmesh.io.weights import synthetic_weights
    from xmesh.model import bilinear_cupy
    from xmesh.model.local_projection_train import local_projection_backward
    from xmesh.train import graph_step, stage2
    from xmesh.train.bench import default_sample
    from xmesh.train.trainer import Trainer

    template, _ = default_template()
    sample, _ = default_sample(template)
    trainer = Trainer(2, synthetic_weights(1), template, "cupy", graphs=False)
    xp = trainer.device.xp
    defaults = (bilinear_cupy.GROUPED_BACKWARD, bilinear_cupy.GROUP_MIN_CHANNELS, bilinear_cupy.GROUP_WINDOW_FLOATS)
    variants = [("float4", False, 64, 8192)] + [
        (f"grouped {c}+ w{w}", True, int(c), int(w)) for c, w in (v.split(":") for v in args.variants)
    ]
    try:
        for batch in args.batch_sizes:
            key = (batch, sample.images.shape[0], graph_step.padded_size(len(sample.labels)))
            inputs = graph_step.StepGraph(trainer.device, trainer.weights, trainer.template, *key)
            inputs.load([sample] * batch, np.random.default_rng(0), 0.0)
            fwd = stage2.forward(xp, inputs.weights, inputs.template, inputs.images, inputs.transforms, inputs.starts)
            for block, cache in enumerate(c.projection for c in fwd.drb_caches):
                n = cache.views[0].h.shape[1]
                vertices = n // inputs.template.offsets.shape[0]
                dfeats = xp.asarray(np.random.default_rng(1).standard_normal((batch, n, 339)).astype(np.float32))
                reference = None
                for label, grouped, channels, window in variants:
                    bilinear_cupy.GROUPED_BACKWARD = grouped
                    bilinear_cupy.GROUP_MIN_CHANNELS, bilinear_cupy.GROUP_WINDOW_FLOATS = channels, window
                    local_projection_backward(xp, dfeats, cache, groups=vertices)
                    cupy.cuda.Device().synchronize()
                    start = time.perf_counter()
                    for _ in range(args.repeat):
                        dpoints, dmaps = local_projection_backward(xp, dfeats, cache, groups=vertices)
                    cupy.cuda.Device().synchronize()
                    ms = (time.perf_counter() - start) / args.repeat * 1e3
                    result = [dpoints.get()] + [m.get() for m in dmaps]
                    reference = reference or result
                    difference = max(
                        float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
                        for a, b in zip(result, reference, strict=True)
                    )
                    print(f"batch {batch} block {block + 1} {label:22s} {ms:8.2f} ms (difference {difference:.1e})")
            del inputs, fwd
            cupy.get_default_memory_pool().free_all_blocks()
    finally:
        bilinear_cupy.GROUPED_BACKWARD, bilinear_cupy.GROUP_MIN_CHANNELS, bilinear_cupy.GROUP_WINDOW_FLOATS = defaults


if __name__ == "__main__":
    main()
