"""What the Hopper deformation kernels are built and fed with, made on the host: the support's mixing
source (A1's nonzeros as immediates), the 16-bit W pieces' layout, X's rows and tensor map.
"""

from __future__ import annotations

import numpy as np

from ... import plan, tensor_map
from ...kernel_constants import HYPOTHESES
from .families import CHAIN, DRB_LAYER, WIDE_COLS


def mixing_source(a1) -> str:
    """CUDA source of ``wg_mix_sparse`` for one 43 x 43 A1 (the deformation blocks' sample support):
    wg_mix_sparse(i, y) = sum_j A1[i, j] y[j] as an fmaf chain over row i's nonzero entries in
    increasing j, with the values as immediates (a switch on i, which the kernel's unrolled loop over
    the hypotheses resolves at compile time); and ``wg_mix_column``, the same sums taken a column of
    A1 at a time (independent chains, for kernels that stream X through registers). Put before
    ``wgmma_gemm.cu`` it turns on WG_MIX_SPARSE there; ``wgmma_drb16.cu`` needs it."""
    a1 = np.asarray(a1, dtype=np.float32)
    if a1.shape != (HYPOTHESES, HYPOTHESES):
        raise ValueError(f"A1 must be {HYPOTHESES} x {HYPOTHESES}, got {a1.shape}")
    lines = [
        "#define WG_MIX_SPARSE 1",
        f"__device__ __forceinline__ float wg_mix_sparse(int i, const float (&y)[{HYPOTHESES}]) {{",
        "    float m = 0.0f;",
        "    switch (i) {",
    ]
    for i in range(HYPOTHESES):
        terms = "".join(
            f" m = fmaf(__uint_as_float(0x{int(a1[i, j].view(np.uint32)):08x}u), y[{j}], m);"
            for j in np.flatnonzero(a1[i])
        )
        lines.append(f"    case {i}:{terms} break;")
    lines += [
        "    }",
        "    return m;",
        "}",
        "// wg_mix_column(j, x, m): m[i] = fmaf(A1[i, j], x, m[i]) for row i of every nonzero of column j.",
        "// Run for j = 0..42 from m = 0, each row's sum takes its terms in the order wg_mix_sparse does",
        "// (so the same result, bit for bit), with the 43 rows' chains independent of each other.",
        f"__device__ __forceinline__ void wg_mix_column(int j, float x, float (&m)[{HYPOTHESES}]) {{",
        "    switch (j) {",
    ]
    for j in range(HYPOTHESES):
        terms = "".join(
            f" m[{i}] = fmaf(__uint_as_float(0x{int(a1[i, j].view(np.uint32)):08x}u), x, m[{i}]);"
            for i in np.flatnonzero(a1[:, j])
        )
        lines.append(f"    case {j}:{terms} break;")
    lines += ["    }", "}"]
    return "\n".join(lines) + "\n"


def accumulator_columns(n: int = WIDE_COLS):
    """The output column that each of a 16-bit input-side tile's ``n`` accumulator columns holds (as
    zl_column in kernels/drb16_tile.cuh): accumulator column f -> 32 (j // 4) + 8 t + 2 (j % 4) + f % 2
    with j = f // 8, t = (f // 2) % 4, so that a quad thread's outputs lie in 16-byte pieces."""
    f = np.arange(n)
    j, t = f >> 3, (f >> 1) & 3
    return 32 * (j >> 2) + 8 * t + 2 * (j & 3) + (f & 1)


def piece_index(ldb: int, slices: int, columns: int = WIDE_COLS) -> np.ndarray:
    """Where each 16-bit element of a stream of W pieces comes from (the 16-bit chain's and the 3xf16
    layer's shared-memory form of W): for stream axes (K slice, column group g, piece h, accumulator
    column n, 16-byte chunk position pos, element e) the flat index, into a layer's unpaired K-major
    weight (2 x 192 rows of ``ldb`` >= 32 ``slices``, row c holding column c of [W0 | W1]), of W1 (h = 0)
    or W0 (h = 1) at column ``columns`` g + accumulator_columns()[n] and K row 32 slice + 8 c + e, where
    c = pos ^ ((n >> 1) & 3) (the 64-byte swizzle); 192 / ``columns`` groups."""
    n = np.arange(columns)
    chunk = np.arange(4)[None, :] ^ ((n[:, None] >> 1) & 3)  # (n, pos)
    col = columns * np.arange(WIDE_COLS // columns)[:, None] + accumulator_columns(columns)[None, :]  # (g, n)
    w_row = np.array([WIDE_COLS, 0])[None, :, None] + col[:, None, :]  # (g, h, n): W1 then W0
    k = (
        32 * np.arange(slices)[:, None, None, None] + 8 * chunk[None, :, :, None] + np.arange(8)[None, None, None, :]
    )  # (ks, n, pos, e)
    return w_row[None, :, :, :, None, None] * ldb + k[:, None, None]  # (ks, g, h, n, pos, e)


def chain_piece_index(ldb: int, slices: int = CHAIN.k_slices) -> np.ndarray:
    """:func:`piece_index` of all 192 columns (one group), axes (K slice, piece h, accumulator column
    n, pos, e): the 16-bit chain's W stream (:meth:`HopperGemm.prepare_chain16`)."""
    return piece_index(ldb, slices)[:, 0]


def hypothesis_rows(cupy, x):
    """x (B, 43, N, C) as the deformation layer kernel reads it: unchanged when its rows (last axis,
    unit stride) are evenly spaced ldx >= C elements apart through the whole array (e.g. the local
    projection's rows padded to 340 floats), else a contiguous copy. float32, or 16-bit activations
    (float16, uint16 holding bfloat16) kept in their type; any other type becomes float32."""
    if plan.evenly_spaced_rows(x):
        return x
    half = x.dtype in (cupy.float16, cupy.uint16)
    return cupy.ascontiguousarray(x, dtype=x.dtype if half else cupy.float32)


def vertex_tile_map(x, columns: int):
    """The tensor map through which the input-side kernels copy X (B, 43, N, cin) (see
    :func:`hypothesis_rows`; 16-byte aligned rows): X as (B * 43 hypotheses, N vertices, cin columns),
    a box of ``columns`` x a tile's 4 vertices x 43 hypotheses (its rows 4 i + v) at a time."""
    b, _, n, cin = x.shape
    return tensor_map.tiled(
        x.data.ptr,
        (cin, n, b * HYPOTHESES),
        (x.strides[2], x.strides[1]),
        (columns, DRB_LAYER.vertices, HYPOTHESES),
        element_bytes=x.itemsize,
    )
