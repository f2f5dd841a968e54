"""The Hopper kernels: warpgroup MMAs on compute capability 9.0 (H100, H200), built for ``sm_90a``
through NVRTC (wgmma exists only in that target).

``HopperGemm(cupy)`` (``launcher.py``, a mixin per kernel family: ``gemm.py``, ``layer.py``,
``chain.py``, ``layer_3xf16.py``) runs ``C = act(A B + bias)`` (``kernels/wgmma_gemm.cu``) and the
deformation blocks' layers: :meth:`HopperGemm.drb_layer` a whole local graph convolution (product,
43 x 43 mixing, bias, ReLU, residual), :meth:`HopperGemm.drb_chain16` a block's five wide layers in the
16-bit modes (``wgmma_drb16_chain.cu``), :meth:`HopperGemm.drb_layer_3xf16` the fp32 mode's layer as
three float16 products (``wgmma_drb32h.cu``), :meth:`HopperGemm.transposed_product` the training's
weights' gradients X^T dY (``wgmma_wgrad.cu``). B is prepared once per weight by
:meth:`HopperGemm.prepare`: transposed to K-major rows, split into TF32 big and small parts
(``"3xtf32"``), rounded to TF32 (``"tf32"``, one pass) or to float16 / bfloat16 (``"fp16"``, ``"bf16"``:
deformation layers only), zero-padded to whole tiles. In the 16-bit modes a deformation layer can also
store its output (and read its residual and X) in the mode's 16 bits (``activations.py``).
``families.py`` holds each kernel family's constants (one frozen dataclass each) and the operand modes;
``layouts.py`` the support's mixing source and the layouts the kernels read.
:class:`~xmesh.backends.cupy_backend.CupyBackend` sends large products and the deformation blocks here,
and the rest (and everything on other GPUs) to ``kernels/tc_gemm.cu`` and the stage files.
"""

from __future__ import annotations

from .activations import activation_dtype, narrow16, widen16
from .chain import PreparedChain
from .families import (
    ARCH,
    BLOCK_SMEM_LIMIT,
    CHAIN,
    DRB_LAYER,
    GEMM,
    LAYER_3XF16,
    MAX_DYNAMIC_SHARED_SIZE_BYTES,
    OPERANDS,
    WEIGHT_GRADIENT,
    WIDE_COLS,
    ChainKernel,
    GemmKernel,
    Layer3xf16Kernel,
    LayerKernel,
    OperandMode,
    WeightGradientKernel,
)
from .gemm import PreparedWeight, smem_bytes, supported
from .launcher import HopperGemm
from .layer_3xf16 import PreparedHalves
from .layouts import (
    accumulator_columns,
    chain_piece_index,
    hypothesis_rows,
    mixing_source,
    piece_index,
    vertex_tile_map,
)

__all__ = [
    "ARCH",
    "BLOCK_SMEM_LIMIT",
    "CHAIN",
    "DRB_LAYER",
    "GEMM",
    "LAYER_3XF16",
    "MAX_DYNAMIC_SHARED_SIZE_BYTES",
    "OPERANDS",
    "WEIGHT_GRADIENT",
    "WIDE_COLS",
    "ChainKernel",
    "GemmKernel",
    "Layer3xf16Kernel",
    "LayerKernel",
    "OperandMode",
    "WeightGradientKernel",
    "HopperGemm",
    "PreparedChain",
    "PreparedHalves",
    "PreparedWeight",
    "smem_bytes",
    "supported",
    "activation_dtype",
    "narrow16",
    "widen16",
    "accumulator_columns",
    "chain_piece_index",
    "hypothesis_rows",
    "mixing_source",
    "piece_index",
    "vertex_tile_map",
]
