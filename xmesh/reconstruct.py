"""The public entry points: ``Reconstructor`` (weights and template loaded once) and ``reconstruct``,
and :class:`ModelSpec`, the picklable recipe from which another process builds the same model."""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import numpy as np

from .backends import get_backend
from .errors import DeviceOutOfMemoryError, InputError
from .io.images import NUM_VIEWS
from .io.template import Template, load_template
from .io.weight_sources import is_named_source, resolve_weights
from .io.weights import load_weights, weights_fingerprint
from .mesh import Mesh
from .model import architecture as arch
from .model import network
from .model.camera import packed_transforms
from .model.params import prepare_stage1, prepare_stage2
from .model.projection import DeviceTransforms
from .photo.inputs import network_inputs, place
from .template_gen import generate_template


@dataclass
class CapturedNetwork:
    """One batch size's reconstruction as four CUDA graphs (``Reconstructor._capture``) and the device
    arrays they read: ``images`` (B*V,224,224,3) and the view transforms ``tf``."""

    cnn1: Any  # stage 1's CNN (the views its projections read) -> its maps
    stage1: Any  # the rest of stage 1 -> the coarse mesh (B,2466,3)
    cnn2: Any  # stage 2's CNN -> its maps and their padded copies
    stage2: Any  # the two deformation reasoning blocks -> the refined mesh
    images: Any
    tf: DeviceTransforms

    @property
    def nbytes(self) -> int:
        """Device memory the four graphs keep for their intermediates."""
        return sum(piece.nbytes for piece in self._pieces())

    def release(self) -> None:
        """Give the graphs' memory back; the object is unusable afterwards."""
        for piece in self._pieces():
            piece.release()

    def _pieces(self) -> tuple:
        return self.cnn1, self.stage1, self.cnn2, self.stage2


#: Largest batch size replayed from CUDA Graphs, by precision mode. Up to it graphs made an fp16 call
#: 1.08-1.45x faster at b=16 and 32; above it a call is bound by the GPU's work, and graphs gained or
#: lost by machine (fp16 b=64 0.88-1.09x, fp32 b=16 0.82-1.14x; docs/PERFORMANCE.md, "CUDA graphs by
#: batch size").
GRAPH_MAX_BATCH = {"fp32": 8, "tf32": 8, "fp16": 32, "bf16": 32}


def _absolute(value: Any) -> Any:
    """Paths -> absolute text paths ('official', 'synthetic:N' and arrays as they are); lists element-wise."""
    if isinstance(value, (list, tuple)):
        return [_absolute(v) for v in value]
    if isinstance(value, os.PathLike) or (isinstance(value, str) and not is_named_source(value)):
        return os.path.abspath(os.fspath(value))
    return value


@dataclass(frozen=True)
class ModelSpec:
    """The arguments of :class:`Reconstructor` as a small picklable value: ``weights`` (a path, a list
    of paths, a dict of arrays, ``"official"`` for the stored official checkpoints, resolved by each
    process in its own cache folder, or ``"synthetic:SEED"`` for the synthetic test recipe), ``template``
    (None for the built-in ellipsoid, a path, or a Template), ``backend`` ("numpy" or "cupy"),
    ``precision``, ``view_quirk`` and ``graphs``. A Dask cluster's workers (:mod:`xmesh.cluster`)
    each build their own model from it; paths are made absolute, since a worker's working folder may
    differ from the client's (the files must be readable from the workers)."""

    weights: Any
    template: Any = None
    backend: str = "numpy"
    precision: str = "fp32"
    view_quirk: bool = True
    graphs: bool = True

    @classmethod
    def of(
        cls,
        weights,
        template=None,
        backend: str = "numpy",
        precision: str = "fp32",
        view_quirk: bool = True,
        graphs: bool = True,
    ) -> ModelSpec:
        """A spec with its paths made absolute; ``weights`` as one-element lists are unwrapped."""
        if isinstance(weights, (list, tuple)) and len(weights) == 1:
            weights = weights[0]
        return cls(
            _absolute(weights), _absolute(template), str(backend), str(precision), bool(view_quirk), bool(graphs)
        )

    @property
    def gpu(self) -> bool:
        return self.backend == "cupy"

    def build(self) -> Reconstructor:
        """The Reconstructor this spec describes."""
        return Reconstructor(
            self.weights,
            template=self.template,
            backend=self.backend,
            precision=self.precision,
            view_quirk=self.view_quirk,
            graphs=self.graphs,
        )


