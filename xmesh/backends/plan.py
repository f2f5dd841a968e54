"""Which kernel runs each step: the GPU backend's routing table and its shape conditions, in one place.

:data:`PLAN` lists, per fast path or backend method (``op``), the kernels that may run it, first
match first: the precision modes a row is for, the GPU it needs (``"sm90"``: compute capability 9.0,
H100/H200, with the Hopper kernels on; ``"any"``: every CUDA GPU; ``"cpu"``: the NumPy backend), the
shape condition in words, the kernel and its source, and why. Where no row of an op matches, the
model's reference code runs (``xmesh/ops.py``). The conditions that decide between rows are the
functions below; the backends call them, and tests/test_plan.py checks the table against the kernel
files and docs/ARCHITECTURE.md's kernel map. ``xmesh bench --explain`` prints the rows for this GPU
and mode (:func:`explain`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .cupy_backend.hopper.families import GEMM, WIDE_COLS
from .kernel_constants import GEMM_BK, GEMM_BM, GEMM_FEW_TILES_BK, HYPOTHESES

ALL_MODES = ("fp32", "tf32", "fp16", "bf16")
SPEED_MODES = ("tf32", "fp16", "bf16")
MODES_16BIT = ("fp16", "bf16")

#: A product with fewer output tiles than this (two blocks per H100/H200 multiprocessor) keeps all its
#: tiles resident at once: it stays off the wgmma GEMM, splits K, and in 3xTF32 takes 32-wide K slices.
GEMM_TARGET_BLOCKS = 264
#: A convolution goes to cuDNN from this many floating-point operations up (2 * outputs * taps * cin).
CUDNN_MIN_FLOP = 6.0e9
#: A training convolution goes to cuDNN from this many images up (batch 4's views; batch 1's three keep im2col).
TRAINING_CUDNN_MIN_IMAGES = 12


@dataclass(frozen=True)
class Route:
    op: str
    modes: tuple
    gpu: str
    condition: str
    kernel: str
    source: str
    why: str


PLAN = (
    Route(
        "gemm",
        ALL_MODES,
        "sm90",
        "N >= 128 and at least 264 tiles of 128 x 128 (gemm_on_hopper)",
        "wg_gemm_{3x,1x}_{v,s}",
        "wgmma_gemm.cu",
        "large products: warpgroup MMAs, B prepared once per weight (3xTF32 in fp32, TF32 in the speed modes)",
    ),
    Route(
        "gemm",
        ALL_MODES,
        "any",
        "every other product (tile width by N, gemm_k_slice; K split when few tiles)",
        "gemm_{3x,1x}_n{16,32,64,128}_{v,s}, gemm_splitk_reduce",
        "tc_gemm.cu",
        "mma.sync tensor cores on every GPU; 32-wide K slices for few-tile 3xTF32 products (stage 1 at small batch)",
    ),
    Route(
        "conv2d_same",
        SPEED_MODES,
        "any",
        "cuDNN installed, bias + ReLU, stride 1, odd square kernel, >= 6 GFLOP (conv_on_cudnn)",
        "cudnnConvolutionBiasActivationForward",
        "cudnn_conv.py",
        "large stride-1 convolutions run 2.5-3x faster in cuDNN's TF32 implicit GEMM",
    ),
    Route(
        "conv2d_same",
        ALL_MODES,
        "any",
        "cin a multiple of 16, cout of 4",
        "conv_{3x,1x}_n{16,32,64,128}",
        "tc_gemm.cu",
        "implicit GEMM: the image is read in place, no im2col buffer",
    ),
    Route(
        "conv2d_same",
        ALL_MODES,
        "any",
        "the CNNs' first layer (3 -> 16 channels, 3 x 3, stride 1)",
        "conv_direct_c3_k3_n16",
        "convolution.cu",
        "float32 sums, a thread a pixel: 3 input channels leave GEMM idle",
    ),
    Route(
        "conv2d_same",
        ALL_MODES,
        "any",
        "other few-channel convolutions (cin < 16) whose kernel fits 48 KB",
        "conv_direct_x4",
        "convolution.cu",
        "float32 sums with the kernel in shared memory",
    ),
    Route(
        "conv2d_same",
        ALL_MODES,
        "any",
        "anything else",
        "im2col_nhwc + gemm",
        "convolution.cu",
        "the general case, in image chunks",
    ),
    Route(
        "graph_projection",
        ALL_MODES,
        "any",
        "every map's channels a multiple of 4, 16-byte aligned maps",
        "graph_projection_tiled",
        "projection.cu",
        "a block per 8 points: pixel offsets once, 16-byte gathers",
    ),
    Route(
        "graph_projection",
        ALL_MODES,
        "any",
        "anything else",
        "graph_projection",
        "projection.cu",
        "a thread per channel",
    ),
    Route(
        "local_projection",
        MODES_16BIT,
        "sm90",
        "channels a multiple of 4, rows fit shared memory",
        "local_projection_tiled_o16",
        "projection.cu",
        "writes the block's first layer's X in the mode's 16 bits, as the chained layers read it",
    ),
    Route(
        "local_projection",
        ALL_MODES,
        "any",
        "channels a multiple of 4, rows fit shared memory",
        "local_projection_tiled",
        "projection.cu",
        "a block per 32 points: bilinear corners once, 16-byte gathers",
    ),
    Route(
        "local_projection",
        ALL_MODES,
        "any",
        "anything else",
        "local_projection",
        "projection.cu",
        "a thread per channel",
    ),
    Route(
        "local_projection",
        ("fp32",),
        "cpu",
        "three maps",
        "numba_kernels.local_projection",
        "numba_kernels.py",
        "compiled loops instead of 43 x 4 gathers of whole arrays",
    ),
    Route(
        "graph_conv",
        ALL_MODES,
        "any",
        "support 0 the identity, cout a multiple of 4, aligned",
        "gemm + csr_gconv_x4",
        "graph_conv.cu",
        "one product, then support 1, bias, ReLU and residual in one pass",
    ),
    Route(
        "graph_conv",
        ALL_MODES,
        "any",
        "support 0 the identity",
        "gemm + csr_gconv",
        "graph_conv.cu",
        "as above, a thread a column",
    ),
    Route(
        "unpool",
        ALL_MODES,
        "any",
        "float32 x, int64 edges",
        "unpool_midpoints",
        "graph_conv.cu",
        "the midpoints in one pass (also after a graph convolution's product)",
    ),
    Route(
        "drb_block_tail",
        MODES_16BIT,
        "sm90",
        "A_0 the identity, the model's widths, 16-bit X in aligned rows "
        "(chain_takes), score layer 192 x 2 (fusable_score)",
        "wg_drb_chain_score_{f16,bf16} + drb_score_finish",
        "wgmma_drb16_chain.cu",
        "five wide layers with the activations on chip, x5 never written",
    ),
    Route(
        "drb_block_layers",
        MODES_16BIT,
        "sm90",
        "as drb_block_tail, the score layer not fused",
        "wg_drb_chain_{f16,bf16}",
        "wgmma_drb16_chain.cu",
        "five wide layers in one kernel",
    ),
    Route(
        "drb_last_layer_score",
        ("fp32",),
        "sm90",
        "float32 X in aligned rows (layer_3xf16_takes), fusable score layer",
        "wg_drb_layer_3xf16_score + drb_score_finish",
        "wgmma_drb32h.cu",
        "the score layer's products in the last wide layer's epilogue, x5 never written",
    ),
    Route(
        "local_gconv",
        ("fp32",),
        "sm90",
        "A_0 the identity, [W0 | W1] 2 x 192 wide, float32 X in aligned rows (layer_3xf16_takes)",
        "wg_drb_layer_3xf16",
        "wgmma_drb32h.cu",
        "three float16 products at twice TF32's rate with float32's accuracy, mixing on the input side",
    ),
    Route(
        "local_gconv",
        ALL_MODES,
        "sm90",
        "A_0 the identity, cout a multiple of 32",
        "wg_drb_layer_{3x,1x,f16,bf16}_{v,s,v_o16,s_o16,h16}",
        "wgmma_gemm.cu",
        "the whole layer (product, 43 x 43 mixing, epilogue) in one kernel",
    ),
    Route(
        "local_gconv",
        ALL_MODES,
        "any",
        "A_0 the identity, not fp16 off sm90 (16-bit X: skinny_gemm16)",
        "gemm or skinny_gemm16 + drb_mix_epilogue",
        "deformation.cu",
        "one product, then the mixing and epilogue",
    ),
    Route(
        "local_gconv",
        ALL_MODES,
        "any",
        "A_0 not the identity, or fp16 off sm90",
        "cuBLAS + gconv_epilogue_*",
        "deformation.cu",
        "separate products through cuBLAS (float16 in fp16; no CUDA graph capture)",
    ),
    Route(
        "local_gconv",
        ("fp32",),
        "cpu",
        "A_0 the identity",
        "NumPy GEMMs",
        "numpy_backend.py",
        "one product and one mixing product per sample instead of the reference's three",
    ),
    Route(
        "score_update",
        ALL_MODES,
        "any",
        "one output column, cin <= 512 in whole 16-byte loads, not fp16 off sm90 with float32 X",
        "drb_score_update",
        "deformation.cu",
        "the score layer, softmax and vertex update in one launch, X read once",
    ),
    Route(
        "hypothesis_update",
        ALL_MODES,
        "any",
        "always",
        "hypothesis_softmax_update",
        "deformation.cu",
        "softmax over the hypotheses and the moved vertices in one launch",
    ),
    Route(
        "chamfer (metrics)",
        ALL_MODES,
        "any",
        "the cupy metric backend",
        "nn_bruteforce + nn_bruteforce_merge",
        "nn_bruteforce.cu",
        "exact nearest neighbours for the evaluation's Chamfer distance and F-score (and the training's "
        "Chamfer): the reference cloud walked in parts where the queries alone do not fill the GPU",
    ),
)

#: Kernel files no mode runs, and what keeps them.
REFERENCE_SOURCES = {
    "wgmma_drb16.cu": "the 16-bit chain's bit-exact one-layer reference (tests/drb16_reference.py)",
}
#: Kernel files only the training runs (no reconstruction reaches them), and what for.
TRAINING_SOURCES = {
    "wgmma_wgrad.cu": "the weights' gradients X^T dY on Hopper (cupy_backend.hopper.transposed_product)",
}
#: Kernel files only a benchmark script runs, and what they measure.
BENCHMARK_SOURCES = {
    "wgmma_rate.cu": "the tensor cores' 3xTF32 rate, alone and with A split or loaded (scripts/wgmma_rate.py)",
}


# ----------------------------------------------------------------------------- the conditions
def _address(x) -> int:
    data = x.data
    return data.ptr if hasattr(data, "ptr") else x.ctypes.data


def evenly_spaced_rows(x) -> bool:
    """Whether x (B, 43, N, C), float32 or 16-bit, has unit-stride rows evenly spaced ldx >= C elements
    apart through the whole array (what the deformation kernels read in place)."""
    if x.ndim != 4 or x.dtype.name not in ("float32", "float16", "uint16"):
        return False
    size = x.dtype.itemsize
    b, k, n, c = x.shape
    s0, s1, s2, s3 = x.strides
    return s3 == size and s2 % size == 0 and s2 >= size * c and s1 == n * s2 and s0 == k * s1


def aligned_float32_rows(x) -> bool:
    """float32 (B, 43, N, C) with evenly spaced rows a multiple of 4 floats apart, 16-byte aligned."""
    return (
        x.ndim == 4
        and x.dtype.name == "float32"
        and x.shape[1] == HYPOTHESES
        and evenly_spaced_rows(x)
        and (x.strides[2] // 4) % 4 == 0
        and _address(x) % 16 == 0
    )


def chain_takes(x, cin: int) -> bool:
    """Whether the 16-bit chain (HopperGemm.drb_chain16) reads this X: a (B, 43, N, cin) 16-bit array
    with rows evenly spaced a multiple of 8 elements apart, 16-byte aligned (the local projection's
    16-bit output, rows of 344 for cin 339)."""
    return (
        x.ndim == 4
        and x.dtype.name in ("float16", "uint16")
        and x.shape[1] == HYPOTHESES
        and x.shape[3] == cin
        and evenly_spaced_rows(x)
        and (x.strides[2] // 2) % 8 == 0
        and _address(x) % 16 == 0
    )


def layer_3xf16_takes(x, k: int, mixing: str) -> bool:
    """Whether the fp32 mode's three-float16-products layer (HopperGemm.drb_layer_3xf16) reads this X:
    float32 (B, 43, N, k) in aligned rows, and the A1 built into ``mixing``."""
    return bool(mixing) and aligned_float32_rows(x) and x.shape[3] == k


def fusable_score(score) -> bool:
    """Whether a block's score layer can run in its last wide layer's epilogue: one output column, A_0
    the identity (one [W0 | W1] of 192 x 2)."""
    return score.weight0 is None and score.cout == 1 and score.weight.shape == (WIDE_COLS, 2)


def gemm_on_hopper(m: int, n: int) -> bool:
    """Whether an (m, n) product runs in the wgmma GEMM (where it is available)."""
    return n >= GEMM.bn and -(-m // GEMM.bm) * -(-n // GEMM.bn) >= GEMM_TARGET_BLOCKS


def gemm_k_slice(passes: int, m: int, n: int, bn: int) -> int:
    """The K slice of the tc_gemm.cu build an (m, n) product runs in with tiles ``bn`` wide: 32 for a
    3xTF32 product whose tiles are all resident at once (the time goes per slice there), else 16."""
    few = -(-m // GEMM_BM) * -(-n // bn) < GEMM_TARGET_BLOCKS
    return GEMM_FEW_TILES_BK if passes == 3 and few else GEMM_BK


def conv_on_cudnn(x_shape, weight_shape, stride: int) -> bool:
    """Whether a convolution goes to cuDNN (in the speed modes, where it is installed): stride 1, an
    odd square kernel, and at least CUDNN_MIN_FLOP of work (smaller ones run as fast in ours)."""
    n, h, w, cin = x_shape
    kh, kw, _, cout = weight_shape
    return stride == 1 and kh == kw and kh % 2 == 1 and 2.0 * n * h * w * cout * kh * kw * cin >= CUDNN_MIN_FLOP


def training_conv_on_cudnn(x_shape, weight_shape, stride: int) -> bool:
    """Whether a training convolution goes to cuDNN (its float32 multiply-adds, where it is installed):
    stride 1, an odd square kernel, and at least TRAINING_CUDNN_MIN_IMAGES images (batch 4's views):
    over fewer the im2col route is as fast (``scripts/training_cnn_bench.py``, docs/training.md)."""
    kh, kw = weight_shape[:2]
    return stride == 1 and kh == kw and kh % 2 == 1 and x_shape[0] >= TRAINING_CUDNN_MIN_IMAGES


# ----------------------------------------------------------------------------- the printed plan
def routes(precision: str, gpu: str, cudnn: bool = False) -> list:
    """The rows that can run in ``precision`` on ``gpu`` ("sm90", "any": another CUDA GPU, "cpu"), in
    the table's order."""
    gpus = {"sm90": ("sm90", "any"), "any": ("any",), "cpu": ("cpu",)}[gpu]
    return [r for r in PLAN if precision in r.modes and r.gpu in gpus and (cudnn or r.source != "cudnn_conv.py")]


def explain(precision: str, gpu: str, cudnn: bool = False) -> str:
    """The plan for one mode and GPU as text: per op, its kernels in the order they are tried."""
    device = "CPU" if gpu == "cpu" else "compute capability 9.0" if gpu == "sm90" else "a CUDA GPU"
    lines = [
        f"precision {precision}, {device}"
        f"{', cuDNN' if cudnn else ''}: per step, the kernels tried in order (else the model's reference code)"
    ]
    op = None
    for r in routes(precision, gpu, cudnn):
        if r.op != op:
            op = r.op
            lines.append(f"{op}:")
        lines.append(f"  {r.kernel} ({r.source})\n      when {r.condition}\n      why: {r.why}")
    return "\n".join(lines)


def explain_backend(backend) -> str:
    """:func:`explain` for a constructed backend (its precision, GPU and cuDNN)."""
    if backend.name == "numpy":
        return explain("fp32", "cpu")
    gpu = "sm90" if backend.hopper is not None else "any"
    return explain(backend.precision, gpu, cudnn=backend._cudnn is not None)
