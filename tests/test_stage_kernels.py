"""Each kernel is defined in the file it is loaded from: the stage files' kernels (read from their
sources' XM_KERNEL definitions) against the manifest's table, the names each stage module of the CuPy
backend launches, the plan's rows and the Hopper families' files. Runs without a GPU."""

from __future__ import annotations

import ast
import re

import pytest

from xmesh.backends import kernel_manifest, plan
from xmesh.backends.cuda_kernels import defined_kernels, kernel_path
from xmesh.backends.cupy_backend import convolution, deformation, graph_conv, hopper, projection
from xmesh.backends.kernel_constants import STAGE_FILES

STAGE_MODULES = [convolution, projection, graph_conv, deformation]
ALL_SOURCES = sorted(p.name for p in kernel_path("tc_gemm.cu").parent.glob("*.cu"))


def test_each_stage_file_defines_the_kernels_the_manifest_says():
    assert tuple(kernel_manifest.STAGE_KERNELS) == STAGE_FILES
    for file, names in kernel_manifest.STAGE_KERNELS.items():
        assert set(names) == defined_kernels(file) and len(set(names)) == len(names), file
        assert all(kernel_manifest.stage_file(name) == file for name in names)
    names = [n for file in STAGE_FILES for n in defined_kernels(file)]
    assert len(names) == len(set(names)), "a kernel is defined in two stage files"


def string_constants(module) -> set:
    """Every string literal in a module's source (f-strings' fixed parts left out)."""
    tree = ast.parse(open(module.__file__, encoding="utf-8").read())
    skip = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
    }


@pytest.mark.parametrize("module", STAGE_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_each_stage_module_launches_exactly_its_own_files_kernels(module):
    """The kernel names a stage module's code holds are the kernels its own file defines, no more, no
    fewer (a kernel left in another stage's file, or lost in the split, fails here)."""
    every_kernel = set().union(*(defined_kernels(name) for name in ALL_SOURCES))
    named = string_constants(module) & every_kernel
    assert module.SOURCE in STAGE_FILES
    assert named == defined_kernels(module.SOURCE), module.SOURCE


def test_the_stage_module_of_each_file_loads_it():
    loaders = {m.SOURCE: m for m in STAGE_MODULES}
    assert set(loaders) == set(STAGE_FILES)
    for file, module in loaders.items():
        assert module.SOURCE == file and module.__name__.rsplit(".", 1)[1] == file[: -len(".cu")]


def expansions(token: str):
    """A plan row's kernel pattern (``{a,b}`` choices, ``*`` any tail) as regexes, one per choice fixed:
    each must match a defined kernel (not every combination exists)."""
    parts = re.split(r"(\{[^}]*\})", token)
    groups = [i for i, p in enumerate(parts) if p.startswith("{")]

    def regex(fixed):
        out = []
        for i, p in enumerate(parts):
            if i in fixed:
                out.append(re.escape(fixed[i]))
            elif p.startswith("{"):
                out.append("(" + "|".join(re.escape(c) for c in p[1:-1].split(",")) + ")")
            else:
                out.append(re.escape(p).replace(r"\*", r"\w+"))
        return re.compile("".join(out) + "$")

    if not groups:
        return [regex({})]
    return [regex({i: c}) for i in groups for c in parts[i][1:-1].split(",")]


def test_each_kernel_a_plan_row_names_is_defined_in_its_file():
    """A row's kernels are defined in its source file; a stage kernel that follows a Hopper kernel (the
    score's finish) in the stage file the manifest names for it."""
    not_kernels = {"gemm"}
    checked = 0
    for route in plan.PLAN:
        if not route.source.endswith(".cu"):
            continue
        for token in re.split(r" \+ | or |, (?![^{]*})", route.kernel):
            if token in not_kernels or token.startswith("cuBLAS"):
                continue
            fixed = token.split("{")[0].rstrip("*")
            file = route.source
            if fixed in kernel_manifest._STAGE_FILE and file not in STAGE_FILES:
                file = kernel_manifest.stage_file(fixed)
            defined = defined_kernels(file)
            for pattern in expansions(token):
                assert any(pattern.match(name) for name in defined), (route.op, token, file)
            checked += 1
    assert checked >= 25


def test_each_hopper_family_file_defines_its_kernels():
    gemm = defined_kernels(hopper.GEMM.source)
    assert {"wg_split_weight", "wg_pack_weight16", "wg_gemm_3x_v", "wg_gemm_1x_s"} <= gemm
    layer = defined_kernels(hopper.DRB_LAYER.source)
    for _, part, _ in hopper.OPERANDS.values():
        assert any(name.startswith(f"wg_drb_layer_{part}_") for name in layer), part
    chain = defined_kernels(hopper.CHAIN.source)
    assert {f"wg_drb_chain_{p}" for p in ("f16", "bf16")} | {
        f"wg_drb_chain_score_{p}" for p in ("f16", "bf16")
    } <= chain
    assert {"wg_drb_layer_3xf16", "wg_drb_layer_3xf16_score"} <= defined_kernels(hopper.LAYER_3XF16.source)
