"""Shared timing code for ``xmesh bench`` and the asv suite in ``asv_benchmarks/``.

A :class:`Workload` is built once (backend, synthetic weights of seed 1, the golden template when
``../shared/golden/template.dat`` is there, else the built-in ellipsoid; the golden demo inputs
when ``../shared/golden/demo_seed1.npz`` is there, else procedural renderings) and exposes one
zero-argument callable per stage (:data:`STAGES`). Every callable ends with
``backend.synchronize()``, so a timer around it measures finished GPU work, not queued launches.

What each stage covers (B = batch, V = 3 views):

* ``cnn_stage1`` / ``cnn_stage2``: CNN18 over the images each stage reads (stage 1: view 0 alone
  with the view quirk, ``network.stage1_cnn_images``; stage 2: all B*V images, convs 1-8 only).
* ``graph_projection``: the three stage-1 graph projections (layers 0, 15, 31, concat included).
* ``graph_block_1/2/3``: the graph convolutions of stage-1 block k (block 2 and 3 include the
  unpooling before them), i.e. layers 1-14, 16-30, 32-47.
  cnn_stage1 + graph_projection + graph_block_1..3 = stage1.
* ``local_projection``: the two stage-2 local projections (one per deformation reasoning block).
* ``drb_1`` / ``drb_2``: one deformation reasoning block each, its local projection included.
  cnn_stage2 + drb_1 + drb_2 (+ padding the maps) = stage2.
* ``stage1`` / ``stage2``: ``network.run_stage1`` / ``network.run_stage2``.
* ``total``: ``Reconstructor.run`` from host images and cameras, refined mesh copied back to the host.
  On CuPy this replays the captured CUDA Graphs of the whole network (the warm-up calls capture
  them) up to ``Reconstructor.graph_max_batch``, where they fit its ``graph_memory_share`` of the
  device's memory; ``total_eager`` is the same call with graphs off, every kernel launched from
  Python. The per-stage rows are always eager.
"""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from .backends import available_backends, get_backend
from .errors import InputError
from .io.weights import synthetic_weights
from .model import architecture as arch
from .model import network
from .model.cnn import run_cnn
from .model.deformation import deformation_block
from .model.network import run_stage1_layers
from .model.projection import DeviceTransforms, local_projection

WEIGHTS_SEED = 1
MODEL_MD_GFLOP = 250.0  # MODEL.md's round figure; flop_counts() derives the exact one from the shapes

STAGES = (
    "cnn_stage1",
    "graph_projection",
    "graph_block_1",
    "graph_block_2",
    "graph_block_3",
    "cnn_stage2",
    "local_projection",
    "drb_1",
    "drb_2",
    "stage1",
    "stage2",
    "total_eager",
    "total",
)
# stage-1 layer ranges [start, stop) of the network's 48-layer loop
_SEGMENTS = {
    "projection_1": (0, 1),
    "graph_block_1": (1, 15),
    "projection_2": (15, 16),
    "graph_block_2": (16, 31),
    "projection_3": (31, 32),
    "graph_block_3": (32, 48),
}
# what a stage needs computed before it can be timed on its own
_NEEDS = {
    "graph_projection": ("stage1_states",),
    "graph_block_1": ("stage1_states",),
    "graph_block_2": ("stage1_states",),
    "graph_block_3": ("stage1_states",),
    "stage1": ("maps1",),
    "stage2": ("coarse",),
    "local_projection": ("hypotheses",),
    "drb_1": ("drb_inputs",),
    "drb_2": ("drb_inputs",),
}
# the FLOP count (flop_counts) that each stage performs
_STAGE_FLOP = {
    "cnn_stage1": ("cnn_stage1",),
    "cnn_stage2": ("cnn_stage2",),
    "graph_block_1": ("graph_block_1",),
    "graph_block_2": ("graph_block_2",),
    "graph_block_3": ("graph_block_3",),
    "drb_1": ("drb_1",),
    "drb_2": ("drb_2",),
    "stage1": ("cnn_stage1", "graph_block_1", "graph_block_2", "graph_block_3"),
    "stage2": ("cnn_stage2", "drb_1", "drb_2"),
    "total": ("cnn_stage1", "graph_block_1", "graph_block_2", "graph_block_3", "cnn_stage2", "drb_1", "drb_2"),
}
_STAGE_FLOP["total_eager"] = _STAGE_FLOP["total"]


