"""The GPU backend: CuPy arrays, cuBLAS GEMMs, cuSPARSE products and xmesh's own CUDA kernels.

Weights, the template and every intermediate stay on the device; a reconstruction makes no
device -> host copy. Kernels (``kernels/p2m_ops.cu``):

- ``graph_projection``: the whole stage-1 projection (camera transform, 4 gathers per view, max /
  mean / std over views, coordinates) in one launch;
- ``local_projection``: the whole stage-2 projection (transform, 3 x 4 bilinear taps per view,
  pooling) in one launch;
- ``drb_mix_epilogue``: the 43 x 43 mixing and relu(y0 + A y1 + b) (+ residual) of a local graph
  convolution in one pass, after the one GEMM y = X [W0 | W1] (on compute capability 9.0 the whole
  layer is one kernel instead, ``wg_drb_layer`` in ``kernels/wgmma_gemm.cu``);
- ``drb_score_update``: a deformation block's narrow last layer (float32 sums), the softmax over the 43
  hypotheses and the new vertex positions in one launch (``hypothesis_softmax_update``: the softmax
  and update alone; ``drb_score_finish``: the same from the score layer's products, which the 16-bit
  modes' chained block kernel and the fp32 mode's last wide layer leave instead of its activations);
- ``csr_gconv`` / ``csr_gconv_x4`` (4 columns a thread): stage 1's graph convolution after its
  GEMM (support 1 in CSR, bias, ReLU, and the residual layers' averaging);
- ``conv_*`` (implicit GEMM, tc_gemm.cu), ``conv_direct_x4`` (the 3-channel first layer, float32) or
  ``im2col_nhwc`` + GEMM, bias and ReLU fused: 'SAME' convolutions. In the speed modes the large
  stride-1 ones go to cuDNN where it is installed (``cudnn_conv.py``, through ctypes: CuPy 14 no
  longer reaches it).

Every matrix product runs through xmesh's own tensor-core GEMMs: on compute capability 9.0 (H100,
H200) the large ones through warpgroup MMAs (``kernels/wgmma_gemm.cu``, ``hopper_gemm.py``), the rest
and every product on other GPUs through mma.sync (``kernels/tc_gemm.cu``). So a whole
reconstruction is built from our kernels, CuPy element-wise kernels and (speed modes) cuDNN's
convolutions, and can be captured as one CUDA Graph (CuPy refuses cuBLAS under stream capture).

Precision: ``fp32`` (default: every product as "3xTF32", operands split into two TF32 parts and
three tensor-core products accumulated in float32, which keeps float32 accuracy), ``tf32`` (one
TF32 product: ~1e-3 relative error), ``fp16`` and ``bf16`` (the deformation layers' products with
float16 / bfloat16 operands and float32 accumulation, the CNN, stage 1 and the rest as in ``tf32``).
On compute capability 9.0 the 16-bit modes run in the Hopper layer kernel and can be captured; on
other GPUs ``fp16`` runs those products through cuBLAS (no capture) and ``bf16`` is refused (CuPy
has no bfloat16 arrays). The camera arithmetic is always exact float32.
"""
from __future__ import annotations

import contextlib
import os
import warnings

import numpy as np

from ..errors import BackendUnavailableError, InputError, KernelCompileError, XmeshError
from .base import Backend, Branch
from . import cuda_kernels, hopper_gemm, kernel_manifest, plan
from .cuda_kernels import get_function, require_cupy
from .cudnn_conv import CudnnConv, CudnnError
from .derived_cache import DerivedCache
from .kernel_constants import (GEMM_BK, GEMM_BM, GEMM_DEFINES, GEMM_FILE, GEMM_STAGES, GEMM_THREADS,
                               GRAPH_POINTS, GRAPH_THREADS, HYPOTHESES, LOCAL_POINTS, LOCAL_TAP_BYTES, LOCAL_THREADS,
                               MAX_VIEWS, P2M_DEFINES, P2M_FILE, ROWS_BF16, ROWS_F16, ROWS_F32, SCORE_THREADS,
                               SCORE_VERTICES, SKINNY_MAX_COLS, SKINNY_MAX_K, defines)
from .numpy_backend import same_padding
from .pinned_upload import PinnedUploader

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
#: The Hopper deformation layer kernel's operands (hopper_gemm.OPERANDS) in each precision mode.
LAYER_OPERANDS = {"fp32": "3xtf32", "tf32": "tf32", "fp16": "fp16", "bf16": "bf16"}
THREADS = 256
#: conv_direct_x4 (few input channels): the largest kernel it holds in shared memory
DIRECT_CONV_WEIGHT_BYTES = 48 * 1024
#: Largest im2col buffer (elements) built at once; larger convolutions run in image chunks.
IM2COL_LIMIT = 1 << 28
#: A product with fewer output tiles than plan.GEMM_TARGET_BLOCKS splits K into parts of at least this
#: many columns of K, or of GEMM_SPLIT_MIN_K_FEW when there are fewer than GEMM_FEW_TILES tiles (stage
#: 1's 156- and 618-vertex graph convolutions).
GEMM_SPLIT_MIN_K = 256
GEMM_SPLIT_MIN_K_FEW, GEMM_FEW_TILES = 32, 24
#: A product with fewer output tiles than multiprocessors takes tiles half as wide, down to this many
#: columns, before K is split (stage 1's graph convolutions at b=1).
GEMM_NARROWEST = 16
#: The row format code (kernel_constants.ROWS_*) of each activation type the p2m_ops.cu kernels read.
ROW_FORMATS = {"float32": ROWS_F32, "float16": ROWS_F16, "uint16": ROWS_BF16}


def _tile_width(n: int) -> int:
    """Columns of C per block of the tc_gemm.cu kernels for an N-wide product: 128 when N is a multiple
    of it, else the narrowest of 16/32/64 that covers N (64 beyond)."""
    if n % 128 == 0:
        return 128
    return 16 if n <= 16 else 32 if n <= 32 else 64


def _rows_16byte(cp, x):
    """x (B,N,C) float32 as a (B*N, C) view when its rows are evenly spaced, 16-byte aligned and a
    multiple of 16 bytes apart with unit column stride (a projection's padded rows), else None."""
    if x.dtype != cp.float32 or x.ndim != 3 or x.size == 0:
        return None
    b, n, c = x.shape
    col, row = x.strides[2], x.strides[1]
    if col != 4 or row % 16 or x.data.ptr % 16 or row < 4 * c or (b > 1 and x.strides[0] != n * row):
        return None
    return cp.lib.stride_tricks.as_strided(x, (b * n, c), (row, 4))


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
        return self.cupy.cuda.Event(disable_timing=True)   # order only: no timestamps, allowed under capture


