"""The GPU routing table (xmesh/backends/plan.py): it agrees with docs/ARCHITECTURE.md's kernel map,
every kernel file is reached by one of its rows (or is a named reference), the kernels it names
exist, and its shape conditions decide as the kernels need. Runs without a GPU."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from xmesh.backends import plan
from xmesh.backends.cuda_kernels import kernel_source
from xmesh.ops import REFERENCES, FastPaths

ROOT = Path(__file__).resolve().parents[1]
KERNELS = sorted(p.name for p in (ROOT / "kernels").glob("*.cu"))


def kernel_map_rows():
    """(op, kernel, source) of each row of ARCHITECTURE.md's kernel map (between its markers)."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    table = text.split("<!-- kernel map -->")[1].split("<!-- end of kernel map -->")[0]
    rows = []
    for line in table.strip().splitlines()[2:]:
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        rows.append(tuple(cells[:3]))
    return rows


def test_the_kernel_map_is_the_plan_table():
    assert kernel_map_rows() == [(r.op, r.kernel, r.source) for r in plan.PLAN]


def test_every_kernel_file_is_reached_by_a_plan_row_or_is_a_named_reference_training_or_benchmark_source():
    reached = {r.source for r in plan.PLAN}
    named = set(plan.REFERENCE_SOURCES) | set(plan.TRAINING_SOURCES) | set(plan.BENCHMARK_SOURCES)
    assert set(KERNELS) == (reached & set(KERNELS)) | named
    assert not reached & named
    for source in reached - set(KERNELS):  # the rows that run Python (cuDNN, NumPy, numba)
        assert (ROOT / "xmesh" / "backends" / source).is_file()


def test_each_kernel_a_row_names_exists():
    """Every kernel name in the table is in a kernel source (a name with {choices} by its fixed part);
    the words that are not kernels (the backend's gemm, cuBLAS, NumPy) are the only exceptions."""
    sources = "\n".join(kernel_source(name) for name in KERNELS)
    not_kernels = {
        "gemm",
        "cuBLAS",
        "NumPy GEMMs",
        "numba_kernels.local_projection",
        "cudnnConvolutionBiasActivationForward",
    }
    for route in plan.PLAN:
        for token in re.split(r" \+ | or |, (?![^{]*})", route.kernel):
            if token in not_kernels:
                continue
            fixed = token.split("{")[0].rstrip("*")
            assert re.search(rf"\b{re.escape(fixed)}", sources), (route.op, token)


def test_every_row_is_for_a_known_mode_and_gpu_and_every_fast_path_has_rows():
    for route in plan.PLAN:
        assert set(route.modes) <= set(plan.ALL_MODES) and route.modes and route.gpu in ("sm90", "any", "cpu")
        assert route.condition and route.why
    ops = {r.op for r in plan.PLAN}
    assert set(REFERENCES) <= ops
    assert {name[3:] for name in vars(FastPaths) if name.startswith("op_")} == set(REFERENCES)


def test_the_printed_plan_follows_mode_and_gpu():
    fp32 = plan.explain("fp32", "sm90", cudnn=True)
    assert "wg_drb_layer_3xf16" in fp32 and "cudnn_conv.py" not in fp32  # cuDNN serves the speed modes only
    fp16 = plan.explain("fp16", "sm90", cudnn=True)
    assert "wg_drb_chain_score_" in fp16 and "cudnn_conv.py" in fp16 and "wg_drb_layer_3xf16" not in fp16
    other = plan.explain("fp16", "any")
    assert "wgmma" not in other and "cuBLAS + gconv_epilogue_*" in other
    assert [r.op for r in plan.routes("fp32", "cpu")] == ["local_projection", "local_gconv"]


def rows(dtype, b=1, n=10, c=339, pad=5, offset=0):
    """(b, 43, n, c) view of rows padded to c + pad elements, starting ``offset`` elements in."""
    full = np.zeros(b * 43 * n * (c + pad) + offset + 64, dtype=dtype)
    start = (-full.ctypes.data % 64) // full.itemsize + offset
    return full[start : start + b * 43 * n * (c + pad)].reshape(b, 43, n, c + pad)[..., :c]


def test_the_chain_takes_16bit_rows_a_multiple_of_8_apart():
    assert plan.chain_takes(rows(np.float16, pad=5), 339)  # rows of 344: the local projection's
    assert plan.chain_takes(rows(np.uint16, pad=5), 339)  # bfloat16 bits
    assert not plan.chain_takes(rows(np.float16, pad=1), 339)  # rows of 340: not whole 16 bytes
    assert not plan.chain_takes(rows(np.float16, pad=5, offset=4), 339)  # 8-byte aligned start
    assert not plan.chain_takes(rows(np.float32, pad=1), 339)
    assert not plan.chain_takes(rows(np.float16, pad=5), 338)  # another width than the weights'
    assert not plan.chain_takes(rows(np.float16, pad=5)[:, :, :4], 339)  # a gap between hypotheses


def test_the_3xf16_layer_takes_float32_rows_a_multiple_of_4_apart():
    assert plan.layer_3xf16_takes(rows(np.float32, pad=1), 339, "mix")
    assert not plan.layer_3xf16_takes(rows(np.float32, pad=1), 339, "")  # no mixing source
    assert not plan.layer_3xf16_takes(rows(np.float32, pad=2), 339, "mix")  # rows of 341 floats
    assert not plan.layer_3xf16_takes(rows(np.float32, pad=1, offset=2), 339, "mix")
    assert not plan.layer_3xf16_takes(rows(np.float16, pad=5), 339, "mix")


@pytest.mark.parametrize(
    "m,n,hopper,bk",
    [
        (106038, 384, True, 16),  # a deformation layer's product at b=1: thousands of tiles
        (2466, 384, False, 32),  # stage 1's last graph convolutions at b=1: 60 tiles
        (156, 384, False, 32),
        (40000, 64, False, 16),  # too narrow for the wgmma GEMM, many tiles of 64
    ],
)
def test_gemm_routing(m, n, hopper, bk):
    assert plan.gemm_on_hopper(m, n) is hopper
    assert plan.gemm_k_slice(3, m, n, 64 if n == 64 else 128) == bk
    assert plan.gemm_k_slice(1, m, n, 128) == 16  # one TF32 pass keeps 16-wide slices
