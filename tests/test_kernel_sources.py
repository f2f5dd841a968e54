"""The CUDA sources as NVRTC gets them (xmesh/backends/cuda_kernels.kernel_source): our own headers
(kernels/*.cuh) put in place of their #include lines, each once. Runs without a GPU."""

from __future__ import annotations

import re

import pytest

from xmesh.backends import cuda_kernels
from xmesh.backends.cuda_kernels import kernel_path, kernel_source
from xmesh.errors import MissingFileError

INCLUDE = re.compile(r'^\s*#include\s+"', re.MULTILINE)


def definitions(source: str, name: str) -> int:
    return len(re.findall(rf"__device__ __forceinline__ [\w ]+ {name}\(", source))


@pytest.mark.parametrize(
    "filename,headers",
    [
        ("wgmma_gemm.cu", ["wgmma_common.cuh", "bits16.cuh"]),
        ("wgmma_drb16.cu", ["drb16_tile.cuh", "wgmma_common.cuh", "bits16.cuh"]),
        ("wgmma_drb16_chain.cu", ["drb16_tile.cuh", "wgmma_common.cuh", "bits16.cuh"]),
        ("wgmma_drb32h.cu", ["drb16_tile.cuh", "wgmma_common.cuh", "bits16.cuh"]),
        ("wgmma_wgrad.cu", ["wgmma_common.cuh", "bits16.cuh"]),
        ("projection.cu", ["stage_common.cuh", "kernel_select.cuh", "bits16.cuh"]),
        ("deformation.cu", ["stage_common.cuh", "kernel_select.cuh", "bits16.cuh"]),
    ],
)
def test_headers_are_put_in_place_once(filename, headers):
    source = kernel_source(filename)
    assert not INCLUDE.search(source), "an #include of ours was left for NVRTC to resolve"
    for header in headers:
        assert kernel_path(header).is_file()
        assert source.count(f"// ---- {header}\n") == 1
    assert definitions(source, "xm_widen16") == 1  # the 16-bit widening exists once, in bits16.cuh
    if filename.startswith("wgmma_"):
        assert definitions(source, "wg_pack") == 1 and definitions(source, "wg_desc") == 1


def test_a_header_included_twice_is_expanded_once(tmp_path, monkeypatch):
    (tmp_path / "a.cuh").write_text('#include "b.cuh"\nint a;\n')
    (tmp_path / "b.cuh").write_text("int b;\n")
    (tmp_path / "main.cu").write_text('#include "a.cuh"\n#include "b.cuh"\n#include <cuda_fp16.h>\nint m;\n')
    monkeypatch.setattr(cuda_kernels, "kernel_path", lambda name: tmp_path / name)
    source = kernel_source("main.cu")
    assert source.count("int b;") == 1 and source.index("int b;") < source.index("int a;") < source.index("int m;")
    assert "#include <cuda_fp16.h>" in source  # system headers stay for NVRTC


def test_a_missing_header_names_the_file(tmp_path, monkeypatch):
    (tmp_path / "main.cu").write_text('#include "gone.cuh"\n')
    monkeypatch.setattr(cuda_kernels, "kernel_path", lambda name: tmp_path / name)
    with pytest.raises(MissingFileError, match="gone.cuh"):
        kernel_source("main.cu")


def macro(source: str, name: str) -> int:
    """The integer value of ``#define name EXPR`` in a kernel source, EXPR evaluated with the source's
    other macros (integer arithmetic only)."""
    defines = dict(re.findall(r"^#define (\w+) ([^/\n]+)", source, re.MULTILINE))

    def value(key):
        expr = re.sub(r"[A-Z][A-Z0-9_]+", lambda m: str(value(m.group(0))), defines[key])
        return int(eval(expr, {"__builtins__": {}}))  # our own sources: digits, names, + - * / ( )

    return value(name)


def macros(source: str, *names: str) -> tuple:
    """:func:`macro`'s values of ``names``, in their order."""
    return tuple(macro(source, name) for name in names)


def test_chained_layers_fit_shared_memory_as_the_host_reckons():
    """wgmma_drb16_chain.cu: the block's shared memory (two activation buffers and the Z slots of 176
    rows, the six W pieces, alignment slack) is what the hopper package launches it with, no more than an
    H100/H200 block may have (227 KB); its buffers are whole 1024-byte swizzle groups, and the Z buffer's
    rows past the tile hold the W ring's and X's barriers; Q's six
    half-buffers hold X's slices; the five layers are the first and the hopper package's 192-wide ones; both
    16-bit kernels exist; the header shares the vertex tile with the one-layer kernel."""
    from xmesh.backends.cupy_backend import hopper as hg

    source = kernel_source(hg.CHAIN.source)
    assert macro(source, "ZC_SMEM_BYTES") == hg.CHAIN.smem <= 227 * 1024
    assert macro(source, "ZC_KBUF_BYTES") % 1024 == 0 and macro(source, "ZC_PIECE_BYTES") % 1024 == 0
    assert macro(source, "ZC_KBUF_BYTES") >= macro(source, "ZL_TILE_ROWS") * 128
    # the transaction barriers (8 bytes each) of the W ring's slots (two pieces a slot) and of Q's three K
    # buffers as lc1's X sit in the Z buffer's rows past the tile's
    barriers = macro(source, "ZC_PIECES") // 2 + 3
    assert macro(source, "ZL_TILE_ROWS") * 128 + 8 * barriers <= macro(source, "ZC_KBUF_BYTES")
    assert "w_full = z_smem + ZL_TILE_ROWS * 128" in source and "x_full = w_full + 8 * ZC_PIECES / 2" in source
    assert macro(source, "ZC_ACT_BYTES") == 3 * macro(source, "ZC_KBUF_BYTES")  # three K buffers: six halves
    assert (
        macro(source, "ZC_HIDDEN") == hg.CHAIN.hidden_layers
        and macro(source, "ZC_LAYERS") == hg.CHAIN.hidden_layers + 1
    )
    assert macro(source, "ZC_SLICES") * 32 == hg.WIDE_COLS
    assert 3 * macro(source, "ZC_MMA_REGS") + macro(source, "ZC_PRODUCER_REGS") == 4 * 128
    for part in ("f16", "bf16"):
        assert f"wg_drb_chain_{part}," in source
    assert definitions(source, "zl_mix_slice_column") == 1


