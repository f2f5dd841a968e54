"""The GPU backend: CuPy arrays, xmesh's own CUDA kernels, cuDNN's convolutions in the speed modes.

Weights, the template and every intermediate stay on the device; a reconstruction makes no
device -> host copy. :class:`CupyBackend` is the device side (``device.py``: the GPU, kernel loading,
uploads, streams, CUDA graph capture) with one mixin per stage, each loading its own file of ``kernels/``:

- ``gemm.py`` (``kernels/tc_gemm.cu``; the Hopper GEMM of ``hopper/``): every matrix product runs
  through xmesh's own tensor-core GEMMs, on compute capability 9.0 (H100, H200) the large ones
  through warpgroup MMAs, the rest and every product on other GPUs through mma.sync;
- ``convolution.py`` (``kernels/convolution.cu``): 'SAME' convolutions, as implicit GEMMs
  (``conv_*`` of tc_gemm.cu), direct float32 sums for few input channels (``conv_direct_x4``) or
  ``im2col_nhwc`` + GEMM, bias and ReLU fused; in the speed modes the large stride-1 ones go to cuDNN
  where it is installed (``cudnn_conv.py``, through ctypes: CuPy 14 no longer reaches it);
- ``projection.py`` (``kernels/projection.cu``): ``graph_projection`` (the whole stage-1 projection in
  one launch) and ``local_projection`` (the whole stage-2 projection in one launch);
- ``graph_conv.py`` (``kernels/graph_conv.cu``): ``csr_gconv`` / ``csr_gconv_x4``, stage 1's graph
  convolution after its GEMM, and ``unpool_midpoints``;
- ``deformation.py`` (``kernels/deformation.cu``; the Hopper layer kernels of ``hopper/``): the
  local graph convolution (one kernel a layer on compute capability 9.0, else a GEMM and
  ``drb_mix_epilogue``), ``drb_score_update`` / ``drb_score_finish`` / ``hypothesis_softmax_update``
  (the softmax over the 43 hypotheses and the new vertex positions).

So a whole reconstruction is built from our kernels, CuPy element-wise kernels and (speed modes)
cuDNN's convolutions, and can be captured as one CUDA Graph (CuPy refuses cuBLAS under stream capture).

Precision: ``fp32`` (default: every product as "3xTF32", operands split into two TF32 parts and
three tensor-core products accumulated in float32, which keeps float32 accuracy), ``tf32`` (one
TF32 product: ~1e-3 relative error), ``fp16`` and ``bf16`` (the deformation layers' products with
float16 / bfloat16 operands and float32 accumulation, the CNN, stage 1 and the rest as in ``tf32``).
On compute capability 9.0 the 16-bit modes run in the Hopper layer kernel and can be captured; on
other GPUs ``fp16`` runs those products through cuBLAS (no capture) and ``bf16`` is refused (CuPy
has no bfloat16 arrays). The camera arithmetic is always exact float32.
"""

from __future__ import annotations

from ...model import cnn, products
from .convolution import ConvolutionStage
from .deformation import DeformationStage
from .device import CupyDevice
from .gemm import GemmStage
from .graph_conv import GraphConvStage
from .projection import ProjectionStage


class CupyBackend(DeformationStage, GraphConvStage, ProjectionStage, ConvolutionStage, GemmStage, CupyDevice):
    """The GPU backend (``get_backend("cupy", precision=..., device=...)``): the device and its stages.

    Once made, it lends the training passes its 3xTF32 GEMM for their large float32 products, its
    deformation layer kernel, and cuBLAS called directly for their other products
    (``xmesh.model.products``), and the training CNN its im2col and col2im and cuDNN's convolutions
    (``xmesh.model.cnn``), each for CuPy arrays only."""

    def __init__(self, precision: str = "fp32", device: int | None = None):
        super().__init__(precision, device)
        own = self._on_cupy_arrays
        products.lend(own(self.training_product))
        products.lend_layer(own(self.training_layer))
        products.lend_general(own(self.general_product))
        cnn.lend_patches(own(self.training_im2col), own(self.training_col2im))
        cnn.lend_convolution(
            own(self.training_convolution), own(self.training_data_gradient), own(self.training_filter_gradient)
        )

    def _on_cupy_arrays(self, method):
        """``method`` as lent to the training code: it declines (None) a first operand that is not a CuPy
        array, so a NumPy step in the same process runs on NumPy."""
        ndarray = self.cupy.ndarray

        def lent(first, *rest, **options):
            return method(first, *rest, **options) if isinstance(first, ndarray) else None

        return lent
