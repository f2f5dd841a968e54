"""'SAME' convolutions: cuDNN in the speed modes where it is installed, the implicit GEMM of
``kernels/tc_gemm.cu``, and ``kernels/convolution.cu`` (direct sums for few input channels, im2col);
for the training CNN, cuDNN's stride-1 convolutions and their gradients in float32 multiply-adds where
cuDNN is installed and takes the shape, else the patches, im2col and its backward col2im, each one launch.
"""

from __future__ import annotations

import warnings

import numpy as np

from .. import plan
from ..cudnn_conv import CudnnError
from ..cudnn_training import CudnnTrainingConv
from ..kernel_constants import CONVOLUTION_FILE, GEMM_BK
from ..numpy_backend import same_padding
from .device import THREADS, _grid
from .gemm import _tile_width

SOURCE = CONVOLUTION_FILE
#: conv_direct_x4 (few input channels): the largest kernel it holds in shared memory
DIRECT_CONV_WEIGHT_BYTES = 48 * 1024
#: Largest im2col buffer (elements) built at once; larger convolutions run in image chunks.
IM2COL_LIMIT = 1 << 28


class ConvolutionStage:
    """``conv2d_same`` and the training's patches (a mixin of CupyBackend)."""

    def _convolution_kernel(self, name: str):
        return self._stage_kernel(SOURCE, name)

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
        if self._cudnn is not None and relu and bias is not None and plan.conv_on_cudnn(x.shape, weight.shape, stride):
            try:
                self._cudnn.conv2d_same_relu(x, weight, bias, out)
                return out
            except CudnnError as exc:  # e.g. a cuDNN built for another CUDA: our kernels take over for good
                warnings.warn(
                    f"xmesh: cuDNN's convolution failed, using xmesh's own kernels from now on ({exc}); "
                    "set XMESH_CUDNN=0 to skip cuDNN",
                    RuntimeWarning,
                    stacklevel=2,
                )
                self._cudnn = None
        if cin % GEMM_BK == 0 and cout % 4 == 0 and flat_w.flags.c_contiguous and flat_w.data.ptr % 16 == 0:
            bn = _tile_width(cout)
            entry = self._gemm_kernel(f"conv_{self.gemm_passes}x_n{bn}", bn)
            geometry = (
                x,
                np.int32(h),
                np.int32(w),
                np.int32(cin),
                np.int32(kw),
                np.int32(stride),
                np.int32(ho),
                np.int32(wo),
                np.int32(top),
                np.int32(left),
            )
            return self._launch_tc(
                entry, geometry, flat_w, out.reshape(n * ho * wo, cout), n * ho * wo, k, bn, bias, relu
            ).reshape(out.shape)
        if (
            cin < GEMM_BK
            and cout % 4 == 0
            and k * cout * 4 <= DIRECT_CONV_WEIGHT_BYTES
            and h * w * cin < 2**31
            and n < 65536
        ):  # grid (ho, n); 32-bit offsets within an image
            bias_arg = np.uint64(0) if bias is None else cp.ascontiguousarray(bias, dtype=cp.float32)
            if (cin, kh, kw, stride, cout) == (3, 3, 3, 1, 16) and wo <= 1024:  # the CNNs' first layer
                self._convolution_kernel("conv_direct_c3_k3_n16")(  # a block per output row, a thread per pixel
                    (ho, n),
                    (-(-wo // 32) * 32,),
                    (
                        x,
                        cp.ascontiguousarray(flat_w, dtype=cp.float32),
                        bias_arg,
                        out,
                        np.int32(h),
                        np.int32(w),
                        np.int32(wo),
                        np.int32(top),
                        np.int32(left),
                        np.int32(bool(relu)),
                    ),
                )
                return out
            self._convolution_kernel("conv_direct_x4")(  # a block per output row
                (ho, n),
                (THREADS,),
                (
                    x,
                    cp.ascontiguousarray(flat_w, dtype=cp.float32),
                    bias_arg,
                    out,
                    np.int32(h),
                    np.int32(w),
                    np.int32(cin),
                    np.int32(kh),
                    np.int32(kw),
                    np.int32(stride),
                    np.int32(wo),
                    np.int32(top),
                    np.int32(left),
                    np.int32(cout),
                    np.int32(bool(relu)),
                ),
                shared_mem=k * cout * 4,
            )
            return out
        chunk = max(1, IM2COL_LIMIT // (ho * wo * k))
        for start in range(0, n, chunk):
            part = x[start : start + chunk]
            m = part.shape[0]
            if kh == 1 and kw == 1 and stride == 1:
                cols = part.reshape(m * h * w, cin)
            else:
                cols = cp.empty((m * ho * wo, k), dtype=cp.float32)
                self._launch_patches("im2col_nhwc", part, cols, part.shape, kh, kw, stride)
            y = out[start : start + m].reshape(m * ho * wo, cout)
            self.gemm(cols, flat_w, out=y, bias=bias, relu=relu, cache_key=weight)
        return out

    def _launch_patches(self, name: str, src, dst, shape, kh: int, kw: int, stride: int) -> None:
        """Launch im2col_nhwc or col2im_nhwc from ``src`` into ``dst`` for the NHWC image ``shape``, a
        thread per element of ``dst``."""
        n, h, w, c = shape
        ho, top, _ = same_padding(h, kh, stride)
        wo, left, _ = same_padding(w, kw, stride)
        geometry = (n, h, w, c, kh, kw, stride, ho, wo, top, left)
        self._convolution_kernel(name)(_grid(dst.size), (THREADS,), (src, dst, *map(np.int32, geometry)))

    def training_cudnn(self):
        """The training's cuDNN convolutions on this device (:class:`CudnnTrainingConv`), made at first
        use; None without cuDNN."""
        if not hasattr(self, "_cudnn_training"):
            self._cudnn_training = CudnnTrainingConv.create(self.cupy)
        return self._cudnn_training

    def training_convolution(self, x, weight, stride: int):
        """conv(x, W) of float32 NHWC ``x`` in cuDNN (lent to ``xmesh.model.cnn.conv_forward``, with the
        two gradients below) where ``plan.training_conv_on_cudnn``; None for other convolutions and
        dtypes, without cuDNN, or for a shape it refuses (the im2col route takes those)."""
        cp = self.cupy
        if x.dtype != cp.float32 or weight.dtype != cp.float32 or x.ndim != 4:
            return None
        if not plan.training_conv_on_cudnn(x.shape, weight.shape, stride):
            return None
        cudnn = self.training_cudnn()
        if cudnn is None:
            return None
        try:
            return cudnn.forward(cp.ascontiguousarray(x), weight)
        except CudnnError:
            return None

    def training_data_gradient(self, dz, weight, x_shape, stride: int):
        """The input's gradient of a convolution :meth:`training_convolution` took."""
        return self.training_cudnn().data_gradient(self.cupy.ascontiguousarray(dz), weight, x_shape)

    def training_filter_gradient(self, x, dz, weight_shape, stride: int):
        """The weights' gradient of a convolution :meth:`training_convolution` took."""
        cp = self.cupy
        return self.training_cudnn().filter_gradient(cp.ascontiguousarray(x), cp.ascontiguousarray(dz), weight_shape)

    def training_im2col(self, x, kh: int, kw: int, stride: int):
        """The training CNN's 'SAME' patches of float32 NHWC ``x`` in one launch (lent to
        ``xmesh.model.cnn.im2col``): ((N*Ho*Wo, kh*kw*C) in (kh, kw, C) column order, (Ho, Wo)); None for
        arrays that are not float32 NHWC."""
        cp = self.cupy
        if x.dtype != cp.float32 or x.ndim != 4:
            return None
        x = cp.ascontiguousarray(x)
        ho, wo = same_padding(x.shape[1], kh, stride)[0], same_padding(x.shape[2], kw, stride)[0]
        cols = cp.empty((x.shape[0] * ho * wo, kh * kw * x.shape[3]), dtype=cp.float32)
        if cols.size:
            self._launch_patches("im2col_nhwc", x, cols, x.shape, kh, kw, stride)
        return cols, (ho, wo)

    def training_col2im(self, cols, shape, kh: int, kw: int, stride: int):
        """The backward of :meth:`training_im2col` (lent to ``xmesh.model.cnn.col2im``): each patch column
        summed back into an NHWC array of ``shape``, in one launch; None for arrays that are not float32."""
        cp = self.cupy
        if cols.dtype != cp.float32:
            return None
        cols = cp.ascontiguousarray(cols)
        dx = cp.empty(tuple(shape), dtype=cp.float32)
        if dx.size:
            self._launch_patches("col2im_nhwc", cols, dx, shape, kh, kw, stride)
        return dx
