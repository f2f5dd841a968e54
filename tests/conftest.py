"""Shared test fixtures: where ../shared lives, and skips for what this machine lacks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# ../shared beside the repository; XMESH_SHARED points elsewhere (e.g. a copy carried to a GPU machine).
SHARED = Path(os.environ.get("XMESH_SHARED", ROOT / ".." / "shared")).resolve()


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"the reference folder {SHARED} is missing: tests read ../shared beside the repo")
    return SHARED


@pytest.fixture(scope="session")
def golden_dir(shared_dir) -> Path:
    return shared_dir / "golden"


@pytest.fixture(scope="session")
def demo_dir(shared_dir) -> Path:
    return shared_dir / "demo"


def cuda_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


requires_cuda = pytest.mark.skipif(not cuda_available(), reason="needs CUDA and CuPy")


def eval_argv(data, out, *extra, weights: str | None = "synthetic:1") -> list:
    """`xmesh eval`'s arguments (the subcommand first) for a synthetic dataset ``data`` (its ``root`` and
    ``test_list``), ``weights`` (None: left to ``extra``) and ``out``, without a progress bar; ``extra``
    after them."""
    root = data["root"]
    return [
        "eval",
        "--images",
        str(root),
        "--gt",
        str(root / "gt"),
        "--list",
        str(data["test_list"]),
        *(["--weights", weights] if weights is not None else []),
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]


# GPU fixtures (requested only by tests marked requires_cuda)
@pytest.fixture(scope="module")
def cp():
    """The cupy module."""
    import cupy

    return cupy


@pytest.fixture(scope="module")
def gb():
    """The CuPy backend in its default precision (fp32)."""
    from xmesh.backends import get_backend

    return get_backend("cupy")


@pytest.fixture(scope="module")
def hopper(gb):
    """The fp32 backend's Hopper kernels (cupy_backend.hopper.HopperGemm); the test is skipped on other GPUs."""
    if gb.hopper is None:
        pytest.skip("the wgmma kernel needs compute capability 9.0 (H100/H200)")
    return gb.hopper
