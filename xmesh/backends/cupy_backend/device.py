"""The CuPy backend's device side: the GPU and its precision mode, kernel loading, uploads, the second
stream (:class:`StreamBranch`) and CUDA graph capture (:class:`CapturedGraph`); the stage modules
beside it add the operations (:class:`~xmesh.backends.cupy_backend.backend.CupyBackend` puts them together).
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from ...errors import BackendUnavailableError, InputError, KernelCompileError, XmeshError
from .. import cuda_kernels, kernel_manifest
from ..base import Backend, Branch
from ..cuda_kernels import get_function, require_cupy
from ..cudnn_conv import CudnnConv
from ..derived_cache import DerivedCache
from ..kernel_constants import CONVOLUTION_FILE, STAGE_DEFINES, defines
from ..pinned_upload import PinnedUploader
from . import hopper as hg

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
#: The Hopper deformation layer kernel's operands (hopper.OPERANDS) in each precision mode.
LAYER_OPERANDS = {"fp32": "3xtf32", "tf32": "tf32", "fp16": "fp16", "bf16": "bf16"}
THREADS = 256


def _grid(total: int, cap: int = 1 << 20) -> tuple:
    return (max(1, min((total + THREADS - 1) // THREADS, cap)),)


class GraphCaptureError(XmeshError, RuntimeError):
    """A function could not be captured as a CUDA Graph (e.g. it calls cuBLAS, which CuPy refuses under capture)."""


class CapturedGraph:
    """A CUDA Graph of one call of a function; ``replay()`` reruns it and returns the same output arrays.

    Inputs are read from the device arrays the function was captured with: copy new data into them
    (``arr[...] = new``) before a replay. The graph's intermediates live in a private memory pool
    kept alive by this object, so nothing else can be handed their memory.
    """

    def __init__(self, graph, stream, outputs, pool):
        self.graph, self.stream, self.outputs, self.pool = graph, stream, outputs, pool

    @property
    def nbytes(self) -> int:
        """Device memory the graph's private pool holds (its intermediates and outputs)."""
        return int(self.pool.total_bytes())

    def release(self) -> None:
        """Drop the graph and its outputs and give the pool's memory back; replay no more."""
        self.graph = self.outputs = None
        self.pool.free_all_blocks()

    def replay(self, synchronize: bool = False):
        """Launch the graph on the current stream (so events and later work order after it)."""
        import cupy

        stream = cupy.cuda.get_current_stream()
        self.graph.launch(stream)
        if synchronize:
            stream.synchronize()
        return self.outputs


class StreamBranch(Branch):
    """A :class:`~xmesh.backends.base.Branch` on a second CUDA stream. It waits for an event that the
    current stream records when the branch is made (so it may also reuse memory that earlier work
    freed), its blocks run with the branch's stream current, and ``join`` makes the stream current
    at the join wait for an event recorded after the last block. The stream is non-blocking, so
    the legacy default stream does not serialize the two; under stream capture the events bring
    the branch into the graph as a parallel path."""

    def __init__(self, cupy, stream):
        self.cupy, self.stream = cupy, stream
        stream.wait_event(cupy.cuda.get_current_stream().record(self._event()))
        self._done = None

    def __enter__(self):
        self.stream.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.stream.__exit__(*exc)
        self._done = self.stream.record(self._event())

    def join(self) -> None:
        if self._done is None:
            raise RuntimeError("Branch.join() before any work was queued on the branch")
        self.cupy.cuda.get_current_stream().wait_event(self._done)

    def _event(self):
        return self.cupy.cuda.Event(disable_timing=True)  # order only: no timestamps, allowed under capture


