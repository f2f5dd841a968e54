"""Which of xmesh's CUDA kernels a reconstruction runs, per precision mode and GPU generation.

:class:`~xmesh.backends.cupy_backend.CupyBackend` builds a mode's kernels at construction, all at
once in threads (``cuda_kernels.prepare``), instead of one file after another as the model first
meets them; the Hopper deformation kernels, which are generated for the model's 43 x 43 support A1
(``cupy_backend.hopper.mixing_source``), are built together once the first support is known. A kernel
missing here still runs: it is then built alone, on demand (``cuda_kernels.builds_made_on_demand``
lists those; a GPU test keeps that list empty for the modes' reconstructions).

The lists cover the batch sizes a call can take (the tile widths and K slices that ``gemm`` picks
from the shapes), so one list per (mode, generation) serves every call. :func:`all_builds` is the
whole set a build step makes for one generation.
"""

from __future__ import annotations

from .cuda_kernels import KernelBuild
from .kernel_constants import (
    CONVOLUTION_FILE,
    DEFORMATION_FILE,
    GEMM_DEFINES,
    GEMM_FILE,
    GRAPH_CONV_FILE,
    PROJECTION_FILE,
    STAGE_DEFINES,
    defines,
)

GEMM, HOPPER = GEMM_FILE, "wgmma_gemm.cu"
STD = ("-std=c++17",)
#: the options the backend builds the stage files with (their launch constants by -D)
OPS_OPTIONS = STD + defines(STAGE_DEFINES)
#: The kernels of each stage file (kernel_constants.STAGE_FILES), each launched by the backend module
#: of that stage; tests/test_kernel_manifest.py checks them against the files.
STAGE_KERNELS = {
    CONVOLUTION_FILE: ("conv_direct_x4", "conv_direct_c3_k3_n16", "im2col_nhwc", "col2im_nhwc"),
    PROJECTION_FILE: (
        "graph_projection",
        "graph_projection_tiled",
        "local_projection",
        "local_projection_tiled",
        "local_projection_tiled_o16",
    ),
    GRAPH_CONV_FILE: ("unpool_midpoints", "csr_gconv", "csr_gconv_x4"),
    DEFORMATION_FILE: (
        "gconv_epilogue_f32",
        "gconv_epilogue_f16",
        "gconv_epilogue_f16_f32",
        "drb_mix_epilogue",
        "skinny_gemm16",
        "hypothesis_softmax_update",
        "drb_score_update",
        "drb_score_finish",
    ),
}
_STAGE_FILE = {name: file for file, names in STAGE_KERNELS.items() for name in names}
ARCH = "sm_90a"
MODES = ("fp32", "tf32", "fp16", "bf16")
#: the Hopper layer kernels' part of a name per mode (cupy_backend.hopper.OPERANDS) and WG_DRB_OPS code
_PART = {"fp32": ("3x", 3), "tf32": ("1x", 1), "fp16": ("f16", 16), "bf16": ("bf16", 17)}


def _tc(bk: int) -> tuple:
    return STD + defines(GEMM_DEFINES, XG_BK=bk)


def stage_file(name: str) -> str:
    """The stage file that defines kernel ``name`` (KeyError for a kernel of no stage file)."""
    return _STAGE_FILE[name]


def _ops(*names) -> list:
    return [KernelBuild(stage_file(name), name, OPS_OPTIONS) for name in names]


def _tc_gemm(passes: int) -> list:
    """tc_gemm.cu's kernels that ``CupyBackend.gemm`` and ``conv2d_same`` may pick in a mode of ``passes``
    TF32 products: every tile width of the dense products (16-byte or single-float copies) and of the
    convolutions in K slices of 16, the 3xTF32 dense products in slices of 32 too (few tiles), and the
    split-K reduction."""
    widths = (16, 32, 64, 128)
    builds = [KernelBuild(GEMM, f"conv_{passes}x_n{n}", _tc(16)) for n in widths]  # the CNN's, needed first
    builds += [KernelBuild(GEMM, f"gemm_{passes}x_n{n}_{c}", _tc(16)) for n in widths for c in "vs"]
    if passes == 3:
        builds += [KernelBuild(GEMM, f"gemm_3x_n{n}_{c}", _tc(32)) for n in widths for c in "vs"]
    return builds + [KernelBuild(GEMM, "gemm_splitk_reduce", _tc(16))]


def planned_builds(precision: str, hopper: bool) -> list:
    """The builds a reconstruction in ``precision`` runs that do not depend on the model's support:
    on a compute capability 9.0 GPU with the Hopper kernels (``hopper``), or on any other."""
    if precision not in MODES:
        raise ValueError(f"precision={precision!r}: choose one of {', '.join(MODES)}")
    passes = 3 if precision == "fp32" else 1
    sixteen = precision in ("fp16", "bf16")
    # in the order a reconstruction first needs them: they are compiled in that order
    builds = [KernelBuild(HOPPER, name, STD, ARCH) for name in ("wg_split_weight", "wg_pack_weight16") if hopper]
    builds += _ops(
        "im2col_nhwc",
        "conv_direct_c3_k3_n16",
        "conv_direct_x4",
        "graph_projection_tiled",
        "graph_projection",
        "local_projection",
        "csr_gconv",
        "csr_gconv_x4",
        "unpool_midpoints",
        "drb_score_update",
        "hypothesis_softmax_update",
    )
    builds += _ops("local_projection_tiled_o16" if sixteen and hopper else "local_projection_tiled")
    builds += _tc_gemm(passes)
    if hopper:
        builds += [KernelBuild(HOPPER, f"wg_gemm_{passes}x_{c}", STD, ARCH) for c in "vs"]
        builds += _ops("drb_score_finish")
    else:
        builds += _ops("drb_mix_epilogue")
        if sixteen:  # fp16 away from Hopper: the deformation layers' products in cuBLAS, then their epilogue
            builds += _ops("skinny_gemm16", "gconv_epilogue_f16")
    return builds


def planned_mixing_builds(precision: str, mixing: str) -> list:
    """The Hopper deformation kernels a reconstruction in ``precision`` runs for the support whose
    ``cupy_backend.hopper.mixing_source`` is ``mixing``."""
    from .cupy_backend import hopper as hg

    part, code = _PART[precision]
    if precision == "fp32":
        builds = [
            KernelBuild(hg.LAYER_3XF16.source, name, STD, ARCH, mixing)
            for name in ("wg_drb_layer_3xf16", "wg_drb_layer_3xf16_score")
        ]
    elif precision == "tf32":
        builds = []
    else:
        builds = [
            KernelBuild(hg.CHAIN.source, f"wg_drb_chain_{part}", STD, ARCH, mixing),
            KernelBuild(hg.CHAIN.source, f"wg_drb_chain_score_{part}", STD, ARCH, mixing),
        ]
    layer = mixing + f"#define WG_DRB_OPS {code}\n"
    ios = ("v", "s") if precision in ("fp32", "tf32") else ("v_o16", "h16")
    builds += [KernelBuild(HOPPER, f"wg_drb_layer_{part}_{io}", STD, ARCH, layer) for io in ios]
    return builds


def all_builds(hopper: bool, mixing: str = "") -> set:
    """Every build any mode's reconstruction runs on one GPU generation (with ``mixing``: the Hopper
    deformation kernels for that support too)."""
    builds = set()
    for mode in MODES:
        if mode == "bf16" and not hopper:
            continue
        builds.update(planned_builds(mode, hopper))
        if hopper and mixing:
            builds.update(planned_mixing_builds(mode, mixing))
    return builds
