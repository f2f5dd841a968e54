"""cuDNN's convolutions for the training CNN on CuPy: stride-1 'SAME' convolutions of NHWC float32 images
and their two gradients, with float32 multiply-adds (``CUDNN_FMA_MATH``: no TF32), in GEMM-like
algorithms that read the images as they lie, where the array-API route writes every kh*kw-fold patch
(im2col) and sums it back (col2im). Each shape takes the first algorithm cuDNN's heuristics rank
(``cudnnGet...Algorithm_v7``) among those that run in FMA math and are neither FFT nor Winograd
(whose rounding differs from a sum of products).

The forward leaves the bias and the ReLU to the caller (the training keeps the pre-activation's sign).
A shape cuDNN refuses raises :class:`CudnnError`; the backend then keeps the array-API route for it.
"""

from __future__ import annotations

import ctypes

from .cudnn_conv import FMA_MATH, ConvolutionDescriptors, CudnnConv, CudnnError

# the algorithms taken: forward implicit GEMM, implicit precomputed GEMM, GEMM, direct; the data
# gradient's ALGO_0 and ALGO_1; the filter gradient's ALGO_0, ALGO_1 and ALGO_3
_SUMS = {"Forward": (0, 1, 2, 3), "BackwardData": (0, 1), "BackwardFilter": (0, 1, 3)}


class _AlgoPerf(ctypes.Structure):
    """cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t (the same fields)."""

    _fields_ = [
        ("algo", ctypes.c_int),
        ("status", ctypes.c_int),
        ("time", ctypes.c_float),
        ("memory", ctypes.c_size_t),
        ("determinism", ctypes.c_int),
        ("math_type", ctypes.c_int),
        ("reserved", ctypes.c_int * 3),
    ]


class _Shape(ConvolutionDescriptors):
    """The descriptors (float32 multiply-adds), algorithms and workspace sizes of one shape."""

    def __init__(self, conv: CudnnTrainingConv, n: int, h: int, w: int, cin: int, cout: int, k: int):
        super().__init__(conv, n, h, w, cin, cout, k, FMA_MATH)
        call = conv.call
        chosen = []
        for name, descriptors in (
            ("Forward", (self.x, self.w, self.conv, self.y)),
            ("BackwardData", (self.w, self.y, self.conv, self.x)),
            ("BackwardFilter", (self.x, self.y, self.conv, self.w)),
        ):
            ranked, returned = (_AlgoPerf * 16)(), ctypes.c_int()
            call(
                f"cudnnGetConvolution{name}Algorithm_v7", conv.handle, *descriptors, 16, ctypes.byref(returned), ranked
            )
            algo = next(
                (
                    p.algo
                    for p in ranked[: returned.value]
                    if p.status == 0 and p.math_type == FMA_MATH and p.algo in _SUMS[name]
                ),
                None,
            )
            if algo is None:
                raise CudnnError(f"cuDNN ranks no {name} algorithm of float32 multiply-adds for this shape")
            size = ctypes.c_size_t()
            call(f"cudnnGetConvolution{name}WorkspaceSize", conv.handle, *descriptors, algo, ctypes.byref(size))
            chosen.append((algo, size.value))
        (self.forward_algo, self.forward_bytes), (self.data_algo, self.data_bytes) = chosen[:2]
        self.filter_algo, self.filter_bytes = chosen[2]


class CudnnTrainingConv(CudnnConv):
    """Stride-1 'SAME' convolutions (odd square kernels) and their gradients, float32 multiply-adds."""

    descriptors = _Shape

    def _run(self, name: str, shape: _Shape, algo: int, workspace_bytes: int, first, second, out) -> None:
        """cuDNN's ``name``, out = op(first, second) (alpha 1, beta 0), in ``algo`` with a workspace of
        ``workspace_bytes`` on the current stream; each operand a (descriptor, array) pair."""
        cp = self.cupy
        workspace = cp.empty(max(workspace_bytes, 1), dtype=cp.uint8)
        self.call("cudnnSetStream", self.handle, ctypes.c_void_p(cp.cuda.get_current_stream().ptr))
        operands = [part for desc, array in (first, second) for part in (desc, ctypes.c_void_p(array.data.ptr))]
        self.call(
            name,
            self.handle,
            ctypes.byref(self._one),
            *operands,
            shape.conv,
            algo,
            ctypes.c_void_p(workspace.data.ptr),
            ctypes.c_size_t(workspace_bytes),
            ctypes.byref(self._zero),
            out[0],
            ctypes.c_void_p(out[1].data.ptr),
        )

    def _geometry(self, x_shape, weight_shape):
        n, h, w, cin = x_shape
        k, k2, wcin, cout = weight_shape
        if k != k2 or k % 2 == 0 or wcin != cin:
            raise CudnnError(f"cuDNN's training convolutions take odd square kernels, got {tuple(weight_shape)}")
        return self.shape(n, h, w, cin, cout, k), cout

    def forward(self, x, weight):
        """conv(x, W) (N,H,W,cout) for contiguous NHWC float32 x and W (k, k, cin, cout), no bias."""
        cp = self.cupy
        shape, cout = self._geometry(x.shape, weight.shape)
        filt = cp.ascontiguousarray(cp.transpose(weight, (3, 0, 1, 2)), dtype=cp.float32)
        out = cp.empty(tuple(x.shape[:3]) + (cout,), dtype=cp.float32)
        self._run(
            "cudnnConvolutionForward",
            shape,
            shape.forward_algo,
            shape.forward_bytes,
            (shape.x, x),
            (shape.w, filt),
            (shape.y, out),
        )
        return out

    def data_gradient(self, dy, weight, x_shape):
        """The input's gradient (N,H,W,cin) from the output's, dy (N,H,W,cout) contiguous float32."""
        cp = self.cupy
        shape, _ = self._geometry(x_shape, weight.shape)
        filt = cp.ascontiguousarray(cp.transpose(weight, (3, 0, 1, 2)), dtype=cp.float32)
        dx = cp.empty(tuple(x_shape), dtype=cp.float32)
        self._run(
            "cudnnConvolutionBackwardData",
            shape,
            shape.data_algo,
            shape.data_bytes,
            (shape.w, filt),
            (shape.y, dy),
            (shape.x, dx),
        )
        return dx

    def filter_gradient(self, x, dy, weight_shape):
        """The weights' gradient (k, k, cin, cout) from contiguous NHWC float32 x and dy."""
        cp = self.cupy
        shape, cout = self._geometry(x.shape, weight_shape)
        k, _, cin, _ = weight_shape
        dfilt = cp.empty((cout, k, k, cin), dtype=cp.float32)
        self._run(
            "cudnnConvolutionBackwardFilter",
            shape,
            shape.filter_algo,
            shape.filter_bytes,
            (shape.x, x),
            (shape.y, dy),
            (shape.w, dfilt),
        )
        return cp.ascontiguousarray(cp.transpose(dfilt, (1, 2, 3, 0)))
