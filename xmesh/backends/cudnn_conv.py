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
TENSOR_OP_MATH, FMA_MATH = 1, 3  # cudnnMathType_t: TF32 allowed, float32 multiply-adds only
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


class ConvolutionDescriptors:
    """The cuDNN descriptors of one stride-1 'SAME' convolution shape in NHWC float32: the input ``x``
    (n, h, w, cin), the output ``y`` (n, h, w, cout), the filter ``w`` (cout, k, k, cin) and the
    convolution ``conv`` in ``math`` (TENSOR_OP_MATH or FMA_MATH); kept for the handle's lifetime."""

    def __init__(self, conv: CudnnConv, n: int, h: int, w: int, cin: int, cout: int, k: int, math: int):
        call = conv.call
        self.x, self.y = (conv.new("TensorDescriptor") for _ in range(2))
        call("cudnnSetTensor4dDescriptor", self.x, _NHWC, _FLOAT, n, cin, h, w)
        call("cudnnSetTensor4dDescriptor", self.y, _NHWC, _FLOAT, n, cout, h, w)
        self.w = conv.new("FilterDescriptor")
        call("cudnnSetFilter4dDescriptor", self.w, _FLOAT, _NHWC, cout, cin, k, k)
        self.conv = conv.new("ConvolutionDescriptor")
        call("cudnnSetConvolution2dDescriptor", self.conv, k // 2, k // 2, 1, 1, 1, 1, _CROSS_CORRELATION, _FLOAT)
        call("cudnnSetConvolutionMathType", self.conv, math)


class _Descriptors(ConvolutionDescriptors):
    """The inference's convolution with bias and ReLU: TF32 allowed, the bias's descriptor and the
    forward's workspace size."""

    def __init__(self, conv: CudnnConv, n: int, h: int, w: int, cin: int, cout: int, k: int):
        super().__init__(conv, n, h, w, cin, cout, k, TENSOR_OP_MATH)
        call = conv.call
        self.bias = conv.new("TensorDescriptor")
        call("cudnnSetTensor4dDescriptor", self.bias, _NHWC, _FLOAT, 1, cout, 1, 1)
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

    descriptors = _Descriptors  # what :meth:`shape` makes for a shape

    def __init__(self, cupy, lib):
        self.cupy, self.lib = cupy, lib
        self.handle = ctypes.c_void_p()
        self.call("cudnnCreate", ctypes.byref(self.handle))
        self.relu = self.new("ActivationDescriptor")
        self.call("cudnnSetActivationDescriptor", self.relu, _RELU, _PROPAGATE_NAN, ctypes.c_double(0.0))
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

    def call(self, name: str, *args) -> None:
        """cuDNN's function ``name``; a status other than success raises CudnnError."""
        status = getattr(self.lib, name)(*args)
        if status != 0:
            raise CudnnError(f"{name} failed: {self.lib.cudnnGetErrorString(status).decode()} (status {status})")

    def new(self, kind: str):
        """A new cuDNN ``kind`` descriptor (``"TensorDescriptor"``, ...)."""
        handle = ctypes.c_void_p()
        self.call(f"cudnnCreate{kind}", ctypes.byref(handle))
        return handle

    def shape(self, n: int, h: int, w: int, cin: int, cout: int, k: int):
        """This class's ``descriptors`` of a shape, made once; a shape cuDNN refused raises its
        CudnnError again without asking cuDNN twice."""
        key = (n, h, w, cin, cout, k)
        if key not in self._shapes:
            try:
                self._shapes[key] = self.descriptors(self, n, h, w, cin, cout, k)
            except CudnnError as exc:
                self._shapes[key] = exc
        found = self._shapes[key]
        if isinstance(found, CudnnError):
            raise found
        return found

    def shapes(self) -> dict:
        """The shapes described so far, (images, h, w, cin, cout, k) -> their descriptors."""
        return {key: d for key, d in self._shapes.items() if not isinstance(d, CudnnError)}

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
        desc = self.shape(n, h, w, cin, cout, k)
        filt = self._filter(weight)
        bias = cp.ascontiguousarray(bias, dtype=cp.float32)
        workspace = cp.empty(max(desc.workspace, 1), dtype=cp.uint8)
        self.call("cudnnSetStream", self.handle, ctypes.c_void_p(cp.cuda.get_current_stream().ptr))

        def ptr(a):
            return ctypes.c_void_p(a.data.ptr)

        # alpha2 = 0: z (given as out) adds nothing
        self.call(
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
