"""The GPU work of each phase of stage 2's training step, each phase captured alone as a CUDA Graph and
replayed (a GPU is needed): what a replayed step's time is made of, free of the host's launches.

    python3 scripts/train_graph_phases.py --batch 1 --repeat 20

The step's inputs are the graph step's (xmesh.train.graph_step.StepGraph, the golden training sample
repeated ``--batch`` times, synthetic weights). Each phase runs on the forward's caches: the CNN's
forward, DRB 1's forward, the losses' forward and backward, DRB 2's backward, the local projection's
backward alone (one block), the CNN's backward and regulariser, the whole loss and backward, and
Adam's updates as the graph step makes them (xmesh.train.adam_cupy: two launches); the mean GPU time
of ``--repeat`` replays between two CUDA events. Then Adam's 72 updates, eagerly (host and device).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()

    import cupy

    from xmesh.benchmarking import default_template
    from xmesh.io.weights import synthetic_weights
    from xmesh.model import architecture as arch
    from xmesh.model.cnn import cnn_backward, cnn_forward
    from xmesh.model.deformation_train import deformation_block_backward, deformation_block_forward
    from xmesh.model.local_projection_train import local_projection_backward
    from xmesh.train import graph_step, stage2
    from xmesh.train import mesh_losses as ml
    from xmesh.train.adam import adam_step
    from xmesh.train.adam_cupy import AdamTable
    from xmesh.train.bench import default_sample
    from xmesh.train.regularisers import cnn_regulariser
    from xmesh.train.trainer import Trainer

    batch = args.batch
    template, _ = default_template()
    sample, _ = default_sample(template)
    trainer = Trainer(2, synthetic_weights(1), template, "cupy", graphs=False)
    device, xp = trainer.device, trainer.device.xp
    key = (batch, sample.images.shape[0], graph_step.padded_size(len(sample.labels)))
    g = graph_step.StepGraph(device, trainer.weights, trainer.template, *key)
    g.load([sample] * batch, np.random.default_rng(0), 0.0)
    w, tm = g.weights, g.template
    views = xp.reshape(g.images, (-1,) + tuple(g.images.shape[2:]))
    fwd = stage2.forward(xp, w, tm, g.images, g.transforms, g.starts)
    calls = stage2.losses(xp, fwd, tm, g.gt, g.starts, None, None, g.uniforms)
    per_sample = xp.ones((batch,), dtype=xp.float32) / batch
    dblocks = [ml.mesh_loss_backward(xp, per_sample, c) for c in calls.mesh_caches]
    padded = [stage2.pad_map(xp, m) for m in fwd.maps]
    layers = stage2.drb_layers(w)
    _, dmaps, _ = deformation_block_backward(xp, dblocks[1], fwd.drb_caches[1])
    dmaps = [d[:, : m.shape[1], : m.shape[2], :] for d, m in zip(dmaps, fwd.maps, strict=True)]
    projection = fwd.drb_caches[1].projection
    points = tm.offsets.shape[0] * g.starts.shape[1]  # the hypotheses of every vertex
    dfeats = xp.full((batch, points, 339), 1e-3, dtype=xp.float32)
    _, _, grads = stage2.loss_and_gradients(
        xp, w, tm, g.images, g.transforms, g.gt, g.starts, None, uniforms=g.uniforms
    )
    adam_step(xp, trainer.weights, grads, trainer.adam)  # Adam's moments made
    table = AdamTable(xp, grads, trainer.weights, trainer.adam)
    marks, alpha = xp.zeros(len(grads) + 1, dtype=xp.float32), xp.zeros(1, dtype=xp.float32)  # alpha 0: no move

    def guarded_updates():
        marks.fill(0)
        table.mark(marks[:1], marks)
        table.update(marks, alpha)

    phases = {
        "CNN forward": lambda: cnn_forward(xp, stage2.cnn_layers(w), views, arch.STAGE2_TAPS)[0],
        "DRB 1 forward": lambda: deformation_block_forward(
            xp, layers[0], tm.supports, tm.offsets, g.starts, padded, g.transforms
        )[0],
        "losses forward": lambda: list(
            stage2.losses(xp, fwd, tm, g.gt, g.starts, None, None, g.uniforms).terms.values()
        ),
        "losses backward": lambda: (
            [ml.mesh_loss_backward(xp, per_sample, c) for c in calls.mesh_caches]
            + [ml.laplace_loss_backward(xp, per_sample, c)[0] for c in calls.laplace_caches]
        ),
        "DRB 2 backward": lambda: deformation_block_backward(xp, dblocks[1], fwd.drb_caches[1])[0],
        "its projection backward": lambda: local_projection_backward(
            xp, dfeats, projection, groups=points // tm.offsets.shape[0]
        )[0],
        "CNN backward": lambda: cnn_backward(xp, dmaps, fwd.cnn_caches, arch.STAGE2_TAPS),
        "regulariser": lambda: cnn_regulariser(xp, w, 2)[0],
        "whole loss and backward": lambda: stage2.loss_and_gradients(
            xp, w, tm, g.images, g.transforms, g.gt, g.starts, None, uniforms=g.uniforms
        )[0],
        "Adam's guarded updates": guarded_updates,
    }
    stream = cupy.cuda.get_current_stream()
    print(f"stage 2, batch {batch}: GPU time of each phase replayed as a CUDA Graph")
    for name, phase in phases.items():
        graph = device.capture(phase)
        for _ in range(3):
            graph.replay()
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        for _ in range(args.repeat):
            graph.replay()
        stop.record(stream)
        stop.synchronize()
        print(f"  {name:26s} {cupy.cuda.get_elapsed_time(start, stop) / args.repeat:8.3f} ms")
        graph.release()
    cupy.cuda.Device().synchronize()
    start_s = time.perf_counter()
    for _ in range(args.repeat):
        adam_step(xp, trainer.weights, grads, trainer.adam)
    cupy.cuda.Device().synchronize()
    print(f"  {'Adam, eagerly':26s} {(time.perf_counter() - start_s) / args.repeat * 1e3:8.3f} ms (host and device)")


if __name__ == "__main__":
    main()
