"""cuDNN's convolutions for the CuPy backend, reached through ctypes (CuPy 14 no longer wraps cuDNN).

Only what the CNN's stride-1 'SAME' layers need: NHWC float32 in and out, bias and ReLU fused
(``cudnnConvolutionBiasActivationForward``), the implicit-GEMM algorithm with tensor-op math, so the
products run as TF32 (the backend's speed modes; its fp32 mode keeps xmesh's 3xTF32 kernels). Only
large convolutions come here (``plan.conv_on_cudnn``): at one to three images xmesh's own kernel is as fast
or faster (docs/ARCHITECTURE.md, design decisions).

The library is looked for where CUDA's Python wheels put it (``nvidia.cudnn``), then by the loader's
search (``libcudnn.so.9``); ``XMESH_CUDNN`` names a file, or ``0`` turns cuDNN off. Without it the
backend runs every convolution in its own kernels.
"""

from __future__ import annotations

import ctypes

from .derived_cache import DerivedCache
from .shared_library import candidate_paths, load_first

# cudnn.h's enumerations (cuDNN 8 and 9)
_NHWC, _FLOAT = 1, 0
_CROSS_CORRELATION = 1
_TENSOR_OP_MATH = 1
_RELU, _PROPAGATE_NAN = 1, 1
_IMPLICIT_PRECOMP_GEMM = 1


class CudnnError(RuntimeError):
    pass


def _library_paths() -> list[str]:
    return candidate_paths("XMESH_CUDNN", "libcudnn.so", "nvidia.cudnn", ["libcudnn.so.9", "libcudnn.so.8"])


def _usable(lib) -> bool:
    lib.cudnnGetVersion.restype = ctypes.c_size_t
    lib.cudnnGetErrorString.restype = ctypes.c_char_p
    return lib.cudnnGetVersion() >= 8000


def load_library():
    """The cuDNN library (a ctypes handle), or None where none can be loaded."""
    return load_first(_library_paths(), _usable)


class _Descriptors:
    """The cuDNN descriptors of one convolution shape (kept for the backend's lifetime)."""

    def __init__(self, conv: CudnnConv, n: int, h: int, w: int, cin: int, cout: int, k: int):
        call = conv._call
        self.x, self.y, self.bias = (conv._new("TensorDescriptor") for _ in range(3))
        call("cudnnSetTensor4dDescriptor", self.x, _NHWC, _FLOAT, n, cin, h, w)
        call("cudnnSetTensor4dDescriptor", self.y, _NHWC, _FLOAT, n, cout, h, w)
        call("cudnnSetTensor4dDescriptor", self.bias, _NHWC, _FLOAT, 1, cout, 1, 1)
        self.w = conv._new("FilterDescriptor")
        call("cudnnSetFilter4dDescriptor", self.w, _FLOAT, _NHWC, cout, cin, k, k)
        self.conv = conv._new("ConvolutionDescriptor")
        call("cudnnSetConvolution2dDescriptor", self.conv, k // 2, k // 2, 1, 1, 1, 1, _CROSS_CORRELATION, _FLOAT)
        call("cudnnSetConvolutionMathType", self.conv, _TENSOR_OP_MATH)
        size = ctypes.c_size_t()
        call(
            "cudnnGetConvolutionForwardWorkspaceSize",
            conv.handle,
            self.x,
            self.w,
            self.conv,
            self.y,
            _IMPLICIT_PRECOMP_GEMM,
            ctypes.byref(size),
        )
        self.workspace = size.value


class CudnnConv:
    """Stride-1 'SAME' convolutions (odd square kernels) with bias and ReLU through cuDNN."""

    def __init__(self, cupy, lib):
        self.cupy, self.lib = cupy, lib
        self.handle = ctypes.c_void_p()
        self._call("cudnnCreate", ctypes.byref(self.handle))
        self.relu = self._new("ActivationDescriptor")
        self._call("cudnnSetActivationDescriptor", self.relu, _RELU, _PROPAGATE_NAN, ctypes.c_double(0.0))
        self._shapes: dict = {}
        self._filters = DerivedCache()
        self._one, self._zero = ctypes.c_float(1.0), ctypes.c_float(0.0)

    @classmethod
    def create(cls, cupy):
        """A CudnnConv on the current device, or None where cuDNN is missing or refuses to start."""
        lib = load_library()
        if lib is None:
            return None
        try:
            return cls(cupy, lib)
        except CudnnError:
            return None

    def _call(self, name: str, *args) -> None:
        status = getattr(self.lib, name)(*args)
        if status != 0:
            raise CudnnError(f"{name} failed: {self.lib.cudnnGetErrorString(status).decode()} (status {status})")

    def _new(self, kind: str):
        handle = ctypes.c_void_p()
        self._call(f"cudnnCreate{kind}", ctypes.byref(handle))
        return handle

    def _filter(self, weight):
        """weight (kh, kw, cin, cout) as cuDNN's NHWC filter (cout, kh, kw, cin), made once per array."""
        cp = self.cupy
        return self._filters.get(
            (weight,), "nhwc", lambda: cp.ascontiguousarray(cp.transpose(weight, (3, 0, 1, 2)), dtype=cp.float32)
        )

    def conv2d_same_relu(self, x, weight, bias, out) -> None:
        """out (N,H,W,cout) = relu(conv(x, weight) + bias) for NHWC float32 x (contiguous), weight
        (k, k, cin, cout) with k odd (zero padding k // 2 each side: 'SAME' at stride 1), bias (cout,)."""
        cp = self.cupy
        n, h, w, cin = x.shape
        k, _, _, cout = weight.shape
        key = (n, h, w, cin, cout, k)
        desc = self._shapes.get(key)
        if desc is None:
            desc = self._shapes[key] = _Descriptors(self, n, h, w, cin, cout, k)
        filt = self._filter(weight)
        bias = cp.ascontiguousarray(bias, dtype=cp.float32)
        workspace = cp.empty(max(desc.workspace, 1), dtype=cp.uint8)
        self._call("cudnnSetStream", self.handle, ctypes.c_void_p(cp.cuda.get_current_stream().ptr))

        def ptr(a):
            return ctypes.c_void_p(a.data.ptr)

        # alpha2 = 0: z (given as out) adds nothing
        self._call(
            "cudnnConvolutionBiasActivationForward",
            self.handle,
            ctypes.byref(self._one),
            desc.x,
            ptr(x),
            desc.w,
            ptr(filt),
            desc.conv,
            _IMPLICIT_PRECOMP_GEMM,
            ptr(workspace),
            ctypes.c_size_t(desc.workspace),
            ctypes.byref(self._zero),
            desc.y,
            ptr(out),
            desc.bias,
            ptr(bias),
            self.relu,
            desc.y,
            ptr(out),
        )
