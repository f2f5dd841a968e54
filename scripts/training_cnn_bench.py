"""The training CNN's forward and backward (stage 2's convolutions 1-8) with cuDNN's convolutions and
with the im2col route, GPU time per batch of images (a GPU is needed).

    python3 scripts/training_cnn_bench.py --images 3 12 96 --repeat 5

For each count of 224 x 224 images (a batch's views: 3 per sample), synthetic weights: the mean GPU
time (CUDA events) of ``--repeat`` forwards (``xmesh.model.cnn.cnn_forward``) and of as many backwards
from the three maps' gradients, after one untimed each, first with the convolutions cuDNN takes lent
(its float32 multiply-adds, whatever ``plan.training_conv_on_cudnn`` says), then with none lent (every
convolution an im2col product); then the algorithms cuDNN's heuristics gave each shape.
"""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, nargs="+", default=[3, 12, 96])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    import array_api_compat.cupy as xp
    import cupy

    from xmesh.backends import get_backend, plan
    from xmesh.io.weights import synthetic_weights
    from xmesh.model import architecture as arch
    from xmesh.model import cnn
    from xmesh.train import stage2

    backend = get_backend("cupy")
    weights = {name: cupy.asarray(value) for name, value in synthetic_weights(1).items()}
    layers = stage2.cnn_layers(weights)

    def timed(fn):
        fn()
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(args.repeat):
            fn()
        stop.record()
        stop.synchronize()
        return cupy.cuda.get_elapsed_time(start, stop) / args.repeat

    rule, plan.TRAINING_CUDNN_MIN_IMAGES = plan.TRAINING_CUDNN_MIN_IMAGES, 1
    try:
        for count in args.images:
            images = cupy.random.default_rng(0).random((count, 224, 224, 3), dtype=cupy.float32)
            row = []
            for lent in (True, False):
                before = None if lent else cnn.lend_convolution(None, None, None)
                maps, caches = cnn.cnn_forward(xp, layers, images, arch.STAGE2_TAPS)
                dmaps = [cupy.full_like(m, 1e-3) for m in maps]
                row.append(
                    (
                        timed(lambda: cnn.cnn_forward(xp, layers, images, arch.STAGE2_TAPS)),
                        timed(lambda caches=caches, dmaps=dmaps: cnn.cnn_backward(xp, dmaps, caches, arch.STAGE2_TAPS)),
                    )
                )
                if before is not None:
                    cnn.lend_convolution(*before)
            print(
                f"{count:3d} images: cuDNN forward {row[0][0]:7.2f} ms, backward {row[0][1]:7.2f} ms | "
                f"im2col forward {row[1][0]:7.2f} ms, backward {row[1][1]:7.2f} ms"
            )
    finally:
        plan.TRAINING_CUDNN_MIN_IMAGES = rule
    cudnn = backend.training_cudnn()
    for key, shape in ({} if cudnn is None else cudnn.shapes()).items():
        print(
            f"(images, h, w, cin, cout, k) {key}: algorithms {shape.forward_algo} (forward), "
            f"{shape.data_algo} (data gradient), {shape.filter_algo} (filter gradient)"
        )


if __name__ == "__main__":
    main()