# ---------------------------------------------------------------------------- reference data
def shared_dir() -> Path | None:
    """The reference folder: $XMESH_SHARED, else ``../shared`` beside the source tree; None if absent."""
    candidates = []
    if os.environ.get("XMESH_SHARED"):
        candidates.append(Path(os.environ["XMESH_SHARED"]))
    candidates.append(Path(__file__).resolve().parents[2] / "shared")
    for path in candidates:
        if (path / "golden").is_dir():
            return path
    return None


def golden_path(name: str) -> Path | None:
    root = shared_dir()
    path = None if root is None else root / "golden" / name
    return path if path is not None and path.is_file() else None


def default_template():
    """The golden template if present, else the built-in ellipsoid; returns (template, description)."""
    path = golden_path("template.dat")
    if path is not None:
        from .io.template import load_template

        return load_template(path), str(path)
    from .template_gen import generate_template

    return generate_template(), "built-in ellipsoid (generate_template)"


def default_inputs():
    """One sample: host images (V,224,224,3) float32, cameras (V,5) float32, and a description."""
    path = golden_path("demo_seed1.npz")
    if path is not None:
        with np.load(path) as data:
            return (
                np.asarray(data["images"], np.float32),
                np.asarray(data["cameras"], np.float32),
                f"golden demo ({path})",
            )
    from .io.cameras import load_cameras
    from .io.images import load_images
    from .synthetic.dataset import demo_inputs

    with tempfile.TemporaryDirectory(prefix="xmesh-bench-") as folder:
        images, cameras = demo_inputs(folder, seed=0)
        return (
            load_images(images),
            load_cameras(cameras),
            "procedural demo renderings (synthetic.dataset.demo_inputs, seed 0)",
        )