def test_three_half_products_layer_fits_shared_memory_as_the_host_reckons():
    """wgmma_drb32h.cu: the block's shared memory (three X and two Z slots of 192 rows x 128 bytes, four W
    slots of a slice's four 96-column pieces, the transaction barriers, alignment slack) is what
    the hopper package launches it with, within an H100/H200 block's 227 KB; the slots are whole 1024-byte
    swizzle groups; the tile's columns are the hopper package's; the registers setmaxnreg moves add up to the
    block's."""
    from xmesh.backends.cupy_backend import hopper as hg

    source = kernel_source(hg.LAYER_3XF16.source)
    assert macro(source, "H_SMEM_BYTES") == hg.LAYER_3XF16.smem <= 227 * 1024
    assert (
        macro(source, "H_SLOT_BYTES") % 1024 == 0
        and macro(source, "H_SLOT_BYTES") >= macro(source, "ZL_TILE_ROWS") * 128
    )
    assert (
        macro(source, "H_SLICE_BYTES") % 1024 == 0
        and macro(source, "H_SLICE_BYTES") == 4 * hg.LAYER_3XF16.tile_columns * 64
    )
    assert (
        macro(source, "H_BK") == hg.LAYER_3XF16.k_slice == 32 and macro(source, "H_CT") == hg.LAYER_3XF16.tile_columns
    )
    assert "wg_drb_layer_3xf16(" in source
    assert 3 * macro(source, "H_MMA_REGS") + macro(source, "H_PRODUCER_REGS") == 4 * 128


def test_weight_gradient_kernel_fits_shared_memory_as_the_host_reckons():
    """wgmma_wgrad.cu: its U tile, K slice, threads and ring depth are the hopper package's
    (WEIGHT_GRADIENT), and so are a ring stage's and a transposed slice's bytes for each build's tile
    width (wgt_stage_bytes, wgt_split_bytes); each build's block fits an H100/H200 block's 227 KB, its
    transposed slices whole swizzle groups; every build exists, and the host picks the width that pads
    the columns least."""
    from xmesh.backends.cupy_backend import hopper as hg

    w = hg.WEIGHT_GRADIENT
    source = kernel_source(w.source)
    assert macros(source, "WGT_ROWS", "WG_BK", "WGT_THREADS", "WGT_STAGES") == (w.rows, w.bk, w.threads, w.stages)
    assert "return WG_BK * (WGT_U_STRIDE + bn) * 4;" in source and macro(source, "WGT_U_STRIDE") == w.rows + 8
    assert "return 2 * bn * 128;" in source
    for bn in w.widths:
        assert f"WGT_KERNEL({w.name(bn)}, {bn}, WGT_STAGES)" in source
        assert w.smem(bn) <= 227 * 1024 and w.split_bytes(bn) % 1024 == 0 and (bn * 128) % 1024 == 0
    # the deformation layers' weights' gradients: 192 inputs in two 96-wide tiles, 339 in three of 128
    assert (w.width_for(192), w.width_for(339), w.width_for(64), w.width_for(20)) == (96, 128, 64, 64)


def test_the_layer_kernel_fits_shared_memory_as_the_host_reckons():
    """wgmma_gemm.cu's deformation layer: its tile, ring depth and threads are the hopper package's
    (DRB_LAYER), and so are both stagings after the ring (the forward's, and the carried gradient's:
    the y tiles' hypothesis rows, the residual's and the mask's tiles); ring and staging fit an
    H100/H200 block's 227 KB either way."""
    from xmesh.backends.cupy_backend import hopper as hg
    from xmesh.backends.cupy_backend.hopper.gemm import smem_bytes

    layer = hg.DRB_LAYER
    source = kernel_source(layer.source)
    names = ("ROWS", "VERTS", "STAGES", "THREADS", "STAGING_BYTES", "GRADIENT_STAGING_BYTES", "LEAN_STAGING_BYTES")
    assert macros(source, *(f"WG_DRB_{name}" for name in names)) == (
        layer.rows,
        layer.vertices,
        layer.stages,
        layer.threads,
        layer.staging_bytes,
        layer.gradient_staging_bytes,
        layer.lean_staging_bytes,
    )
    ring = smem_bytes("3xtf32", 2 * layer.cols, layer.rows, layer.stages)
    assert ring + max(layer.staging_bytes, layer.gradient_staging_bytes) <= 227 * 1024 == hg.BLOCK_SMEM_LIMIT
    assert 3 * macro(source, "WG_DRB_MMA_REGS") + macro(source, "WG_DRB_EPILOGUE_REGS") == 4 * 128
    # the training's kernels hold a 192-wide layer's weight (forward and carried gradient); a 339-wide one
    # only beside the lean staging of a forward without a residual (the block's first layer)
    assert macro(source, "WG_HELD_SLICE") == layer.held_slice
    assert max(layer.held_smem(192), layer.held_smem(192, gradient=True)) <= hg.BLOCK_SMEM_LIMIT < layer.held_smem(339)
    assert layer.held_smem(339, lean=True) <= hg.BLOCK_SMEM_LIMIT < layer.held_smem(339, gradient=True)
