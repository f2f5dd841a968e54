"""Where a training step's time goes: each phase of ``Trainer.step`` timed with the device synchronised
around it, at each batch size.

    python3 scripts/train_profile.py --backend cupy --batch-sizes 1 32 --steps 3

The step is :class:`xmesh.train.bench.StepWorkload`'s (the one ``scripts/train_bench.py`` times). Each
phase function is wrapped: the device is synchronised before it, the host time until it returns is its
*launch* time, and the time until the device has finished its work is its *total*. A phase whose total
is about its launch time is bound by the host (Python, launches, copies that wait); a much larger total
means the device's arithmetic or memory bounds it. Nested phases are indented and included in their
parent's time. The first lines give the step's own median time without the synchronisations.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections import defaultdict

import numpy as np

from xmesh.model import bilinear_cupy, cnn, deformation_train, local_projection_train, products
from xmesh.train import graph_step, mesh_losses, stage1, trainer
from xmesh.train.bench import StepWorkload

try:
    from xmesh.train import stage2
except ImportError:  # a tree without stage 2's step
    stage2 = None


def phases(stage: int) -> list:
    """(label, module, attribute, depth) of the wrapped functions, in the step's order."""
    s = stage2 if stage == 2 else stage1
    out = [
        ("loss and gradients (to host)", trainer, "batch_loss_and_gradients", 0),
        ("CNN forward", s, "cnn_forward", 1),
    ]
    if stage == 2:
        out += [
            ("DRB forward", s, "deformation_block_forward", 1),
            ("local projection fwd", deformation_train, "local_projection_forward", 2),
            ("local gconv fwd (x6)", deformation_train, "local_gconv_forward", 2),
            ("losses forward", s, "losses", 1),
        ]
    out += [
        ("mesh_loss forward", mesh_losses, "mesh_loss_forward", 2),
        ("Chamfer nearest", mesh_losses, "nearest", 3),
        ("own draws", mesh_losses, "draw_samples", 2),
        ("laplace_loss forward", mesh_losses, "laplace_loss_forward", 2),
        ("mesh_loss backward", mesh_losses, "mesh_loss_backward", 1),
        ("laplace_loss backward", mesh_losses, "laplace_loss_backward", 1),
    ]
    if stage == 2:
        out += [
            ("DRB backward", s, "deformation_block_backward", 1),
            ("local gconv bwd (x6)", deformation_train, "local_gconv_backward", 2),
            ("local projection bwd", deformation_train, "local_projection_backward", 2),
        ]
    out += [
        ("CNN backward", s, "cnn_backward", 1),
        ("conv backward (each)", cnn, "conv_backward", 2),
        ("CNN regulariser", s, "cnn_regulariser", 1),
        ("Adam", trainer, "adam_step", 0),
    ]
    return [p for p in out if p[1] is not None and hasattr(p[1], p[2])]


class Timers:
    def __init__(self, sync):
        self.sync = sync
        self.launch = defaultdict(float)
        self.total = defaultdict(float)
        self.calls = defaultdict(int)
        self.saved = []

    def wrap(self, label, module, name):
        original = getattr(module, name)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            self.sync()
            start = time.perf_counter()
            out = original(*args, **kwargs)
            self.launch[label] += time.perf_counter() - start
            self.sync()
            self.total[label] += time.perf_counter() - start
            self.calls[label] += 1
            return out

        self.saved.append((module, name, original))
        setattr(module, name, timed)

    def restore(self):
        for module, name, original in reversed(self.saved):
            setattr(module, name, original)
        self.saved = []


def device_sync(backend: str):
    if backend == "cupy":
        import cupy

        return cupy.cuda.Device().synchronize
    return lambda: None