# ---------------------------------------------------------------------------- FLOP count
def flop_counts(stage1, stage2, template) -> dict[str, float]:
    """FLOP per sample (2 x multiply-adds) of each part, from the prepared parameters' shapes.

    Counts the convolutions, the dense and sparse graph-convolution products and the 43x43 support
    products of the deformation blocks; gathers, pooling and element-wise work are left out.
    """
    size = arch.IMAGE_SIZE

    def cnn(convs):
        s, macs = size, 0
        for conv in convs:
            kh, kw, cin, cout = (int(d) for d in conv.weight.shape)
            s = -(-s // conv.stride)
            macs += s * s * kh * kw * cin * cout
        return 2.0 * arch.NUM_VIEWS * macs

    counts = {"cnn_stage1": cnn(stage1.cnn), "cnn_stage2": cnn(stage2.cnn)}
    vertices = template.num_vertices
    for block, first, count in arch.GRAPH_BLOCKS:
        n = vertices[block - 1]
        s0, s1 = template.supports[block - 1]
        macs = 0
        for idx in range(first, first + count):
            layer = stage1.layers[idx]
            cin = int(layer.weight.shape[0])
            macs += n * cin * int(layer.weight.shape[1]) + s1.nnz * layer.cout
            if layer.weight0 is not None:
                macs += n * cin * layer.cout + s0.nnz * layer.cout
        counts[f"graph_block_{block}"] = 2.0 * macs
    n, k = vertices[-1], int(template.sample_coord.shape[0])
    for b, layers in enumerate(stage2.blocks, start=1):
        macs = 0
        for layer in layers:
            cin = int(layer.weight.shape[0])
            macs += n * k * cin * int(layer.weight.shape[1]) + k * k * n * layer.cout
            if layer.weight0 is not None:
                macs += n * k * cin * layer.cout + k * k * n * layer.cout
        counts[f"drb_{b}"] = 2.0 * macs
    counts["total"] = sum(counts.values())
    return counts


# ---------------------------------------------------------------------------- workload
class Workload:
    """Everything one backend needs to time the stages of a batch of ``batch`` samples.

    ``weights``, ``template``, ``images`` (V,224,224,3) and ``cameras`` (V,5) default to the
    benchmark's standard inputs (see the module docstring); the sample is repeated ``batch`` times.
    """

    def __init__(
        self,
        backend: Any = "numpy",
        batch: int = 1,
        weights=None,
        template=None,
        images=None,
        cameras=None,
        precision: str = "fp32",
        view_quirk: bool = True,
    ):
        from .reconstruct import Reconstructor

        if int(batch) != batch or batch < 1:
            raise InputError(f"batch={batch!r}: expected a positive whole number")
        self.batch = int(batch)
        self.backend = get_backend(backend, precision=precision) if isinstance(backend, str) else get_backend(backend)
        if template is None:
            template, self.template_source = default_template()
        else:
            self.template_source = "given"
        if images is None or cameras is None:
            images, cameras, self.input_source = default_inputs()
        else:
            self.input_source = "given"
        self.model = Reconstructor(
            synthetic_weights(WEIGHTS_SEED) if weights is None else weights,
            template=template,
            backend=self.backend,
            view_quirk=view_quirk,
        )
        self.view_quirk = bool(view_quirk)
        images = np.asarray(images, np.float32)
        self.host_images = np.ascontiguousarray(np.broadcast_to(images[None], (self.batch,) + images.shape))
        self.host_cameras = np.ascontiguousarray(
            np.broadcast_to(np.asarray(cameras, np.float32)[None], (self.batch,) + np.shape(cameras))
        )
        self.images = self.backend.asarray(self.host_images.reshape((-1,) + images.shape[1:]))
        self.tf = DeviceTransforms.from_cameras(self.backend, self.host_cameras)
        self.flop = flop_counts(self.model.stage1, self.model.stage2, self.model.template)

    @property
    def xp(self):
        return self.backend.xp

    # -- intermediate results the stages start from (computed on first use) ---------------
    @cached_property
    def stage1_images(self):
        """What the stage-1 CNN reads in a reconstruction (network.stage1_cnn_images)."""
        return network.stage1_cnn_images(self.backend, self.images, self.tf.num_views, self.view_quirk)

    @cached_property
    def maps1(self):
        return run_cnn(self.backend, self.model.stage1.cnn, self.stage1_images, arch.STAGE1_TAPS)

    @cached_property
    def padded2(self):
        return network.stage2_maps(self.backend, self.model.stage2, self.images)[1]

    @cached_property
    def stage1_states(self) -> dict:
        """layer index -> (previous, current) on entry, for every segment start."""
        p = self.model.stage1
        coords = self.xp.broadcast_to(p.coord[None], (self.batch,) + tuple(p.coord.shape))
        states: dict = {}
        previous, current, blocks = None, coords, []
        for start, stop in sorted(_SEGMENTS.values()):
            states[start] = (previous, current)
            previous, current = self._layers(start, stop, previous, current, blocks)
        states["blocks"] = blocks
        return states

    @cached_property
    def coarse(self):
        return self.stage1_states["blocks"][-1]

    @cached_property
    def drb_inputs(self) -> tuple:
        """The centers each deformation reasoning block starts from: (coarse, after block 1)."""
        p = self.model.stage2
        first = deformation_block(self.backend, p.blocks[0], p, self.coarse, self.padded2, self.tf)
        return self.coarse, first

    @cached_property
    def hypotheses(self) -> tuple:
        """The (B, K*N, 3) hypothesis points each block's local projection samples."""
        offsets = self.model.stage2.sample_coord
        out = []
        for centers in self.drb_inputs:
            b, n, _ = centers.shape
            points = centers[:, None, :, :] + offsets[None, :, None, :]
            out.append(self.xp.reshape(points, (b, offsets.shape[0] * n, 3)))
        return tuple(out)

    def prepare(self, *stages: str) -> None:
        """Compute, outside any timed region, what ``stages`` start from."""
        for stage in stages:
            if stage not in STAGES:
                raise InputError(f"stage {stage!r}: unknown; choose from {', '.join(STAGES)}")
            for need in _NEEDS.get(stage, ()):
                getattr(self, need)
        self.backend.synchronize()

    # -- the stage-1 layer loop over [start, stop), as network.run_stage1 runs it -----------
    def _layers(self, start, stop, previous, current, blocks=None):
        return run_stage1_layers(
            self.backend,
            self.model.stage1,
            self.maps1,
            self.tf,
            self.view_quirk,
            start,
            stop,
            previous,
            current,
            blocks,
        )

    def _segment(self, name):
        start, stop = _SEGMENTS[name]
        return self._layers(start, stop, *self.stage1_states[start])

    # -- the stages ----------------------------------------------------------------------
    def cnn_stage1(self):
        out = run_cnn(self.backend, self.model.stage1.cnn, self.stage1_images, arch.STAGE1_TAPS)
        self.backend.synchronize()
        return out

    def cnn_stage2(self):
        out = run_cnn(self.backend, self.model.stage2.cnn, self.images, arch.STAGE2_TAPS)
        self.backend.synchronize()
        return out

    def graph_projection(self):
        out = [self._segment(f"projection_{k}") for k in (1, 2, 3)]
        self.backend.synchronize()
        return out

    def graph_block_1(self):
        out = self._segment("graph_block_1")
        self.backend.synchronize()
        return out

    def graph_block_2(self):
        out = self._segment("graph_block_2")
        self.backend.synchronize()
        return out

    def graph_block_3(self):
        out = self._segment("graph_block_3")
        self.backend.synchronize()
        return out

    def local_projection(self):
        out = [local_projection(self.backend, points, self.padded2, self.tf) for points in self.hypotheses]
        self.backend.synchronize()
        return out

    def _drb(self, k):
        p = self.model.stage2
        out = deformation_block(self.backend, p.blocks[k], p, self.drb_inputs[k], self.padded2, self.tf)
        self.backend.synchronize()
        return out

    def drb_1(self):
        return self._drb(0)

    def drb_2(self):
        return self._drb(1)

    def stage1(self):
        out = network.run_stage1(self.backend, self.model.stage1, self.images, self.tf, self.view_quirk)
        self.backend.synchronize()
        return out

    def stage2(self):
        out = network.run_stage2(self.backend, self.model.stage2, self.images, self.coarse, self.tf)
        self.backend.synchronize()
        return out

    def total(self):
        coarse, refined = self.model.run(self.host_images, self.host_cameras)
        out = self.backend.to_numpy(refined)
        self.backend.synchronize()
        return out

    def total_eager(self):
        graphs, self.model.graphs = self.model.graphs, False
        try:
            return self.total()
        finally:
            self.model.graphs = graphs

    def stage(self, name: str) -> Callable[[], Any]:
        if name not in STAGES:
            raise InputError(f"stage {name!r}: unknown; choose from {', '.join(STAGES)}")
        return getattr(self, name)

    # -- measuring -----------------------------------------------------------------------
    def time(
        self, name: str, repeat: int = 3, warmup: int = 1, on_call: Callable[[], None] | None = None
    ) -> list[float]:
        """Seconds per call of stage ``name``, ``repeat`` times after ``warmup`` untimed calls;
        ``on_call()`` after each call, timed or not (outside the timed region)."""
        fn = self.stage(name)
        tick = on_call or (lambda: None)
        self.prepare(name)
        if name == "total" and self.model.graphs:
            warmup = max(warmup, 2)  # call 1 runs eagerly, call 2 captures the graph
        for _ in range(warmup):
            fn()
            tick()
        times = []
        for _ in range(repeat):
            self.backend.synchronize()
            start = time.perf_counter()
            fn()  # synchronises before returning
            times.append(time.perf_counter() - start)
            tick()
        return times

    def gpu_pool_bytes(self) -> int | None:
        """Bytes CuPy's memory pool holds after one reconstruction from an emptied pool (None on the CPU).

        The pool keeps freed blocks for reuse, so this is close to the peak device memory of a call."""
        if self.backend.name != "cupy":
            return None
        pool = self.backend.cupy.get_default_memory_pool()
        self.backend.synchronize()
        pool.free_all_blocks()
        self.total()
        return int(pool.total_bytes())

    def device(self) -> str:
        if self.backend.name == "cupy":
            props = self.backend.cupy.cuda.runtime.getDeviceProperties(self.backend.device.id)
            name = props["name"]
            return name.decode() if isinstance(name, bytes) else str(name)
        return f"{platform.processor() or platform.machine()} ({os.cpu_count()} logical CPUs)"


# ---------------------------------------------------------------------------- accuracy
def golden_errors(backend: Any = "numpy") -> dict[str, float]:
    """Agreement with the original TensorFlow outputs in ``golden/demo_seed1.npz``.

    ``stage1_block3_max_abs``: max |ours - original| of the coarse mesh (our whole stage 1; a few
    vertices whose projection sits on a pixel edge differ, see tests/test_golden.py).
    ``stage2_displacement_rel``: |d_ours - d_orig| / |d_orig| of the stage-2 move d (final mesh minus
    the original's coarse mesh), stage 2 started from the original's coarse mesh.
    Raises FileNotFoundError when the golden data is absent.
    """
    npz = golden_path("demo_seed1.npz")
    if npz is None or golden_path("template.dat") is None:
        raise FileNotFoundError("the golden data (../shared/golden or $XMESH_SHARED/golden) is not on this machine")
    with np.load(npz) as data:
        golden = {key: np.asarray(data[key]) for key in ("images", "cameras", "stage1_block3", "stage2_block2")}
    work = Workload(backend, 1, images=golden["images"], cameras=golden["cameras"])
    be = work.backend
    coarse = be.to_numpy(work.stage1()[-1])[0]
    start = be.asarray(golden["stage1_block3"][None])
    refined = be.to_numpy(network.run_stage2(be, work.model.stage2, work.images, start, work.tf))[0]
    ours = refined.astype(np.float64) - golden["stage1_block3"]
    ref = golden["stage2_block2"].astype(np.float64) - golden["stage1_block3"]
    return {
        "stage1_block3_max_abs": float(np.abs(coarse.astype(np.float64) - golden["stage1_block3"]).max()),
        "stage2_displacement_rel": float(np.linalg.norm(ours - ref) / np.linalg.norm(ref)),
    }


# ---------------------------------------------------------------------------- the whole benchmark
def resolve_backends(backend: str | Sequence[str]) -> list[str]:
    """'all' -> every backend that runs here; a name or list of names -> those (checked)."""
    if isinstance(backend, str):
        names = available_backends() if backend == "all" else [backend]
    else:
        names = list(backend)
    for name in names:
        get_backend(name)  # raises BackendUnavailableError / InputError with the reason
    return names


def _summary(times: Sequence[float], batch: int, flop: float | None) -> dict:
    median = statistics.median(times)
    out = {
        "median_ms": median * 1e3,
        "per_sample_ms": median * 1e3 / batch,
        "min_ms": min(times) * 1e3,
        "times_ms": [t * 1e3 for t in times],
    }
    if flop:
        out["gflop_per_s"] = flop * batch / median / 1e9
    return out


def run_bench(
    backend: str | Sequence[str] = "all",
    batch_sizes: Iterable[int] = (1,),
    repeat: int = 3,
    warmup: int = 1,
    stages: Iterable[str] | None = None,
    numpy_max_batch: int | None = 2,
    progress: Callable[[str, int, int], None] | None = None,
    precision: str = "fp32",
) -> dict:
    """Time ``stages`` (default: all) on each backend and batch size; returns a JSON-ready dict.

    ``precision`` ("fp32", "tf32", "fp16" or "bf16") is the GPU backend's mode; NumPy always computes in
    float32.

    With ``backend='all'`` (or a list of several) NumPy serves as the CPU comparison for the same
    inputs in the same run; a NumPy sample takes seconds, so when a GPU backend is also measured
    NumPy runs only at batch sizes <= ``numpy_max_batch`` (None: all).

    ``progress(what, calls_done, calls_planned)`` is called as each stage starts and after each call
    of it, so a caller can show how much of the run is left.
    """
    names = resolve_backends(backend)
    stages = list(STAGES if stages is None else stages)
    for name in stages:
        if name not in STAGES:
            raise InputError(f"stage {name!r}: unknown; choose from {', '.join(STAGES)}")
    if precision != "fp32" and all(name == "numpy" for name in names):
        raise InputError(
            f"precision={precision!r} is a mode of the GPU backend; the numpy backend computes in "
            "float32: use --backend cupy (or all), or leave out --precision"
        )
    batch_sizes = [int(b) for b in batch_sizes]
    if not batch_sizes or min(batch_sizes) < 1:
        raise InputError(f"batch sizes {batch_sizes}: expected one or more positive whole numbers")
    if int(repeat) < 1 or int(warmup) < 0:
        raise InputError(f"repeat={repeat}, warmup={warmup}: expected repeat >= 1 and warmup >= 0")
    say = progress or (lambda message, done, planned: None)
    host = {}
    template, template_source = default_template()
    images, cameras, input_source = default_inputs()
    weights = synthetic_weights(WEIGHTS_SEED)
    report = {
        "xmesh_version": _version(),
        "weights": f"synthetic recipe, seed {WEIGHTS_SEED} (timing does not depend on the values)",
        "template": template_source,
        "inputs": input_source,
        "repeat": int(repeat),
        "warmup": int(warmup),
        "stages": stages,
        "model_md_gflop_per_sample": MODEL_MD_GFLOP,
        "results": [],
        "skipped": [],
    }
    runs = [
        (name, batch)
        for name in names
        for batch in batch_sizes
        if not (name == "numpy" and len(names) > 1 and numpy_max_batch is not None and batch > numpy_max_batch)
    ]
    # planned calls; a GPU's "total" warms up twice (eager, then the graph capture)
    planned = sum(
        int(repeat) + (max(int(warmup), 2) if stage == "total" and name != "numpy" else int(warmup))
        for name, _ in runs
        for stage in stages
    )
    done = 0
    for name in names:
        for batch in batch_sizes:
            if (name, batch) not in runs:
                report["skipped"].append(
                    {
                        "backend": name,
                        "batch": batch,
                        "reason": f"numpy runs only batch <= {numpy_max_batch} next to a GPU backend",
                    }
                )
                continue
            work = Workload(
                name,
                batch,
                weights=weights,
                template=template,
                images=images,
                cameras=cameras,
                precision="fp32" if name == "numpy" else precision,
            )
            report.setdefault("flop_per_sample", work.flop)
            entry = {
                "backend": name,
                "precision": work.backend.precision,
                "device": work.device(),
                "batch": batch,
                "stages": {},
            }
            for stage in stages:
                what = f"{name} batch {batch}: {stage}"
                say(what, done, planned)

                def called(what=what):
                    nonlocal done
                    done += 1
                    say(what, done, max(planned, done))

                flop = sum(work.flop[k] for k in _STAGE_FLOP.get(stage, ())) or None
                entry["stages"][stage] = _summary(work.time(stage, repeat, warmup, on_call=called), batch, flop)
            if "total" in entry["stages"]:
                total = entry["stages"]["total"]
                entry["total_ms"] = total["median_ms"]
                entry["samples_per_s"] = batch * 1e3 / total["median_ms"]
                entry["gflop_per_s"] = total["gflop_per_s"]
            pool = work.gpu_pool_bytes()
            if pool is not None:
                entry["gpu_pool_bytes"] = pool
            report["results"].append(entry)
            host[(name, batch)] = entry
    for entry in report["results"]:  # speed-up over numpy at the same batch size, where both ran
        ref = host.get(("numpy", entry["batch"]))
        if entry["backend"] != "numpy" and ref is not None and "total_ms" in entry and "total_ms" in ref:
            entry["speedup_vs_numpy"] = ref["total_ms"] / entry["total_ms"]
    return report


def _version() -> str:
    from . import __version__

    return __version__


def format_table(report: dict) -> str:
    """The report as a text table: one row per stage, one column per (backend, batch)."""
    results = report["results"]
    if not results:
        return "no measurements (every combination was skipped)"
    heads = [
        f"{r['backend']} b={r['batch']}" + ("" if r.get("precision", "fp32") == "fp32" else f" {r['precision']}")
        for r in results
    ]
    stage_w = max(len(s) for s in list(report["stages"]) + ["stage", "samples/s"]) + 2
    col_w = max(22, max(len(h) for h in heads) + 2)
    lines = ["median ms per call (ms per sample)".rjust(stage_w + col_w * len(results))]
    lines.append("stage".ljust(stage_w) + "".join(h.rjust(col_w) for h in heads))
    for stage in report["stages"]:
        cells = []
        for r in results:
            s = r["stages"][stage]
            cells.append(f"{s['median_ms']:.2f} ({s['per_sample_ms']:.2f})".rjust(col_w))
        lines.append(stage.ljust(stage_w) + "".join(cells))
    if all("total_ms" in r for r in results):
        lines.append("samples/s".ljust(stage_w) + "".join(f"{r['samples_per_s']:.2f}".rjust(col_w) for r in results))
        lines.append("GFLOP/s".ljust(stage_w) + "".join(f"{r['gflop_per_s']:.1f}".rjust(col_w) for r in results))
        if any("speedup_vs_numpy" in r for r in results):
            lines.append(
                "vs numpy".ljust(stage_w)
                + "".join(
                    (f"{r['speedup_vs_numpy']:.1f}x" if "speedup_vs_numpy" in r else "-").rjust(col_w) for r in results
                )
            )
    flop = report.get("flop_per_sample", {}).get("total")
    notes = [
        f"inputs: {report['inputs']}",
        f"template: {report['template']}",
        f"weights: {report['weights']}",
        f"repeat {report['repeat']}, warmup {report['warmup']}",
    ]
    if flop:
        notes.append(
            f"work: {flop / 1e9:.1f} GFLOP per sample counted from the layer shapes (MODEL.md: ~{MODEL_MD_GFLOP:.0f})"
        )
    for head, r in zip(heads, results):
        notes.append(
            f"{head}: {r['device']}"
            + (f", CuPy pool {r['gpu_pool_bytes'] / 2**20:.0f} MiB" if "gpu_pool_bytes" in r else "")
        )
    for s in report.get("skipped", []):
        notes.append(f"skipped {s['backend']} b={s['batch']}: {s['reason']}")
    return "\n".join(lines + [""] + notes)
