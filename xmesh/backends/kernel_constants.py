"""The launch constants the CuPy backend shares with its CUDA files, one Python definition each.

The stage files (``kernels/convolution.cu``, ``projection.cu``, ``graph_conv.cu``, ``deformation.cu``)
and ``kernels/tc_gemm.cu`` define none of these names: the backend passes
them to the compiler with ``-D`` (:func:`defines`), and a file built without them stops with an
``#error``. tests/test_kernel_constants.py checks that every name a file expects is in its table.
(The Hopper kernels' constants are checked against their files by tests/test_kernel_sources.py.)
"""

from __future__ import annotations

#: The stage kernels' files, each loaded by the backend module of its stage (xmesh/backends/cupy_backend/).
CONVOLUTION_FILE, PROJECTION_FILE = "convolution.cu", "projection.cu"
GRAPH_CONV_FILE, DEFORMATION_FILE = "graph_conv.cu", "deformation.cu"
STAGE_FILES = (CONVOLUTION_FILE, PROJECTION_FILE, GRAPH_CONV_FILE, DEFORMATION_FILE)
GEMM_FILE = "tc_gemm.cu"

#: Hypotheses per vertex the fused deformation kernels are built for.
HYPOTHESES = 43
#: The most views a projection kernel takes.
MAX_VIEWS = 8
#: Row formats of the activations the kernels read or write: float32, float16, bfloat16 bits.
ROWS_F32, ROWS_F16, ROWS_BF16 = 0, 1, 2
#: The tiled graph projection (stage 1): points per block, threads per block.
GRAPH_POINTS, GRAPH_THREADS = 8, 256
#: The tiled local projection (stage 2): points per block, threads per block (its launch bound), and
#: the bytes of one point's bilinear corners at one (view, map) (sizeof(XmBilinear), not passed).
LOCAL_POINTS, LOCAL_THREADS, LOCAL_TAP_BYTES = 32, 224, 32
#: drb_score_update: vertices per block, threads per block (at least vertices x hypotheses); the
#: longest input row drb_score_update and skinny_gemm16 hold their weights for, and skinny_gemm16's
#: most output columns.
SCORE_VERTICES, SCORE_THREADS, SKINNY_MAX_K, SKINNY_MAX_COLS = 4, 192, 512, 8
#: drb_score_finish: vertices per block (a warp reads a hypothesis's rows of 16 of them in one
#: 128-byte piece) and threads per block (at least vertices x hypotheses).
SCORE_FINISH_VERTICES, SCORE_FINISH_THREADS = 16, 704
#: tc_gemm.cu's tile: 128 rows of C per block, K in slices of GEMM_BK (GEMM_FEW_TILES_BK for the
#: few-tile 3xTF32 products, a second build) through a GEMM_STAGES-deep shared-memory ring, threads.
GEMM_BM, GEMM_BK, GEMM_FEW_TILES_BK, GEMM_STAGES, GEMM_THREADS = 128, 16, 32, 3, 256

#: The stage files' -D names and their values (one table: kernels/stage_common.cuh checks them all).
STAGE_DEFINES = {
    "XM_HYP": HYPOTHESES,
    "XM_MAX_VIEWS": MAX_VIEWS,
    "XM_ROWS_F32": ROWS_F32,
    "XM_ROWS_F16": ROWS_F16,
    "XM_ROWS_BF16": ROWS_BF16,
    "XM_GP_POINTS": GRAPH_POINTS,
    "XM_GP_THREADS": GRAPH_THREADS,
    "XM_LP_POINTS": LOCAL_POINTS,
    "XM_LP_THREADS": LOCAL_THREADS,
    "XM_SU_VERTS": SCORE_VERTICES,
    "XM_SU_THREADS": SCORE_THREADS,
    "XM_SF_VERTS": SCORE_FINISH_VERTICES,
    "XM_SF_THREADS": SCORE_FINISH_THREADS,
    "XM_SKINNY_K": SKINNY_MAX_K,
    "XM_SKINNY_COLS": SKINNY_MAX_COLS,
}
#: tc_gemm.cu's -D names and their values but the K slice (XG_BK, one build per width).
GEMM_DEFINES = {"XG_BM": GEMM_BM, "XG_STAGES": GEMM_STAGES, "XG_THREADS": GEMM_THREADS}


def defines(table: dict, **extra) -> tuple:
    """Compiler options ``-DNAME=VALUE`` for a table of constants (and ``extra`` names)."""
    return tuple(f"-D{name}={value}" for name, value in {**table, **extra}.items())