class CupyDevice(Backend):
    """The device, its mode and what every stage shares: kernel loading, arrays, uploads, streams, capture."""

    name = "cupy"

    def __init__(self, precision: str = "fp32", device: int | None = None):
        if precision not in PRECISIONS:
            raise InputError(f"precision={precision!r}: choose one of {', '.join(PRECISIONS)}")
        cupy = require_cupy()
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # the CUDA driver or runtime is missing or broken
            raise BackendUnavailableError(
                f"backend='cupy': no CUDA device was found (the CUDA runtime reported: {exc}); "
                "run on a machine with an NVIDIA GPU and driver, or use backend='numpy'"
            ) from exc
        if count < 1:
            raise BackendUnavailableError(
                "backend='cupy': no CUDA device was found; run on a machine with an NVIDIA GPU, or use backend='numpy'"
            )
        import array_api_compat.cupy as xp
        from cupy._core import _routines_linalg as linalg

        self.cupy = cupy
        self.xp = xp
        self.precision = precision
        self.device = cupy.cuda.Device(0 if device is None else device)
        self.sm_count = int(self.device.attributes["MultiProcessorCount"])
        self._max_shared_per_block = int(self.device.attributes["MaxSharedMemoryPerBlockOptin"])
        self._linalg = linalg
        self._fp32_type = getattr(linalg, "COMPUTE_TYPE_DEFAULT", 1)
        self._tf32_type = getattr(linalg, "COMPUTE_TYPE_TF32", 7)
        self._gemm_kernels: dict = {}
        #: weights prepared for our kernels and supports' mixing sources, made once per array
        self._derived = DerivedCache()
        self._branch_stream = None
        self.uploader = PinnedUploader(cupy)
        #: the block's score layer's products run in the last wide layer's epilogue where that layer is
        #: the chain's (op_drb_block_tail) or drb_layer_3xf16 (op_drb_last_layer_score); False writes x5 and
        #: runs the score layer on its own (for comparisons)
        self.fuse_drb_score = True
        #: the fp32 mode's deformation layers run as three float16 products on compute capability 9.0
        #: (HopperGemm.drb_layer_3xf16: 22-bit operand parts as 3xTF32's, at twice TF32's rate, the mixing
        #: on the input side); False runs them in 3xTF32 (HopperGemm.drb_layer, for comparisons)
        self.fp32_halves = True
        # products outside the deformation layers (CNN, graph convolutions): float32-accurate 3xTF32 in
        # fp32 mode; one TF32 pass in every speed mode (fp16 and bf16 reduce the deformation layers further)
        self.gemm_passes = 3 if precision == "fp32" else 1
        #: stage 1's projection a block per few points (graph_projection_tiled); False: a thread per channel
        self.tiled_graph_projection = True
        self._options = ("-std=c++17",) + defines(STAGE_DEFINES)
        with self.device:
            self._prepare_kernels()
            self._stage_kernel(CONVOLUTION_FILE, "im2col_nhwc")  # compile now: a broken toolchain fails at construction
            self.hopper = self._hopper_gemm()
            self._cudnn = None if self.gemm_passes != 1 else CudnnConv.create(cupy)  # its handle on this device
        if precision == "bf16" and self.hopper is None:
            cc = str(self.device.compute_capability)
            why = (
                "XMESH_HOPPER_GEMM=0 is set"
                if hg.supported(self.device)
                else f"this GPU has compute capability {cc[:-1]}.{cc[-1]}"
            )
            raise InputError(
                f"precision='bf16' runs in xmesh's Hopper kernel, which needs a GPU of compute "
                f"capability 9.0 (H100, H200), and {why}: use precision='fp16' or 'tf32' here"
            )

    def _prepare_kernels(self):
        """Start building the kernels this mode's reconstructions run on this GPU, all at once in background
        threads (kernel_manifest); each kernel waits for its build where it is first used, and a build that
        failed raises there (where the Hopper kernels fall back)."""
        hopper = os.environ.get("XMESH_HOPPER_GEMM", "1") != "0" and hg.supported(self.device)
        try:
            cuda_kernels.prepare(kernel_manifest.planned_builds(self.precision, hopper), wait=False)
        except KernelCompileError:
            pass

    def load_kernels(self) -> None:
        """Wait for this mode's planned kernels (``_prepare_kernels``), built or read from the caches."""
        hopper = os.environ.get("XMESH_HOPPER_GEMM", "1") != "0" and hg.supported(self.device)
        with self.device:
            try:
                cuda_kernels.load(kernel_manifest.planned_builds(self.precision, hopper))
            except KernelCompileError:  # raised again where the kernel is used (the Hopper ones fall back)
                pass

    def _hopper_gemm(self):
        """The wgmma GEMM on compute capability 9.0 (unless XMESH_HOPPER_GEMM=0), else None."""
        if os.environ.get("XMESH_HOPPER_GEMM", "1") == "0" or not hg.supported(self.device):
            return None
        try:
            return hg.HopperGemm(self.cupy)
        except KernelCompileError as exc:  # e.g. an NVRTC too old for sm_90a: the mma.sync kernel still works
            warnings.warn(
                f"xmesh: the Hopper GEMM is unavailable, using the mma.sync kernel instead ({exc})",
                RuntimeWarning,
                stacklevel=3,
            )
            return None

    @property
    def can_capture_network(self) -> bool:
        """Whether a whole reconstruction can be captured as a CUDA Graph (not in fp16 mode without the
        Hopper kernels, which uses cuBLAS)."""
        return self.precision != "fp16" or self.hopper is not None

    def _stage_kernel(self, filename: str, name: str):
        """Kernel ``name`` of a stage file (kernel_constants.STAGE_FILES), built with the stage constants."""
        try:
            return get_function(filename, name, self._options)
        except Exception:
            if "-DXM_NO_FP16" not in self._options:
                # NVRTC without cuda_fp16.h: build the fp32 kernels alone (fp16 then unavailable)
                if name.startswith("gconv_epilogue_f16"):
                    raise
                self._options += ("-DXM_NO_FP16",)
                return get_function(filename, name, self._options)
            raise

    def _kernel(self, name: str):
        """Kernel ``name`` of whichever stage file defines it (kernel_manifest.STAGE_KERNELS)."""
        return self._stage_kernel(kernel_manifest.stage_file(name), name)

    def asarray(self, array, dtype=np.float32):
        return self.cupy.ascontiguousarray(self.cupy.asarray(array, dtype=dtype))

    def copy_views_into(self, dst, host, views) -> None:
        """As :meth:`Backend.copy_views_into`: each run of adjacent views is one pitched host-to-device
        copy on the current stream, through pinned staging slots (``pinned_upload``); returns once
        the data is out of ``host``, so ``host`` may change afterwards."""
        cp = self.cupy
        batch, num_views = host.shape[:2]
        if dst.dtype != cp.float32 or not dst.flags.c_contiguous or dst.shape != (batch * num_views,) + host.shape[2:]:
            raise ValueError(
                f"copy_views_into: dst must be a C-contiguous float32 array of shape "
                f"{(batch * num_views,) + tuple(host.shape[2:])}, got {dst.dtype} {dst.shape}"
            )
        image = dst[0].nbytes
        stream = cp.cuda.get_current_stream()
        views = sorted(set(views))
        runs = [[v] for v in views[:1]]
        for v in views[1:]:
            if v == runs[-1][-1] + 1:
                runs[-1].append(v)
            else:
                runs.append([v])
        for run in runs:
            self.uploader.copy_rows(
                dst.data.ptr + run[0] * image, num_views * image, host[:, run[0] : run[-1] + 1], stream
            )

    def copy_into(self, dst, src) -> None:
        """dst[...] = src for a contiguous float32 device array dst: host data in one upload (through
        pinned slots when large), device data in one copy (src reshaped to dst's shape when the sizes
        agree)."""
        if isinstance(src, np.ndarray):
            if src.size != dst.size or not dst.flags.c_contiguous or dst.dtype != self.cupy.float32:
                raise ValueError(f"copy_into: {src.shape} host values do not fit device array {dst.dtype} {dst.shape}")
            rows = src.reshape(dst.shape if dst.ndim > 1 else (1, dst.size))
            self.uploader.copy_rows(
                dst.data.ptr, dst.nbytes // rows.shape[0], rows, self.cupy.cuda.get_current_stream()
            )
        else:
            dst[...] = self.cupy.reshape(src, dst.shape)

    def to_numpy(self, array):
        return self.cupy.asnumpy(array)

    def is_out_of_memory(self, exc: BaseException) -> bool:
        if isinstance(exc, (MemoryError, self.cupy.cuda.memory.OutOfMemoryError)):
            return True
        text = str(exc)
        return "ALLOC_FAILED" in text or "out of memory" in text.lower()

    def memory_bytes(self) -> tuple[int, int]:
        free, total = self.cupy.cuda.runtime.memGetInfo()
        return int(free), int(total)

    def held_bytes(self) -> int:
        return int(self.cupy.get_default_memory_pool().total_bytes())

    def release_memory(self) -> None:
        self.cupy.get_default_memory_pool().free_all_blocks()

    def synchronize(self) -> None:
        self.cupy.cuda.get_current_stream().synchronize()

    def branch(self) -> StreamBranch:
        if self._branch_stream is None:
            self._branch_stream = self.cupy.cuda.Stream(non_blocking=True)
        return StreamBranch(self.cupy, self._branch_stream)

    # ------------------------------------------------------------------ CUDA graphs
    def capture(self, fn, *args, warmup: int = 2) -> CapturedGraph:
        """Capture ``fn(*args)`` (device work only: no host transfers inside) as a CUDA Graph.

        ``fn`` runs ``warmup`` times first on a private stream and memory pool (compiling kernels,
        creating library handles and filling the pool), then once under stream capture.
        """
        cp = self.cupy
        pool = cp.cuda.MemoryPool()
        stream = cp.cuda.Stream(non_blocking=True)
        with cp.cuda.using_allocator(pool.malloc), stream:
            for _ in range(warmup):
                fn(*args)
            stream.synchronize()
            stream.begin_capture()
            try:
                outputs = fn(*args)
            except NotImplementedError as exc:
                stream.end_capture()
                raise GraphCaptureError(
                    f"CUDA Graph capture failed: {exc}. CuPy {cp.__version__} refuses every cuBLAS call "
                    "under stream capture, so only functions built from xmesh's own kernels and CuPy "
                    "element-wise operations can be captured (no matmul)"
                ) from exc
            except BaseException:
                stream.end_capture()
                raise
            graph = stream.end_capture()
        return CapturedGraph(graph, stream, outputs, pool)