class CupyBackend(Backend):
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
        self._options = ("-std=c++17",) + defines(P2M_DEFINES)
        with self.device:
            self._prepare_kernels()
            self._kernel("im2col_nhwc")  # compile now: a broken toolchain fails at construction
            self.hopper = self._hopper_gemm()
            self._cudnn = None if self.gemm_passes != 1 else CudnnConv.create(cupy)   # its handle on this device
        if precision == "bf16" and self.hopper is None:
            cc = str(self.device.compute_capability)
            why = "XMESH_HOPPER_GEMM=0 is set" if hopper_gemm.supported(self.device) else \
                f"this GPU has compute capability {cc[:-1]}.{cc[-1]}"
            raise InputError(f"precision='bf16' runs in xmesh's Hopper kernel, which needs a GPU of compute "
                             f"capability 9.0 (H100, H200), and {why}: use precision='fp16' or 'tf32' here")

    def _prepare_kernels(self):
        """Start building the kernels this mode's reconstructions run on this GPU, all at once in background
        threads (kernel_manifest); each kernel waits for its build where it is first used, and a build that
        failed raises there (where the Hopper kernels fall back)."""
        hopper = os.environ.get("XMESH_HOPPER_GEMM", "1") != "0" and hopper_gemm.supported(self.device)
        try:
            cuda_kernels.prepare(kernel_manifest.planned_builds(self.precision, hopper), wait=False)
        except KernelCompileError:
            pass

    def _hopper_gemm(self):
        """The wgmma GEMM on compute capability 9.0 (unless XMESH_HOPPER_GEMM=0), else None."""
        if os.environ.get("XMESH_HOPPER_GEMM", "1") == "0" or not hopper_gemm.supported(self.device):
            return None
        try:
            return hopper_gemm.HopperGemm(self.cupy)
        except KernelCompileError as exc:   # e.g. an NVRTC too old for sm_90a: the mma.sync kernel still works
            warnings.warn(f"xmesh: the Hopper GEMM is unavailable, using the mma.sync kernel instead ({exc})",
                          RuntimeWarning, stacklevel=3)
            return None

    @property
    def can_capture_network(self) -> bool:
        """Whether a whole reconstruction can be captured as a CUDA Graph (not in fp16 mode without the
        Hopper kernels, which uses cuBLAS)."""
        return self.precision != "fp16" or self.hopper is not None

    # ------------------------------------------------------------------ basics
    def _kernel(self, name: str):
        try:
            return get_function(P2M_FILE, name, self._options)
        except Exception:
            if "-DXM_NO_FP16" not in self._options:
                # NVRTC without cuda_fp16.h: build the fp32 kernels alone (fp16 then unavailable)
                if name.startswith("gconv_epilogue_f16"):
                    raise
                self._options += ("-DXM_NO_FP16",)
                return get_function(P2M_FILE, name, self._options)
            raise

    def asarray(self, array, dtype=np.float32):
        return self.cupy.ascontiguousarray(self.cupy.asarray(array, dtype=dtype))

    def copy_views_into(self, dst, host, views) -> None:
        """As :meth:`Backend.copy_views_into`: each run of adjacent views is one pitched host-to-device
        copy on the current stream, through pinned staging slots (``pinned_upload``); returns once
        the data is out of ``host``, so ``host`` may change afterwards."""
        cp = self.cupy
        batch, num_views = host.shape[:2]
        if dst.dtype != cp.float32 or not dst.flags.c_contiguous or dst.shape != (batch * num_views,) + host.shape[2:]:
            raise ValueError(f"copy_views_into: dst must be a C-contiguous float32 array of shape "
                             f"{(batch * num_views,) + tuple(host.shape[2:])}, got {dst.dtype} {dst.shape}")
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
            self.uploader.copy_rows(dst.data.ptr + run[0] * image, num_views * image, host[:, run[0]:run[-1] + 1], stream)

    def copy_into(self, dst, src) -> None:
        """dst[...] = src for a contiguous float32 device array dst: host data in one upload (through
        pinned slots when large), device data in one copy (src reshaped to dst's shape when the sizes
        agree)."""
        if isinstance(src, np.ndarray):
            if src.size != dst.size or not dst.flags.c_contiguous or dst.dtype != self.cupy.float32:
                raise ValueError(f"copy_into: {src.shape} host values do not fit device array {dst.dtype} {dst.shape}")
            rows = src.reshape(dst.shape if dst.ndim > 1 else (1, dst.size))
            self.uploader.copy_rows(dst.data.ptr, dst.nbytes // rows.shape[0], rows, self.cupy.cuda.get_current_stream())
        else:
            dst[...] = self.cupy.reshape(src, dst.shape)

    def to_numpy(self, array):
        return self.cupy.asnumpy(array)

    def is_out_of_memory(self, exc: BaseException) -> bool:
        if isinstance(exc, (MemoryError, self.cupy.cuda.memory.OutOfMemoryError)):
            return True
        text = str(exc)
        return "ALLOC_FAILED" in text or "out of memory" in text.lower()

    def release_memory(self) -> None:
        self.cupy.get_default_memory_pool().free_all_blocks()

    def synchronize(self) -> None:
        self.cupy.cuda.get_current_stream().synchronize()

    def branch(self) -> StreamBranch:
        if self._branch_stream is None:
            self._branch_stream = self.cupy.cuda.Stream(non_blocking=True)
        return StreamBranch(self.cupy, self._branch_stream)

    # ------------------------------------------------------------------ GEMM
    def _gemm_kernel(self, name: str, bn: int, bk: int = GEMM_BK):
        """A kernel of tc_gemm.cu (gemm_* or conv_*) built for K slices of ``bk``, and that width (the
        pair ``_launch_tc`` takes), with its shared-memory opt-in set once."""
        entry = self._gemm_kernels.get((name, bk))
        if entry is None:
            kernel = get_function(GEMM_FILE, name, ("-std=c++17",) + defines(GEMM_DEFINES, XG_BK=bk))
            kernel.max_dynamic_shared_size_bytes = self._gemm_smem(bn, bk)   # > 48 KB needs the opt-in
            entry = self._gemm_kernels[(name, bk)] = (kernel, bk)
        return entry

    @staticmethod
    def _gemm_smem(bn: int, bk: int) -> int:
        return GEMM_STAGES * (GEMM_BM * (bk + 4) + bk * (bn + 8)) * 4

    def _hopper_weight(self, b, operands: str, cache_key, paired: bool = False):
        """b prepared for the Hopper kernels (``operands``: a key of hopper_gemm.OPERANDS); kept per
        (cache_key, operands, paired) when cache_key (a weight array that lives as long as the model)
        is given, so a layer's weights are split once."""
        if cache_key is None:
            return self.hopper.prepare(b, operands, paired)
        return self._derived.get((cache_key,), ("hopper", operands, paired, tuple(b.shape)),
                                 lambda: self.hopper.prepare(b, operands, paired))

    def gemm(self, a, b, out=None, bias=None, relu: bool = False, passes: int | None = None, cache_key=None):
        """``act(a @ b + bias)`` for float32 a (M,K), b (K,N) on the tensor cores (our kernels).

        ``passes`` 3 (3xTF32, float32 accuracy) or 1 (TF32); default: the backend's precision.
        ``a`` and ``out`` may be row-strided views (unit column stride); ``out`` defaults to a new (M,N).
        ``cache_key``: a long-lived array ``b`` comes from (a layer's weights); on the Hopper path its
        prepared form is then kept instead of being rebuilt each call.
        """
        cp = self.cupy
        if a.dtype != cp.float32 or b.dtype != cp.float32:
            raise InputError(f"gemm takes float32 operands, got {a.dtype} and {b.dtype}")
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise InputError(f"gemm: shapes {a.shape} and {b.shape} do not multiply")
        if a.strides[1] != 4 or a.strides[0] % 4:
            a = cp.ascontiguousarray(a)
        if b.strides[1] != 4 or b.strides[0] % 4:
            b = cp.ascontiguousarray(b)
        m, k = a.shape
        n = b.shape[1]
        if out is None:
            out = cp.empty((m, n), dtype=cp.float32)
        elif out.shape != (m, n) or out.dtype != cp.float32 or out.strides[1] != 4:
            raise InputError(f"gemm: out must be float32 ({m}, {n}) with unit column stride, got {out.dtype} {out.shape}")
        if m == 0 or n == 0:
            return out
        if k == 0:
            out[...] = 0.0 if bias is None else cp.maximum(bias, 0.0) if relu else bias
            return out
        passes = self.gemm_passes if passes is None else passes
        if self.hopper is not None and plan.gemm_on_hopper(m, n):
            return self.hopper(a, self._hopper_weight(b, "3xtf32" if passes == 3 else "tf32", cache_key), out, bias, relu)
        lda, ldb = a.strides[0] // 4, b.strides[0] // 4
        # 16-byte copies: rows 16-byte aligned; K may end inside one (the copy zero-fills past K)
        vec = lda % 4 == 0 and ldb % 4 == 0 and n % 4 == 0 and a.data.ptr % 16 == 0 and b.data.ptr % 16 == 0
        bn = _tile_width(n)
        while bn > GEMM_NARROWEST and n % (bn // 2) == 0 and -(-m // GEMM_BM) * (n // bn) < self.sm_count:
            bn //= 2   # fewer tiles than multiprocessors (stage 1's graph convolutions): narrower ones
        bk = plan.gemm_k_slice(passes, m, n, bn)
        entry = self._gemm_kernel(f"gemm_{passes}x_n{bn}_{'v' if vec else 's'}", bn, bk)
        return self._launch_tc(entry, (a, np.int64(lda)), b, out, m, k, bn, bias, relu)

    def _launch_tc(self, entry: tuple, a_args: tuple, b, out, m: int, k: int, bn: int, bias, relu: bool):
        """Launch a kernel of tc_gemm.cu (``entry``: ``_gemm_kernel``'s (kernel, K slice width); A given
        by ``a_args``, B by ``b``) over (M/128 x N/bn) tiles, splitting K when there are few tiles (the
        CNN's deep layers at small batch)."""
        kernel, bk = entry
        cp = self.cupy
        n = b.shape[1]
        ldb, ldc = b.strides[0] // 4, out.strides[0] // 4
        tiles = -(-m // GEMM_BM) * -(-n // bn)
        # few output tiles and a long K: split K so more multiprocessors get work
        min_k = GEMM_SPLIT_MIN_K_FEW if tiles < GEMM_FEW_TILES else GEMM_SPLIT_MIN_K
        splits = max(1, min(-(-plan.GEMM_TARGET_BLOCKS // tiles), k // min_k))
        bias_arg = np.uint64(0) if bias is None else bias
        smem = self._gemm_smem(bn, bk)
        if splits == 1:
            kernel((tiles, 1), (GEMM_THREADS,),
                   (*a_args, b, np.int64(ldb), out, np.int64(ldc), np.int32(m), np.int32(n), np.int32(k),
                    bias_arg, np.int32(bool(relu)), np.int32(k), np.int64(0)), shared_mem=smem)
            return out
        chunk = -(-k // (splits * bk)) * bk
        splits = -(-k // chunk)
        parts = cp.empty((splits, m, n), dtype=cp.float32)
        kernel((tiles, splits), (GEMM_THREADS,),
               (*a_args, b, np.int64(ldb), parts, np.int64(n), np.int32(m), np.int32(n), np.int32(k),
                np.uint64(0), np.int32(0), np.int32(chunk), np.int64(m * n)), shared_mem=smem)
        get_function(GEMM_FILE, "gemm_splitk_reduce", ("-std=c++17",) + defines(GEMM_DEFINES, XG_BK=GEMM_BK))(
            _grid(m * n), (THREADS,),
            (parts, np.int32(splits), np.int64(m * n), np.int32(m), np.int32(n), out, np.int64(ldc), bias_arg,
             np.int32(bool(relu))))
        return out

    @contextlib.contextmanager
    def _math(self):
        """float32 GEMMs on the tensor cores (TF32) in ``tf32`` mode, plain float32 otherwise."""
        old = self._linalg.get_compute_type(np.float32)
        self._linalg.set_compute_type(np.float32, self._tf32_type if self.precision == "tf32" else self._fp32_type)
        try:
            yield
        finally:
            self._linalg.set_compute_type(np.float32, old)

    def sparse(self, csr_host):
        import cupyx.scipy.sparse as csp
        import scipy.sparse

        host = scipy.sparse.csr_matrix(csr_host, dtype=np.float32)
        host.sum_duplicates()
        host.sort_indices()
        return csp.csr_matrix(host)

    def spmm(self, sparse_matrix, dense):
        cp = self.cupy
        if dense.ndim == 2:
            return cp.ascontiguousarray(sparse_matrix @ cp.ascontiguousarray(dense))
        b, n, c = dense.shape
        wide = cp.ascontiguousarray(cp.transpose(dense, (1, 0, 2))).reshape(n, b * c)
        out = sparse_matrix @ wide
        return cp.ascontiguousarray(cp.transpose(out.reshape(out.shape[0], b, c), (1, 0, 2)))

    # ------------------------------------------------------------------ convolution
    def conv2d_same(self, x, weight, bias, stride: int, relu: bool = True):
        """'SAME' convolution of NHWC x: implicit GEMM (the tc_gemm.cu conv kernels read x directly)
        when the input channels are a multiple of 16; direct float32 sums (``conv_direct_x4``) for
        fewer (the 3-channel first layer) when cout is a multiple of 4; else im2col + GEMM."""
        cp = self.cupy
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        n, h, w, cin = x.shape
        kh, kw, _, cout = weight.shape
        ho, top, _ = same_padding(h, kh, stride)
        wo, left, _ = same_padding(w, kw, stride)
        k = kh * kw * cin
        flat_w = weight.reshape(k, cout)
        out = cp.empty((n, ho, wo, cout), dtype=cp.float32)
        if self._cudnn is not None and relu and bias is not None \
                and plan.conv_on_cudnn(x.shape, weight.shape, stride):
            try:
                self._cudnn.conv2d_same_relu(x, weight, bias, out)
                return out
            except CudnnError as exc:   # e.g. a cuDNN built for another CUDA: our kernels take over for good
                warnings.warn(f"xmesh: cuDNN's convolution failed, using xmesh's own kernels from now on ({exc}); "
                              "set XMESH_CUDNN=0 to skip cuDNN", RuntimeWarning, stacklevel=2)
                self._cudnn = None
        if cin % GEMM_BK == 0 and cout % 4 == 0 and flat_w.flags.c_contiguous and flat_w.data.ptr % 16 == 0:
            bn = _tile_width(cout)
            entry = self._gemm_kernel(f"conv_{self.gemm_passes}x_n{bn}", bn)
            geometry = (x, np.int32(h), np.int32(w), np.int32(cin), np.int32(kw), np.int32(stride), np.int32(ho),
                        np.int32(wo), np.int32(top), np.int32(left))
            return self._launch_tc(entry, geometry, flat_w, out.reshape(n * ho * wo, cout), n * ho * wo, k, bn,
                                   bias, relu).reshape(out.shape)
        if cin < GEMM_BK and cout % 4 == 0 and k * cout * 4 <= DIRECT_CONV_WEIGHT_BYTES \
                and h * w * cin < 2**31 and n < 65536:   # grid (ho, n); 32-bit offsets within an image
            bias_arg = np.uint64(0) if bias is None else cp.ascontiguousarray(bias, dtype=cp.float32)
            if (cin, kh, kw, stride, cout) == (3, 3, 3, 1, 16) and wo <= 1024:   # the CNNs' first layer
                self._kernel("conv_direct_c3_k3_n16")(   # a block per output row, a thread per pixel
                    (ho, n), (-(-wo // 32) * 32,),
                    (x, cp.ascontiguousarray(flat_w, dtype=cp.float32), bias_arg, out, np.int32(h), np.int32(w),
                     np.int32(wo), np.int32(top), np.int32(left), np.int32(bool(relu))))
                return out
            self._kernel("conv_direct_x4")(   # a block per output row
                (ho, n), (THREADS,),
                (x, cp.ascontiguousarray(flat_w, dtype=cp.float32), bias_arg, out, np.int32(h), np.int32(w),
                 np.int32(cin), np.int32(kh), np.int32(kw), np.int32(stride), np.int32(wo), np.int32(top),
                 np.int32(left), np.int32(cout), np.int32(bool(relu))),
                shared_mem=k * cout * 4)
            return out
        chunk = max(1, IM2COL_LIMIT // (ho * wo * k))
        im2col = self._kernel("im2col_nhwc")
        for start in range(0, n, chunk):
            part = x[start:start + chunk]
            m = part.shape[0]
            if kh == 1 and kw == 1 and stride == 1:
                cols = part.reshape(m * h * w, cin)
            else:
                cols = cp.empty((m * ho * wo, k), dtype=cp.float32)
                im2col(_grid(cols.size), (THREADS,),
                       (part, cols, np.int32(m), np.int32(h), np.int32(w), np.int32(cin), np.int32(kh),
                        np.int32(kw), np.int32(stride), np.int32(ho), np.int32(wo), np.int32(top), np.int32(left)))
            y = out[start:start + m].reshape(m * ho * wo, cout)
            self.gemm(cols, flat_w, out=y, bias=bias, relu=relu, cache_key=weight)
        return out

    # ------------------------------------------------------------------ fast paths
    def _projection(self, kernel: str, points, maps, tf, count: int, padded: int, *extra, out16: str = "",
                    carried=None):
        """Launch a projection kernel: one thread per (sample, point, channel of the maps' concatenation),
        or for the local projection with channel counts a multiple of 4, one block per LOCAL_POINTS
        points. ``out16`` ("fp16" / "bf16", local projection only): the output in that mode's 16-bit
        activation type (hopper_gemm.activation_dtype), rows padded to a multiple of 8 elements, where
        the tiled kernel applies (float32 otherwise). ``carried`` (B,N,E) float32: columns that follow
        the projection's in each row (rows then padded to a multiple of 4 floats)."""
        cp = self.cupy
        if len(maps) != count:
            raise InputError(f"the {kernel} kernel takes {count} maps, got {len(maps)}")
        if tf.num_views > MAX_VIEWS:
            raise InputError(f"the projection kernels take at most {MAX_VIEWS} views, got {tf.num_views}")
        points = cp.ascontiguousarray(points, dtype=cp.float32)
        batch, n, _ = points.shape
        maps = [cp.ascontiguousarray(m, dtype=cp.float32) for m in maps]
        sizes = [np.int32(m.shape[1] - padded) for m in maps]
        chans = [np.int32(m.shape[3]) for m in maps]
        ct = int(sum(int(c) for c in chans))
        width = 3 + 3 * ct
        extra_cols = 0 if carried is None else carried.shape[-1]
        # rows padded to a multiple of 4 floats (a view of the first `width` is returned), so the layer
        # that reads them can copy 16 bytes at a time: stage 2's, and stage 1's where it appends columns
        # (its next layer then reads (M, 3075) with rows 3076 apart; pad column never read)
        row = -(-(width + extra_cols) // 4) * 4 if kernel == "local_projection" or carried is not None else width
        row16 = -(-width // 8) * 8
        tiled_shared = LOCAL_POINTS * ((row16 * 2 if out16 else row * 4) + 3 * tf.num_views * LOCAL_TAP_BYTES)
        tiled = (kernel == "local_projection" and all(c % 4 == 0 for c in chans)
                 and tiled_shared <= self._max_shared_per_block   # its rows in shared memory: up to ~580 channels (float32)
                 and all(m.shape[1] * m.shape[2] * m.shape[3] * tf.num_views < 2**31 for m in maps))   # 32-bit offsets
        dtype, shared, block = cp.float32, 0, THREADS
        grid = ((batch * n * ct + THREADS - 1) // THREADS,)
        if tiled and all(m.data.ptr % 16 == 0 for m in maps):
            # a block per LOCAL_POINTS points: their bilinear corners once in shared memory, then a thread
            # per 4 channels with 16-byte gathers
            kernel, grid = "local_projection_tiled", ((batch * n + LOCAL_POINTS - 1) // LOCAL_POINTS,)
            if out16:   # 16-bit rows of a multiple of 8 elements: 16-byte aligned for the layer's copies
                kernel, dtype, row = "local_projection_tiled_o16", hopper_gemm.activation_dtype(cp, out16), row16
            block, shared = LOCAL_THREADS, tiled_shared
        if (kernel == "graph_projection" and self.tiled_graph_projection and all(c % 4 == 0 for c in chans)
                and all(m.size < 2**31 and m.data.ptr % 16 == 0 for m in maps)):   # 32-bit offsets, 16-byte gathers
            # a block per GRAPH_POINTS points: their pixels once in shared memory, a thread per 4 channels
            kernel, grid, block = "graph_projection_tiled", (-(-(batch * n) // GRAPH_POINTS),), GRAPH_THREADS
        out = cp.empty((batch, n, row), dtype=dtype)
        args = (points, tf.packed, *maps, *sizes, *chans, np.int32(batch), np.int32(n), np.int32(tf.num_views), *extra,
                out, np.int64(row))
        if dtype != cp.float32:
            args += (np.int32(out16 == "bf16"),)
        function = self._kernel(kernel)
        if shared > 48 * 1024 and function.max_dynamic_shared_size_bytes < shared:
            function.max_dynamic_shared_size_bytes = shared   # > 48 KB needs the opt-in
        function(grid, (block,), args, shared_mem=shared)
        width += extra_cols
        if extra_cols:
            out[..., width - extra_cols:width] = carried
        return out if row == width else out[..., :width]

    def op_graph_projection(self, coords, maps, tf, view_quirk=True, carried=None, map_views=None):
        """The stage-1 projection in one kernel; ``carried``'s columns are written after it into the same
        rows, padded to 16 bytes (op_graph_conv reads them in place: no concatenation, no padded copy).
        ``map_views``: views per sample in ``maps`` (the model's check); None: every view."""
        if map_views is None:
            map_views = tf.num_views
        if carried is not None:
            carried = self.cupy.asarray(carried, dtype=self.cupy.float32)
            if carried.shape[:2] != coords.shape[:2]:
                raise InputError(f"graph projection: carried features of shape {carried.shape} for {coords.shape[:2]} points")
        return self._projection("graph_projection", coords, maps, tf, 4, 0, np.int32(bool(view_quirk)),
                                np.int32(map_views), carried=carried)

    def op_local_projection(self, points, maps, tf):
        """The stage-2 projection; in the 16-bit modes on an H100/H200 its output is already in the
        mode's 16 bits (the values the block's first layer rounds its X to, so the same layer)."""
        operands = LAYER_OPERANDS[self.precision]
        out16 = operands if self.hopper is not None and hopper_gemm.OPERANDS[operands].is_16bit else ""
        return self._projection("local_projection", points, maps, tf, 3, 1, out16=out16)

    def op_graph_conv(self, layer, x, supports, residual=None, pool_idx=None):
        """Stage-1 graph convolution when support 0 is the identity: one GEMM, then one CSR kernel
        (bias, ReLU and the residual step included). With ``pool_idx`` the GEMM's output is unpooled
        (one kernel) before the CSR kernel (graph.graph_conv's order)."""
        cp = self.cupy
        s0, s1 = supports
        if s0 is not None or layer.weight0 is not None:
            return None
        b, n, cin = x.shape
        cout = layer.cout
        weight = layer.weight
        x2 = _rows_16byte(cp, x)   # a projection's rows, padded to 16 bytes, read in place
        if x2 is None:
            x2 = cp.ascontiguousarray(x, dtype=cp.float32).reshape(b * n, cin)
            if cin % 4:   # the first layers' 2883 / 3075 inputs: rows padded to 16 bytes for the vector loads
                x2, weight = self._pad_k(x2), self._padded_weight(layer.weight)
        y = self.gemm(x2, weight, cache_key=weight)   # (B*N, 2*cout)
        if pool_idx is not None:
            y = self.op_unpool(y.reshape(b, n, 2 * cout), pool_idx)
            if y is None:
                return None
            n = y.shape[1]
            y = y.reshape(b * n, 2 * cout)
        if s1.shape != (n, n):
            raise InputError(f"graph_conv: support of shape {s1.shape} for {n} vertices")
        if residual is not None:
            residual = cp.ascontiguousarray(residual, dtype=cp.float32)
            if residual.shape != (b, n, cout):
                raise InputError(f"graph_conv: residual of shape {residual.shape}, expected {(b, n, cout)}")
        out = cp.empty((b, n, cout), dtype=cp.float32)
        total, kernel = out.size, "csr_gconv"
        if cout % 4 == 0 and total < 2**31 and all(a.data.ptr % 16 == 0 for a in (y, layer.bias, out)) \
                and (residual is None or residual.data.ptr % 16 == 0):
            total, kernel = total // 4, "csr_gconv_x4"   # 4 columns a thread, 32-bit indices
        self._kernel(kernel)(
            ((total + THREADS - 1) // THREADS,), (THREADS,),
            (s1.indptr, s1.indices, s1.data, y, np.int32(2 * cout), np.int32(cout), layer.bias,
             np.uint64(0) if residual is None else residual, out,
             np.int32(b), np.int32(n), np.int32(cout), np.int32(bool(layer.relu))))
        return out

    def _pad_k(self, x2):
        """(M, K) -> (M, K rounded up to 4) with zero columns appended."""
        m, k = x2.shape
        padded = self.cupy.empty((m, k + (-k % 4)), dtype=self.cupy.float32)
        padded[:, k:] = 0.0
        padded[:, :k] = x2
        return padded

    def _padded_weight(self, weight):
        """``weight`` (K, N) with zero rows up to a multiple of 4, made once per weight array."""
        def make():
            k = weight.shape[0]
            padded = self.cupy.zeros((k + (-k % 4), weight.shape[1]), dtype=self.cupy.float32)
            padded[:k] = weight
            return padded

        return self._derived.get((weight,), "pad_k", make)

    def op_unpool(self, x, pool_idx):
        """x (B,N,C) followed by the midpoints of pool_idx's edges, in one kernel (graph.unpool's arithmetic)."""
        cp = self.cupy
        if x.dtype != cp.float32 or pool_idx.dtype != cp.int64 or pool_idx.ndim != 2 or pool_idx.shape[1] != 2:
            return None
        x = cp.ascontiguousarray(x)
        edges = cp.ascontiguousarray(pool_idx)
        b, n, c = x.shape
        e = edges.shape[0]
        out = cp.empty((b, n + e, c), dtype=cp.float32)
        if out.size:
            self._kernel("unpool_midpoints")((b * (n + e),), (THREADS,),
                                             (x, edges, out, np.int32(n), np.int32(e), np.int32(c)))
        return out

    def _local_weights(self, layer, cheb1, cheb0):
        """(W0, W1, bias, A1, A0) in the GEMM dtype, split once per (layer, supports) objects."""
        def make():
            cp = self.cupy
            dtype = cp.float16 if self.precision == "fp16" else cp.float32
            cout = layer.cout
            if layer.weight0 is None:
                w0, w1 = layer.weight[:, :cout], layer.weight[:, cout:]
            else:
                w0, w1 = layer.weight0, layer.weight
            return (cp.ascontiguousarray(w0, dtype=dtype), cp.ascontiguousarray(w1, dtype=dtype),
                    cp.ascontiguousarray(layer.bias, dtype=cp.float32), cp.ascontiguousarray(cheb1, dtype=dtype),
                    None if cheb0 is None else cp.ascontiguousarray(cheb0, dtype=dtype))

        return self._derived.get((layer, cheb1, cheb0), "local", make)

    def _mix(self, a, y):
        """a (K,K) applied over axis 1 of y (B,K,N,C): one GEMM per sample over (K, N*C)."""
        cp = self.cupy
        b, k, n, c = y.shape
        out = cp.empty_like(y)
        flat_y, flat_out = y.reshape(b, k, n * c), out.reshape(b, k, n * c)
        if y.dtype == cp.float32 and b > 1:
            cp.matmul(a, flat_y, out=flat_out)
        else:
            for i in range(b):
                cp.matmul(a, flat_y[i], out=flat_out[i])
        return out

    def _prepared_chain(self, layers, x, cheb0):
        """The block's five wide layers prepared for ``HopperGemm.drb_chain16`` (made once per layer
        set), or None where the chained kernel does not run them: off Hopper, in the float32 modes,
        with a non-identity first support, other widths, or an X it does not take."""
        operands = LAYER_OPERANDS[self.precision]
        z = hopper_gemm.WIDE_COLS
        if (self.hopper is None or not hopper_gemm.OPERANDS[operands].is_16bit
                or cheb0 is not None or len(layers) != hopper_gemm.CHAIN.hidden_layers + 1
                or any(layer.weight0 is not None for layer in layers)
                or layers[0].weight.shape != (x.shape[-1], 2 * z) or not 0 < x.shape[-1] <= hopper_gemm.CHAIN_MAX_CIN
                or any(layer.weight.shape != (z, 2 * z) for layer in layers[1:])
                or x.dtype != hopper_gemm.activation_dtype(self.cupy, operands)
                or not plan.chain_takes(x, x.shape[-1])):
            return None
        def make():
            weights = [self._hopper_weight(layer.weight, operands, layer.weight) for layer in layers]
            return self.hopper.prepare_chain16(weights[0], weights[1:], [layer.bias for layer in layers])

        return self._derived.get(tuple(layer.weight for layer in layers), ("chain", operands), make)

    def op_drb_block_layers(self, layers, x, cheb1, cheb0=None):
        """A deformation block's five wide layers (the projected features X -> x5, in the model's
        ``block_tail``) in one Hopper kernel in the 16-bit modes (``HopperGemm.drb_chain16``: the
        activations stay in shared memory); None
        elsewhere, and the model runs the layers one by one."""
        chain = self._prepared_chain(layers, x, cheb0)
        return None if chain is None else self.hopper.drb_chain16(x, chain, self._mixing_source(cheb1))

    def op_drb_block_tail(self, layers, x, cheb1, cheb0, centers, offsets):
        """A deformation block from its projected features X to the moved vertices (the model's
        ``block_tail``) where the five wide layers chain (``op_drb_block_layers``): the score layer's
        two products in the last wide layer's epilogue (``drb_chain16`` with ``score_weight``: x5
        never leaves the chip, 8 bytes a row come back instead of 384), then ``drb_score_finish``
        mixes them, adds the bias, takes the softmax and moves the vertices (``drb_score_update``'s
        arithmetic, its float32 products summed in another order). None elsewhere."""
        score = layers[-1]
        if (not self.fuse_drb_score or len(layers) != hopper_gemm.CHAIN.hidden_layers + 2 or not plan.fusable_score(score)
                or x.shape[1] != HYPOTHESES):
            return None
        chain = self._prepared_chain(layers[:-1], x, cheb0)
        if chain is None:
            return None
        rows = self.hopper.drb_chain16(x, chain, self._mixing_source(cheb1), score_weight=score.weight)
        return self._move_vertices("drb_score_finish", (rows, np.int32(1), np.int64(0)), cheb1, score.bias, centers,
                                   offsets)

    def op_drb_last_layer_score(self, layer, score, x, residual, cheb1, cheb0, centers, offsets):
        """A deformation block's last wide layer, x5 = lc5(x4) + x3, and its score layer and vertex update
        (the model's ``block_tail`` after the first four layers) where the fp32 mode's layers run
        ``drb_layer_3xf16``: the score layer's two products in the layer's epilogue
        (``drb_layer_3xf16`` with ``score_weight``: x5 is never written, each of the two 96-column groups
        leaves 8 bytes a row), then ``drb_score_finish`` adds the groups' products, mixes them, adds the
        bias, takes the softmax and moves the vertices (``drb_score_update``'s arithmetic, its float32
        products summed in another order). None elsewhere."""
        if (not self.fuse_drb_score or self.hopper is None or cheb0 is not None or layer.weight0 is not None
                or not plan.fusable_score(score) or x.ndim != 4 or x.shape[1] != HYPOTHESES
                or not self._runs_layer_3xf16(layer, x)):
            return None
        rows, halves, mixing = hopper_gemm.hypothesis_rows(self.cupy, x), self._halves(layer), self._mixing_source(cheb1)
        if not plan.layer_3xf16_takes(rows, halves.k, mixing):
            return None
        parts = self.hopper.drb_layer_3xf16(rows, halves, layer.bias, residual, mixing, score_weight=score.weight)
        return self._move_vertices("drb_score_finish", (parts, np.int32(parts.shape[0]), np.int64(parts[0].size // 2)),
                                   cheb1, score.bias, centers, offsets)

    def _runs_layer_3xf16(self, layer, x) -> bool:
        """Whether a deformation layer is ``drb_layer_3xf16``'s to run, its rows' layout aside
        (``plan.layer_3xf16_takes``): the fp32 mode with ``fp32_halves``, float32 X, a [W0 | W1] of
        X's width and 2 x 192 columns."""
        return (LAYER_OPERANDS[self.precision] == "3xtf32" and self.fp32_halves and x.dtype == self.cupy.float32
                and layer.weight.shape == (x.shape[-1], 2 * hopper_gemm.WIDE_COLS))

    def _halves(self, layer):
        """A layer's [W0 | W1] prepared for ``drb_layer_3xf16`` (HopperGemm.prepare_halves), once per weight."""
        return self._derived.get((layer.weight,), "halves", lambda: self.hopper.prepare_halves(layer.weight))

    def op_local_gconv(self, layer, x, cheb1, cheb0=None, residual=None):
        if cheb0 is None and layer.weight0 is None and x.shape[1] == HYPOTHESES:   # A_0 the identity
            if self.hopper is not None and layer.cout % hopper_gemm.DRB_COLS == 0:
                return self._local_gconv_hopper(layer, x, cheb1, residual)
            if self.precision != "fp16" or self.hopper is not None:
                return self._local_gconv_fused(layer, x, cheb1, residual)
        return self._local_gconv_cublas(layer, x, cheb1, cheb0, residual)

    def _local_gconv_hopper(self, layer, x, cheb1, residual):
        """The whole layer in one Hopper kernel, its products with the precision mode's operands. The
16-bit modes keep these layers' outputs in 16 bits (half the bytes to write and to read back
        as the next layer's X and residual), and the narrow last layer reads them through
        ``_skinny16`` (a block's wide layers run chained, ``op_drb_block_tail``, where the chain takes
        them). The fp32 mode's layers run ``drb_layer_3xf16`` (three
        float16 products of 22-bit operand parts, the mixing on the input side, each K slice summed on
        its own and added in float32) where it takes X; the tf32 mode's, ``drb_layer``."""
        cp = self.cupy
        operands = LAYER_OPERANDS[self.precision]
        out16 = hopper_gemm.OPERANDS[operands].is_16bit
        if out16 and residual is not None and residual.dtype == cp.float32:
            residual = hopper_gemm.narrow16(cp, residual, operands)
        rows, mixing = hopper_gemm.hypothesis_rows(cp, x), self._mixing_source(cheb1)
        if self._runs_layer_3xf16(layer, x):
            halves = self._halves(layer)
            if plan.layer_3xf16_takes(rows, halves.k, mixing):
                return self.hopper.drb_layer_3xf16(rows, halves, layer.bias, residual, mixing)
        weight = self._hopper_weight(layer.weight, operands, layer.weight, paired=True)
        return self.hopper.drb_layer(rows, weight, cp.ascontiguousarray(cheb1, dtype=cp.float32), layer.bias,
                                     residual, mixing=mixing, out16=out16)

    def _skinny16(self, x, weight):
        """y = X W (float32 sums) for 16-bit activations X (..., K) and a narrow float32 W (K, <= 8),
        reading X as it is (the narrow last layer of a block in the 16-bit modes); None where that
        kernel does not apply (float32 X, wide W, unaligned rows)."""
        cp = self.cupy
        k, nw = weight.shape
        if x.dtype not in (cp.float16, cp.uint16) or nw > SKINNY_MAX_COLS or k > SKINNY_MAX_K or weight.dtype != cp.float32:
            return None
        rows = hopper_gemm.hypothesis_rows(cp, x)   # unit-stride rows, evenly spaced
        ldx = rows.strides[-2] // 2
        if ldx % 8 or rows.data.ptr % 16:
            return None
        m = int(np.prod(rows.shape[:-1]))
        y = cp.empty((m, nw), dtype=cp.float32)
        self._kernel("skinny_gemm16")(_grid(m), (THREADS,),
                                      (rows, np.int64(ldx), cp.ascontiguousarray(weight), y, np.int64(m), np.int32(k),
                                       np.int32(nw), np.int32(x.dtype == cp.uint16)))
        return y

    def _activation_f32(self, x):
        """float32 values of a deformation activation (16-bit ones from ``_local_gconv_hopper`` widened)."""
        cp = self.cupy
        if x is None or x.dtype == cp.float32:
            return x
        return hopper_gemm.widen16(cp, x, "bf16" if x.dtype == cp.uint16 else "fp16")

    def _local_gconv_fused(self, layer, x, cheb1, residual):
        """One product y = X [W0 | W1] (``layer.weight``, fused when A_0 is the identity): a tensor-core
        GEMM, or for 16-bit X (the narrow last layers in the 16-bit modes on compute capability 9.0)
        ``_skinny16``; then the mixing and epilogue kernel."""
        cp = self.cupy
        b, k, n, cin = x.shape
        cout = layer.cout
        residual = self._activation_f32(residual)
        y = self._skinny16(x, layer.weight)
        if y is None:
            x = self._activation_f32(x)
            y = self.gemm(cp.ascontiguousarray(x, dtype=cp.float32).reshape(b * k * n, cin), layer.weight,
                          cache_key=layer.weight)
        out = cp.empty((b, k, n, cout), dtype=cp.float32)
        res = np.uint64(0) if residual is None else cp.ascontiguousarray(residual, dtype=cp.float32)
        columns = b * n * cout
        self._kernel("drb_mix_epilogue")(_grid(columns), (THREADS,),
                                         (y, cp.ascontiguousarray(cheb1, dtype=cp.float32), layer.bias, res, out,
                                          np.int32(b), np.int32(n), np.int32(cout)))
        return out

    def _mixing_source(self, cheb1) -> str:
        """hopper_gemm.mixing_source of a support (read to the host once per array: the template's
        supports live as long as the model, so this happens in the first, eager call)."""
        return self._derived.get((cheb1,), "mixing", lambda: self._prepare_mixing(hopper_gemm.mixing_source(self.to_numpy(cheb1))))

    def _prepare_mixing(self, mixing: str) -> str:
        """Start building this mode's Hopper deformation kernels for a support's ``mixing`` source, all at
        once in background threads (kernel_manifest)."""
        if self.hopper is None:
            return mixing
        try:
            cuda_kernels.prepare(kernel_manifest.planned_mixing_builds(self.precision, mixing), wait=False)
        except KernelCompileError:
            pass   # tried again, and reported, where a kernel is first used
        return mixing

    def op_score_update(self, layer, x, cheb1, cheb0, centers, offsets):
        """A deformation block's narrow last layer (cin -> 1), the softmax over hypotheses and the moved
        vertices in one kernel (``drb_score_update``: X read once, float32 sums in every mode). None
        where it does not apply: a non-identity first support, other widths, fp16 mode off Hopper
        (cuBLAS products), rows not in whole 16-byte loads."""
        cp = self.cupy
        b, k, n, cin = x.shape
        row_format = ROW_FORMATS.get(x.dtype.name)
        if (cheb0 is not None or layer.weight0 is not None or layer.cout != 1 or k != HYPOTHESES or row_format is None
                or cin > SKINNY_MAX_K or (row_format == ROWS_F32 and self.precision == "fp16" and self.hopper is None)):
            return None
        rows = hopper_gemm.hypothesis_rows(cp, x)   # unit-stride rows, evenly spaced
        ldx, vector = rows.strides[-2] // rows.itemsize, 16 // rows.itemsize   # elements per 16-byte load
        if cin % vector or ldx % vector or rows.data.ptr % 16:
            return None
        return self._move_vertices("drb_score_update", (rows, np.int64(ldx), np.int32(cin), np.int32(row_format),
                                                        cp.ascontiguousarray(layer.weight, dtype=cp.float32)),
                                   cheb1, layer.bias, centers, offsets)

    def _move_vertices(self, kernel: str, inputs: tuple, cheb1, bias, centers, offsets):
        """Launch a block's end kernel (``drb_score_update`` or ``drb_score_finish``: SCORE_VERTICES
        vertices a block, a thread a hypothesis) on its leading arguments ``inputs`` and A1, the score
        layer's bias, the offsets and the centers (B,N,3); returns the moved centers (B,N,3)."""
        cp = self.cupy
        b, n = centers.shape[:2]
        out = cp.empty((b, n, 3), dtype=cp.float32)
        f32 = lambda a: cp.ascontiguousarray(a, dtype=cp.float32)
        self._kernel(kernel)((-(-(b * n) // SCORE_VERTICES),), (SCORE_THREADS,),
                             (*inputs, f32(cheb1), f32(bias), f32(offsets), f32(centers), out, np.int32(b), np.int32(n)))
        return out

    def op_hypothesis_update(self, centers, score, offsets):
        """Softmax over the hypotheses (axis 1 of score (B,K,N)) and the moved centers (B,N,3)."""
        cp = self.cupy
        b, k, n = score.shape
        out = cp.empty((b, n, 3), dtype=cp.float32)
        self._kernel("hypothesis_softmax_update")(
            _grid(b * n), (THREADS,),
            (cp.ascontiguousarray(score, dtype=cp.float32), cp.ascontiguousarray(offsets, dtype=cp.float32),
             cp.ascontiguousarray(centers, dtype=cp.float32), out, np.int32(b), np.int32(k), np.int32(n)))
        return out

    def _local_gconv_cublas(self, layer, x, cheb1, cheb0, residual):
        """fp16 mode (cuBLAS half GEMMs), or a non-identity first support: the separate-GEMM path."""
        cp = self.cupy
        w0, w1, bias, a1, a0 = self._local_weights(layer, cheb1, cheb0)
        dtype = w0.dtype
        x, residual = self._activation_f32(x), self._activation_f32(residual)
        b, k, n, cin = x.shape
        cout = layer.cout
        x2 = cp.ascontiguousarray(x, dtype=dtype).reshape(b * k * n, cin)
        with self._math():
            y0 = (x2 @ w0).reshape(b, k, n, cout)
            y1 = (x2 @ w1).reshape(b, k, n, cout)
            if a0 is not None:
                y0 = self._mix(a0, y0)
            mixed = self._mix(a1, y1)
        last = cout == 1
        out_dtype = cp.float32 if (dtype == cp.float32 or last) else dtype
        out = cp.empty((b, k, n, cout), dtype=out_dtype)
        if dtype == cp.float32:
            name = "gconv_epilogue_f32"
        else:
            name = "gconv_epilogue_f16_f32" if out_dtype == cp.float32 else "gconv_epilogue_f16"
        res = np.uint64(0) if residual is None else cp.ascontiguousarray(residual, dtype=dtype)
        total = out.size
        self._kernel(name)(_grid(total), (THREADS,),
                           (y0, mixed, bias, res, out, np.int64(total), np.int32(cout), np.int32(1)))
        return out

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