def resolve_template(template) -> Template:
    """A Template, the path of an official-layout .dat, or None for the built-in ellipsoid."""
    if template is None:
        return generate_template()
    if isinstance(template, Template):
        return template
    if isinstance(template, (str, os.PathLike)):
        return load_template(template)
    raise InputError(
        f"template={template!r}: expected None (the built-in ellipsoid), a Template, or the path of a .dat file"
    )


def _host_inputs(template, weights) -> tuple[Template, dict, str]:
    """The template, the weights' arrays and their fingerprint (what a run's results depend on:
    :mod:`xmesh.results.run_identity`)."""
    mesh = resolve_template(template)  # first: a bad template is named before the weights are read
    arrays = load_weights(resolve_weights(weights))
    return mesh, arrays, weights_fingerprint(arrays)


class Reconstructor:
    """Pixel2Mesh++ with its weights and template resident on a backend, for repeated calls.

    ``weights``: an ``.npz`` keyed by the official checkpoint names, a TensorFlow checkpoint prefix,
    a dict of arrays, or a list of these (the official weights come as two checkpoints, one per
    stage); ``"official"`` the official checkpoints stored by ``xmesh weights add``;
    ``"synthetic:SEED"`` draws the synthetic test recipe (random, NOT trained weights).
    ``view_quirk`` keeps the original's stage-1 behaviour (every view samples view 0's maps), which
    the published weights were trained with; turn it off only for weights trained without it.
    ``graphs`` (CuPy backend): the second call with a given batch size (up to
    ``graph_max_batch``) captures the whole reconstruction as four CUDA Graphs and later calls with
    that size replay them, which removes the launch overhead that dominates small and middle batches
    (four pieces, so that a call's uploads overlap the GPU's work: ``_replay``). The graphs of all
    batch sizes held stay within ``graph_memory_share`` of the device's memory: a batch size that does
    not fit in what is left, or whose capture runs out of memory, runs eagerly (none is dropped for
    another, so sizes that come and go cost no captures).
    ``spec`` records these arguments (:class:`ModelSpec`), so that the workers of a
    Dask cluster can each build the same model (``evaluate_dataset(model, ..., client=...)``).
    """

    #: The share of the device's memory that captured CUDA Graphs may hold together: a graph keeps
    #: its own intermediates, about 0.15 GB a sample in the 16-bit modes and 0.6 GB in fp32.
    graph_memory_share = 0.25

    def __init__(
        self,
        weights: Any,
        template: Any = None,
        backend: Any = "numpy",
        precision: str = "fp32",
        view_quirk: bool = True,
        graphs: bool = True,
    ):
        # the template and the weights are read (or made) in a thread while the backend starts (on the
        # GPU: CuPy's import and the CUDA context)
        if isinstance(backend, str) and backend.lower() == "cupy":
            # SciPy (the template's eigensolver, in the thread below) looks CuPy up in sys.modules: one
            # half-imported by this thread meanwhile fails it, so the import comes first
            with suppress(ImportError):
                importlib.import_module("cupy")
        host = ThreadPoolExecutor(max_workers=1, thread_name_prefix="xmesh-model-host")
        inputs = host.submit(_host_inputs, template, weights)
        host.shutdown(wait=False)
        self.backend = get_backend(backend, precision=precision) if isinstance(backend, str) else get_backend(backend)
        # how to build this model again in another process (a cluster worker: xmesh.cluster)
        self.spec = ModelSpec.of(
            weights, template, self.backend.name, getattr(self.backend, "precision", precision), view_quirk, graphs
        )
        self.template, arrays, self.weights_fingerprint = inputs.result()
        self.stage1 = prepare_stage1(self.backend, arrays, self.template)
        self.stage2 = prepare_stage2(self.backend, arrays, self.template)
        self.view_quirk = bool(view_quirk)
        self.faces = np.asarray(self.template.faces_triangle[-1], dtype=np.int64)
        self.max_batch: int | None = None  # set after an out-of-memory split
        # CUDA Graphs: the second call with a batch size captures the whole reconstruction, later
        # calls with that size replay it (four launches instead of several hundred)
        self.graphs = bool(graphs) and getattr(self.backend, "can_capture_network", False)
        self._seen_batches: set[int] = set()
        self._captured: dict[int, CapturedNetwork] = {}
        self._capture_failed: set[int] = set()  # sizes whose capture ran out of memory
        self.graph_max_batch = GRAPH_MAX_BATCH.get(self.spec.precision, 8)
        self._graph_sample_bytes = 0.0  # the most a captured graph held per sample

    # -- low level: device arrays in, device arrays out ------------------------------------
    def run(self, images, cameras: np.ndarray, trace: network.Trace | None = None):
        """images: host or device (B,V,224,224,3); cameras: host (B,V,5). Returns device (coarse, refined) (B,N,3).

        A batch that does not fit in memory is split in halves and retried (the largest size that
        fitted is remembered for later calls); if even one sample does not fit,
        :class:`~xmesh.errors.DeviceOutOfMemoryError` says so.
        """
        batch = cameras.shape[0]
        limit = self.max_batch
        if limit is not None and batch > limit and trace is None:
            return self._concat(
                [self.run(images[i : i + limit], cameras[i : i + limit]) for i in range(0, batch, limit)]
            )
        try:
            return self._run_once(images, cameras, trace)
        except Exception as exc:
            if not self.backend.is_out_of_memory(exc):
                raise
            for net in self._captured.values():  # a captured graph holds its own intermediates
                net.release()
            self._captured.clear()
            self.backend.release_memory()
            if batch == 1 or trace is not None:
                raise DeviceOutOfMemoryError(
                    f"{self.backend.name}: a batch of {batch} sample(s) does not fit in memory "
                    f"({type(exc).__name__}: {exc})"
                    + (
                        "; even one sample does not fit: free memory used by other programs, or use backend='numpy'"
                        if batch == 1
                        else "; tracing needs the whole batch at once: trace fewer samples"
                    )
                ) from exc
        half = (batch + 1) // 2
        self.max_batch = half if self.max_batch is None else min(self.max_batch, half)
        return self._concat([self.run(images[:half], cameras[:half]), self.run(images[half:], cameras[half:])])

    def _run_once(self, images, cameras, trace):
        xp = self.backend.xp
        batch = cameras.shape[0]
        if trace is None and self.graphs and batch <= self.graph_max_batch:
            if batch in self._captured:
                return self._replay(batch, images, cameras)
            if batch in self._seen_batches and batch not in self._capture_failed and self._room_for_graphs(batch):
                try:
                    return self._capture(batch, images, cameras)
                except Exception as exc:  # out of memory while capturing: this size runs eagerly
                    if not self.backend.is_out_of_memory(exc):
                        raise
                    self._capture_failed.add(batch)
                    self.backend.release_memory()
            self._seen_batches.add(batch)
        tf = DeviceTransforms.from_cameras(self.backend, cameras)
        if trace is None and isinstance(images, np.ndarray):
            host = np.reshape(images, (batch, NUM_VIEWS, 224, 224, 3))
            return network.run_network_from_host(self.backend, self.stage1, self.stage2, host, tf, self.view_quirk)
        flat = xp.reshape(self.backend.asarray(images), (batch * NUM_VIEWS, 224, 224, 3))
        return network.run_network_on_device(self.backend, self.stage1, self.stage2, flat, tf, self.view_quirk, trace)

    def graph_bytes(self) -> dict[int, int]:
        """The device memory each captured batch size's graphs hold, by batch size (empty when
        nothing was captured: on the CPU, with ``graphs=False``, or before a size's second call)."""
        return {batch: net.nbytes for batch, net in self._captured.items()}

    def _room_for_graphs(self, batch: int) -> bool:
        """Whether a capture of ``batch`` fits beside the graphs held, within ``graph_memory_share`` of
        the device's memory and in its free memory. Its size is guessed from the graphs captured so
        far per sample, before the first from the memory the eager calls hold (about what a graph
        needs: both keep a call's intermediates)."""
        memory = self.backend.memory_bytes()
        if memory is None:
            return False
        free, total = memory
        needed = int(self._graph_sample_bytes * batch) or self.backend.held_bytes()
        if sum(self.graph_bytes().values()) + needed > self.graph_memory_share * total:
            return False
        if free < needed:
            self.backend.release_memory()
            free = self.backend.memory_bytes()[0]
        return free >= needed

    def _capture(self, batch: int, images, cameras):
        """Capture the network for this batch size as four CUDA graphs reading their own input arrays
        (the images, the view transforms), then run them: stage 1's CNN, the rest of stage 1, stage 2's
        CNN, the rest of stage 2. Four rather than one so that a replay can overlap its host work with
        the GPU's (``_replay``). Each piece runs once right after its capture, so the next piece's
        warm-up reads real data."""
        be, xp = self.backend, self.backend.xp
        s1, s2, quirk = self.stage1, self.stage2, self.view_quirk
        static_images = xp.asarray(xp.reshape(be.asarray(images), (batch * NUM_VIEWS, 224, 224, 3)), copy=True)
        tf = DeviceTransforms.from_cameras(be, cameras)

        def piece(fn):
            graph = be.capture(fn, warmup=1)
            graph.replay(synchronize=True)
            return graph

        cnn1 = piece(lambda: network.stage1_maps(be, s1, static_images, NUM_VIEWS, quirk))
        stage1 = piece(lambda: network.stage1_from_maps(be, s1, cnn1.outputs, tf, quirk)[-1])
        cnn2 = piece(lambda: network.stage2_maps(be, s2, static_images))
        stage2 = piece(lambda: network.run_stage2(be, s2, static_images, stage1.outputs, tf, None, cnn2.outputs))
        net = self._captured[batch] = CapturedNetwork(cnn1, stage1, cnn2, stage2, static_images, tf)
        self._graph_sample_bytes = max(self._graph_sample_bytes, net.nbytes / batch)
        return self._replay(batch, images, cameras)

    def _replay(self, batch: int, images, cameras):
        """Run the captured graphs on new inputs; returns copies of their outputs. From host images the
        host's work overlaps the GPU's (as ``network.run_network_from_host`` does eagerly): only the
        views stage 1 reads are uploaded before its CNN starts, the camera transforms are computed
        and uploaded while that CNN runs, and the other views are uploaded on a second stream while
        stage 1 computes, stage 2's CNN following them there."""
        net, be = self._captured[batch], self.backend
        rest: list = []
        if isinstance(images, np.ndarray):
            host = np.reshape(images, (batch, NUM_VIEWS, 224, 224, 3))
            first = arch.stage1_views_read(NUM_VIEWS, self.view_quirk)
            be.copy_views_into(net.images, host, first)
            rest = [v for v in range(NUM_VIEWS) if v not in first]
        else:
            be.copy_into(net.images, images)
        beside = be.branch()  # its work waits for this call's images so far and everything before
        net.cnn1.replay()
        be.copy_into(net.tf.packed, packed_transforms(cameras))  # the transforms: one upload
        net.stage1.replay()
        with beside:
            if rest:
                be.copy_views_into(net.images, host, rest)
            net.cnn2.replay()
        beside.join()
        refined = net.stage2.replay()
        return net.stage1.outputs.copy(), refined.copy()

    def _concat(self, parts):
        xp = self.backend.xp
        return tuple(xp.concat([p[i] for p in parts], axis=0) for i in range(2))

    # -- user level -------------------------------------------------------------------------
    def __call__(self, images: Any, cameras: Any, views: Sequence[int] | None = None) -> Mesh:
        """Reconstruct one object from 3 images (paths or arrays) and their 3 camera rows (array or file),
        or 3 photos and their :class:`xmesh.cameras.PhotoCameras` (the mesh then in the photos' world)."""
        return self.reconstruct_batch([images], [cameras], views=views)[0]

    def reconstruct_batch(
        self, images: Sequence[Any], cameras: Sequence[Any], views: Sequence[int] | None = None
    ) -> list[Mesh]:
        """Reconstruct B objects at once; ``images[b]`` and ``cameras[b]`` as for a single call."""
        if len(images) != len(cameras):
            raise InputError(
                f"got {len(images)} image sets but {len(cameras)} camera sets: give one camera set per sample"
            )
        if len(images) == 0:
            raise InputError("reconstruct_batch needs at least one sample")
        inputs = [network_inputs(i, c, views) for i, c in zip(images, cameras)]
        host_images = np.stack([i for i, _ in inputs])
        host_cameras = np.stack([c for _, c in inputs])
        coarse, refined = self.run(host_images, host_cameras)
        coarse, refined = self.backend.to_numpy(coarse), self.backend.to_numpy(refined)
        return [
            place(Mesh(vertices=refined[b], faces=self.faces, coarse_vertices=coarse[b]), cameras[b])
            for b in range(len(images))
        ]


def reconstruct(
    images: Any,
    cameras: Any,
    weights: Any,
    template: Any = None,
    backend: str = "numpy",
    precision: str = "fp32",
    view_quirk: bool = True,
    views: Sequence[int] | None = None,
) -> Mesh:
    """One-shot reconstruction: 3 images + 3 camera rows -> ``Mesh`` (see :class:`Reconstructor`).

    ``cameras`` may also be :class:`xmesh.cameras.PhotoCameras` (``xmesh.cameras.from_colmap`` or
    ``from_poses``): the images are then photos, resampled into the network's views, and the mesh is
    returned in the photos' world instead of camera 0's frame."""
    # validate the inputs before the weights are loaded and the model is built
    host_images, host_cameras = network_inputs(images, cameras, views)
    return place(Reconstructor(weights, template, backend, precision, view_quirk)(host_images, host_cameras), cameras)
