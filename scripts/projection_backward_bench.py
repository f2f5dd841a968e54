"""The local projection's training pair on the training step's own hypotheses: the one-pass kernels
against the taps and the pooling in their own launches (float4 or grouped backward), forward and
backward (a GPU is needed).

    python3 scripts/projection_backward_bench.py --batch-sizes 1 32 --repeat 10

For each batch size (the golden training sample repeated, synthetic weights) and each deformation
block's hypothesis points and maps from stage 2's forward: the mean time of ``--repeat`` forwards and
of as many backwards, each after an untimed one, the device synchronised around them, and the largest
relative difference of any result (the features, the points' and the three maps' gradients) from the
first variant's. Variants: ``one pass`` (local_projection_cupy), then the taps apart with the
``float4`` backward and ``grouped C+ wW`` for each ``--variants`` pair C:W (maps of at least C channels
grouped, a window of W floats of shared memory).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--variants", nargs="+", default=["64:8192"])
    args = parser.parse_args()

    import cupy

    from xmesh.benchmarking import default_template
    from xmesh.io.weights import synthetic_weights
    from xmesh.model import bilinear_cupy, local_projection_train
    from xmesh.train import graph_step, stage2
    from xmesh.train.bench import default_sample
    from xmesh.train.trainer import Trainer

    template, _ = default_template()
    sample, _ = default_sample(template)
    trainer = Trainer(2, synthetic_weights(1), template, "cupy", graphs=False)
    xp = trainer.device.xp
    flags = [
        (local_projection_train, "ONE_PASS_ON_CUPY"),
        (bilinear_cupy, "GROUPED_BACKWARD"),
        (bilinear_cupy, "GROUP_MIN_CHANNELS"),
        (bilinear_cupy, "GROUP_WINDOW_FLOATS"),
    ]
    defaults = [getattr(module, name) for module, name in flags]
    variants = [("one pass", (True, True, 64, 8192)), ("taps, float4", (False, False, 64, 8192))] + [
        (f"taps, grouped {c}+ w{w}", (False, True, int(c), int(w))) for c, w in (v.split(":") for v in args.variants)
    ]

    def timed(fn):
        fn()
        cupy.cuda.Device().synchronize()
        start = time.perf_counter()
        for _ in range(args.repeat):
            out = fn()
        cupy.cuda.Device().synchronize()
        return (time.perf_counter() - start) / args.repeat * 1e3, out

    try:
        for batch in args.batch_sizes:
            key = (batch, sample.images.shape[0], graph_step.padded_size(len(sample.labels)))
            inputs = graph_step.StepGraph(trainer.device, trainer.weights, trainer.template, *key)
            inputs.load([sample] * batch, np.random.default_rng(0), 0.0)
            fwd = stage2.forward(xp, inputs.weights, inputs.template, inputs.images, inputs.transforms, inputs.starts)
            for block, cache in enumerate(c.projection for c in fwd.drb_caches):
                centers = inputs.starts if block == 0 else fwd.blocks[0]
                vertices = centers.shape[1]
                points = xp.reshape(centers[:, None] + inputs.template.offsets[None, :, None], (batch, -1, 3))
                dfeats = xp.asarray(
                    np.random.default_rng(1).standard_normal((batch, points.shape[1], 339)).astype(np.float32)
                )
                reference = None
                for label, values in variants:
                    for (module, name), value in zip(flags, values, strict=True):
                        setattr(module, name, value)
                    forward_ms, (feats, projection) = timed(
                        lambda: local_projection_train.local_projection_forward(
                            xp, points, cache.maps, cache.tf, groups=vertices
                        )
                    )
                    backward_ms, (dpoints, dmaps) = timed(
                        lambda projection=projection: local_projection_train.local_projection_backward(
                            xp, dfeats, projection, groups=vertices
                        )
                    )
                    result = [feats.get(), dpoints.get()] + [m.get() for m in dmaps]
                    reference = reference or result
                    difference = max(
                        float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
                        for a, b in zip(result, reference, strict=True)
                    )
                    print(
                        f"batch {batch} block {block + 1} {label:24s} forward {forward_ms:8.2f} ms "
                        f"backward {backward_ms:8.2f} ms (difference {difference:.1e})"
                    )
                    del feats, projection, dpoints, dmaps
            del inputs, fwd
            cupy.get_default_memory_pool().free_all_blocks()
    finally:
        for (module, name), value in zip(flags, defaults, strict=True):
            setattr(module, name, value)


if __name__ == "__main__":
    main()