def profile(work: StepWorkload, steps: int, sync) -> tuple:
    """Median unsynchronised step time, and per-phase (launch, total, calls) per step."""
    work.step()
    work.step()
    sync()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        work.step()
        sync()
        times.append(time.perf_counter() - start)
    timers = Timers(sync)
    for label, module, name, _ in phases(work.stage):
        timers.wrap(label, module, name)
    start = time.perf_counter()
    try:
        for _ in range(steps):
            work.step()
        sync()
    finally:
        timers.restore()
    synced = (time.perf_counter() - start) / steps
    table = {
        label: (timers.launch[label] / steps, timers.total[label] / steps, timers.calls[label] // steps)
        for label in timers.total
    }
    return float(np.median(times)), synced, table


def comparisons() -> list:
    """(label, switch) of ``--compare``'s variants: each switch turns one of the step's fast paths off and
    returns the function that turns it back on."""

    def products_off():
        lent, layer = products.lend(None), products.lend_layer(None)
        return lambda: (products.lend(lent), products.lend_layer(layer))

    def layer_off():
        layer = products.lend_layer(None)
        return lambda: products.lend_layer(layer)

    def flags_off(*flags):
        def off():
            for module, name in flags:
                setattr(module, name, False)
            return lambda: [setattr(module, name, True) for module, name in flags]

        return off

    apart = (local_projection_train, "ONE_PASS_ON_CUPY")
    return [
        ("cuBLAS's float32 products instead", products_off),
        ("the local projection's taps and pooling apart", flags_off(apart)),
        ("the local projection's array-API taps instead", flags_off(apart, (local_projection_train, "FUSED_ON_CUPY"))),
        ("no layer kernel lent (the deformation layers as products)", layer_off),
        ("the warp-per-row projection backward", flags_off(apart, (bilinear_cupy, "FLOAT4_BACKWARD"))),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="cupy", choices=("numpy", "cupy"))
    parser.add_argument("--stage", type=int, default=2, choices=(1, 2))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--compare",
        action="store_true",
        help="also time the step with every product in cuBLAS (no GEMM and no layer kernel lent, "
        "xmesh.model.products), with the local projection's taps and pooling apart "
        "(local_projection_train.ONE_PASS_ON_CUPY), with its array-API taps "
        "(local_projection_train.FUSED_ON_CUPY), with no "
        "deformation layer kernel lent (products.lend_layer) and with the warp-per-row projection "
        "backward (bilinear_cupy.FLOAT4_BACKWARD)",
    )
    args = parser.parse_args()
    sync = device_sync(args.backend)
    for batch in args.batch_sizes:
        work = StepWorkload(args.stage, args.backend, batch, graphs=False)  # phases are eager calls
        median, synced, table = profile(work, args.steps, sync)
        peak = ""
        if args.backend == "cupy":
            import cupy

            peak = f"; device memory pool {cupy.get_default_memory_pool().total_bytes() / 2**30:.1f} GiB"
        print(
            f"stage {args.stage} on {args.backend}, batch {batch}: step {median * 1e3:.2f} ms "
            f"({batch / median:.1f} samples/s) eager; with a sync around each phase {synced * 1e3:.2f} ms{peak}"
        )
        if args.stage == 2 and hasattr(work.trainer.device, "capture") and batch <= graph_step.MAX_BATCH:
            graphed = StepWorkload(args.stage, args.backend, batch).time_steps(args.steps)["median_s"]
            print(f"  replayed as a CUDA Graph (the trainer's default at this batch): step {graphed * 1e3:.2f} ms")
        sync()
        start = time.perf_counter()
        work.trainer.trained_weights()
        copy = time.perf_counter() - start
        print(f"  (the trained variables to the host, as a gradient round trip would copy them: {copy * 1e3:.2f} ms)")
        print(f"  {'phase':<34} {'launch ms':>10} {'total ms':>10} {'calls':>6}")
        for label, _, _, depth in phases(args.stage):
            if label in table:
                launch, total, calls = table[label]
                print(f"  {'  ' * depth + label:<34} {launch * 1e3:>10.2f} {total * 1e3:>10.2f} {calls:>6}")
        if args.compare:
            for label, off in comparisons():
                restore = off()
                try:
                    median, _, _ = profile(work, args.steps, sync)
                finally:
                    restore()
                print(f"  with {label}: step {median * 1e3:.2f} ms ({batch / median:.1f} samples/s)")
        del work
        if args.backend == "cupy":
            import cupy

            cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
