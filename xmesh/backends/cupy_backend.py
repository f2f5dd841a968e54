"""The GPU backend: CuPy arrays, cuBLAS GEMMs, cuSPARSE products and xmesh's own CUDA kernels.

Weights, the template and every intermediate stay on the device; a reconstruction makes no
device -> host copy. Kernels (``kernels/p2m_ops.cu``):

- ``graph_projection``: the whole stage-1 projection (camera transform, 4 gathers per view, max /
  mean / std over views, coordinates) in one launch;
- ``local_projection``: the whole stage-2 projection (transform, 3 x 4 bilinear taps per view,
  pooling) in one launch;
- ``gconv_epilogue_*``: relu((y0 + A y1) + b) (+ residual) of a local graph convolution, after
  X W0 and X W1 (cuBLAS) and the 43 x 43 mixing as one GEMM over the hypothesis-major layout;
- ``im2col_nhwc`` + cuBLAS + ``bias_act``: 'SAME' convolutions (CuPy 14 no longer reaches cuDNN).

Precision: ``fp32`` (plain float32 GEMMs), ``tf32`` (the CNN and deformation GEMMs on the tensor
cores with TF32 inputs), ``fp16`` (the deformation-reasoning GEMMs in half precision with float32
accumulation; the CNN and stage 1 stay float32). The camera arithmetic is always exact float32.
"""
from __future__ import annotations

import contextlib

import numpy as np

from ..errors import BackendUnavailableError, InputError, XmeshError
from .base import Backend
from .cuda_kernels import get_function, require_cupy
from .numpy_backend import same_padding

KERNEL_FILE = "p2m_ops.cu"
PRECISIONS = ("fp32", "tf32", "fp16")
THREADS = 256
#: Largest im2col buffer (elements) built at once; larger convolutions run in image chunks.
IM2COL_LIMIT = 1 << 28


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
        self._linalg = linalg
        self._fp32_type = getattr(linalg, "COMPUTE_TYPE_DEFAULT", 1)
        self._tf32_type = getattr(linalg, "COMPUTE_TYPE_TF32", 7)
        self._layer_cache: dict = {}
        self._options = ("-std=c++17",)
        with self.device:
            self._kernel("bias_act")  # compile now: a broken toolchain fails at construction

    # ------------------------------------------------------------------ basics
    def _kernel(self, name: str):
        try:
            return get_function(KERNEL_FILE, name, self._options)
        except Exception:
            if self._options != ("-std=c++17", "-DXM_NO_FP16"):
                # NVRTC without cuda_fp16.h: build the fp32 kernels alone (fp16 then unavailable)
                if name.startswith("gconv_epilogue_f16"):
                    raise
                self._options = ("-std=c++17", "-DXM_NO_FP16")
                return get_function(KERNEL_FILE, name, self._options)
            raise

    def asarray(self, array, dtype=np.float32):
        return self.cupy.ascontiguousarray(self.cupy.asarray(array, dtype=dtype))

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
        cp = self.cupy
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        n, h, w, cin = x.shape
        kh, kw, _, cout = weight.shape
        ho, top, _ = same_padding(h, kh, stride)
        wo, left, _ = same_padding(w, kw, stride)
        k = kh * kw * cin
        flat_w = weight.reshape(k, cout)
        out = cp.empty((n, ho, wo, cout), dtype=cp.float32)
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
            with self._math():
                cp.matmul(cols, flat_w, out=y)
        self._kernel("bias_act")(_grid(out.size), (THREADS,),
                                 (out, bias, np.int64(out.size), np.int32(cout), np.int32(bool(relu))))
        return out

    # ------------------------------------------------------------------ fast paths
    def _projection(self, kernel: str, points, maps, tf, count: int, padded: int, *extra):
        """Launch a projection kernel: one thread per (sample, point, channel of the maps' concatenation)."""
        cp = self.cupy
        if len(maps) != count:
            raise InputError(f"the {kernel} kernel takes {count} maps, got {len(maps)}")
        if tf.num_views > 8:
            raise InputError(f"the projection kernels take at most 8 views, got {tf.num_views}")
        points = cp.ascontiguousarray(points, dtype=cp.float32)
        batch, n, _ = points.shape
        maps = [cp.ascontiguousarray(m, dtype=cp.float32) for m in maps]
        sizes = [np.int32(m.shape[1] - padded) for m in maps]
        chans = [np.int32(m.shape[3]) for m in maps]
        ct = int(sum(int(c) for c in chans))
        out = cp.empty((batch, n, 3 + 3 * ct), dtype=cp.float32)
        total = batch * n * ct
        self._kernel(kernel)(
            ((total + THREADS - 1) // THREADS,), (THREADS,),
            (points, tf.packed, *maps, *sizes, *chans, np.int32(batch), np.int32(n), np.int32(tf.num_views), *extra, out))
        return out

    def op_graph_projection(self, coords, maps, tf, view_quirk=True):
        return self._projection("graph_projection", coords, maps, tf, 4, 0, np.int32(bool(view_quirk)))

    def op_local_projection(self, points, maps, tf):
        return self._projection("local_projection", points, maps, tf, 3, 1)

    def op_graph_conv(self, layer, x, supports):
        """Stage-1 graph convolution when support 0 is the identity: one GEMM, then one CSR kernel."""
        cp = self.cupy
        s0, s1 = supports
        if s0 is not None or layer.weight0 is not None:
            return None
        b, n, cin = x.shape
        cout = layer.cout
        x2 = cp.ascontiguousarray(x, dtype=cp.float32).reshape(b * n, cin)
        with self._math():
            y = x2 @ layer.weight                                   # (B*N, 2*cout)
        out = cp.empty((b, n, cout), dtype=cp.float32)
        total = out.size
        self._kernel("csr_gconv")(
            ((total + THREADS - 1) // THREADS,), (THREADS,),
            (s1.indptr, s1.indices, s1.data, y, np.int32(2 * cout), np.int32(cout), layer.bias, out,
             np.int32(b), np.int32(n), np.int32(cout), np.int32(bool(layer.relu))))
        return out

    def _local_weights(self, layer, cheb1, cheb0):
        """(W0, W1, bias, A1, A0) in the GEMM dtype, split and cached per layer object."""
        key = (id(layer), id(cheb1), id(cheb0))
        hit = self._layer_cache.get(key)
        if hit is not None:
            return hit[1]
        cp = self.cupy
        dtype = cp.float16 if self.precision == "fp16" else cp.float32
        cout = layer.cout
        if layer.weight0 is None:
            w0, w1 = layer.weight[:, :cout], layer.weight[:, cout:]
        else:
            w0, w1 = layer.weight0, layer.weight
        prepared = (cp.ascontiguousarray(w0, dtype=dtype), cp.ascontiguousarray(w1, dtype=dtype),
                    cp.ascontiguousarray(layer.bias, dtype=cp.float32), cp.ascontiguousarray(cheb1, dtype=dtype),
                    None if cheb0 is None else cp.ascontiguousarray(cheb0, dtype=dtype))
        self._layer_cache[key] = ((layer, cheb1, cheb0), prepared)  # hold the objects so ids stay unique
        return prepared

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

    def op_local_gconv(self, layer, x, cheb1, cheb0=None, residual=None):
        cp = self.cupy
        w0, w1, bias, a1, a0 = self._local_weights(layer, cheb1, cheb0)
        dtype = w0.dtype
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
