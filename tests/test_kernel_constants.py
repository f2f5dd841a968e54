"""The launch constants the CuPy backend passes to its stage files (kernels/convolution.cu, projection.cu,
graph_conv.cu, deformation.cu) and kernels/tc_gemm.cu with -D
(xmesh/backends/kernel_constants.py): every name a file uses is either its own #define or in the
backend's table, the file defines none of the table's names itself, its #error guard lists exactly
them, and what the file derives from them is what the host reckons. Runs without a GPU."""

from __future__ import annotations

import re

import pytest

from xmesh.backends import kernel_constants as kc
from xmesh.backends.cuda_kernels import kernel_source

#: names a file may test with #ifdef without the backend passing them, and the per-kernel build's
#: selection names (kernels/kernel_select.cuh: XM_SELECT, XM_WANT_<kernel>, its XM_BUILD_ helpers)
OPTIONAL = {"XM_NO_FP16", "XM_SELECT", "XM_WANT_", "XM_BUILD_"}


def guard_names(source: str) -> set:
    guard = re.search(r"^#if (!defined\(\w+\)(?:\s*\\?\s*\|\|\s*!defined\(\w+\))*)\s*\n#error", source, re.MULTILINE)
    assert guard, "the file has no #if !defined(...) #error guard for the backend's constants"
    return set(re.findall(r"!defined\((\w+)\)", guard.group(1)))


@pytest.mark.parametrize(
    "filename,table,prefix",
    [
        *[(stage, kc.STAGE_DEFINES, "XM_") for stage in kc.STAGE_FILES],
        (kc.GEMM_FILE, {**kc.GEMM_DEFINES, "XG_BK": kc.GEMM_BK}, "XG_"),
    ],
)
def test_each_constant_comes_from_one_python_definition(filename, table, prefix):
    source = re.sub(r"//[^\n]*", "", kernel_source(filename))  # code only, not what comments mention
    own = set(re.findall(rf"^#define ({prefix}\w+)", source, re.MULTILINE))
    used = set(re.findall(rf"\b({prefix}[A-Z0-9_]+)\b", source))
    assert not own & set(table), f"{filename} defines {own & set(table)} itself"
    assert guard_names(source) == set(table)
    missing = used - own - set(table) - OPTIONAL
    assert not missing, f"{filename} uses {missing}, which neither it nor the backend defines"
    assert all(isinstance(v, int) for v in table.values())


def test_defines_are_compiler_options():
    assert kc.defines({"A": 1, "B": 32}, C=4) == ("-DA=1", "-DB=32", "-DC=4")


def evaluate(expr: str, values: dict) -> int:
    """An integer macro expression of our own sources with the names in ``values`` put in."""
    expr = re.sub(r"[A-Za-z_]\w*", lambda m: str(values[m.group(0)]), expr)
    return int(eval(expr, {"__builtins__": {}}))  # digits, + - * / ( ) only


@pytest.mark.parametrize("bk", [kc.GEMM_BK, kc.GEMM_FEW_TILES_BK])
@pytest.mark.parametrize("bn", [16, 32, 64, 128])
def test_gemm_shared_memory_is_what_the_host_reserves(bn, bk):
    """tc_gemm.cu's XG_SMEM_BYTES(BN) (the ring the kernel lays out) equals the dynamic shared memory the
    backend launches it with, for every tile width and both K slice builds."""
    from xmesh.backends.cupy_backend import CupyBackend

    source = kernel_source(kc.GEMM_FILE)
    expr = re.search(r"^#define XG_SMEM_BYTES\(BN\) (.+)$", source, re.MULTILINE).group(1)
    stride = re.search(r"^#define XG_A_STRIDE \(XG_BK \+ (\d+)\)", source, re.MULTILINE).group(1)
    values = {**kc.GEMM_DEFINES, "XG_BK": bk, "XG_A_STRIDE": bk + int(stride), "BN": bn}
    assert evaluate(expr, values) == CupyBackend._gemm_smem(bn, bk)


def test_score_kernels_hold_a_vertex_tile():
    """drb_score_update's block: a thread per (vertex, hypothesis) of its SCORE_VERTICES vertices;
    drb_score_finish's likewise, of its SCORE_FINISH_VERTICES, half a warp of them (16 float2 rows: 128
    bytes a read)."""
    assert kc.SCORE_THREADS >= kc.SCORE_VERTICES * kc.HYPOTHESES and kc.SCORE_THREADS % 32 == 0
    assert kc.SCORE_FINISH_THREADS >= kc.SCORE_FINISH_VERTICES * kc.HYPOTHESES and kc.SCORE_FINISH_THREADS % 32 == 0
    assert kc.SCORE_FINISH_VERTICES * 8 == 128
