"""The kernels each precision mode runs (xmesh/backends/kernel_manifest.py) and the per-kernel builds
(cuda_kernels, kernels/kernel_select.cuh). The CPU tests read the sources; the GPU test runs every
mode's reconstruction and checks that it asked for no kernel outside its mode's list."""

from __future__ import annotations

import re

import numpy as np
import pytest

from conftest import requires_cuda
from xmesh.backends import cuda_kernels
from xmesh.backends.cuda_kernels import KernelBuild, defined_kernels, kernel_path
from xmesh.backends.cupy_backend import hopper
from xmesh.backends.kernel_manifest import MODES, all_builds, planned_builds, planned_mixing_builds

SOURCES = [
    "convolution.cu",
    "projection.cu",
    "graph_conv.cu",
    "deformation.cu",
    "tc_gemm.cu",
    "nn_bruteforce.cu",
    "wgmma_gemm.cu",
    "wgmma_drb16.cu",
    "wgmma_drb16_chain.cu",
    "wgmma_drb32h.cu",
    "wgmma_wgrad.cu",
    "wgmma_rate.cu",
]


def a_mixing_source() -> str:
    rng = np.random.default_rng(3)
    a1 = np.where(rng.random((43, 43)) < 0.2, rng.standard_normal((43, 43)), 0.0).astype(np.float32)
    return hopper.mixing_source(a1)


def test_every_source_is_listed_and_defines_its_kernels_through_the_selection_macro():
    on_disk = sorted(p.name for p in kernel_path("tc_gemm.cu").parent.glob("*.cu"))
    assert sorted(SOURCES) == on_disk
    counts = {name: len(defined_kernels(name)) for name in SOURCES}
    # tc_gemm: 8 dense + 4 convolution kernels per pass count, and the split-K reduction
    assert counts["tc_gemm.cu"] == 25 and counts["nn_bruteforce.cu"] == 2
    # wgmma_gemm: 4 GEMMs, 2 + 2 + 5 + 5 layer kernels, the training's streamed forward and carried input gradient, 3
    # weight-preparing kernels (the training's paired split among them)
    assert counts["wgmma_gemm.cu"] == 23
    for name in SOURCES:
        text = re.sub(r"//[^\n]*", "", cuda_kernels.kernel_source(name))
        assert text.count('extern "C"') == 2, (
            f"{name} defines a kernel without XM_KERNEL(name), which a per-kernel build cannot leave out"
        )


@pytest.mark.parametrize("hopper", [True, False])
@pytest.mark.parametrize("mode", MODES)
def test_a_modes_kernels_are_in_the_build_steps_set_and_exist(mode, hopper):
    """Every kernel a mode runs (its list, the support's Hopper kernels included) is in the set the
    build step makes for the GPU generation (all_builds), and is defined in the file it is built from."""
    if mode == "bf16" and not hopper:
        pytest.skip("bf16 runs only in the Hopper kernels")
    mixing = a_mixing_source()
    planned = planned_builds(mode, hopper) + (planned_mixing_builds(mode, mixing) if hopper else [])
    assert len(set(planned)) == len(planned), "a kernel is listed twice"
    built = all_builds(hopper, mixing)
    assert set(planned) <= built
    for build in planned:
        assert build.name in defined_kernels(build.file), f"{build.name} is not defined in {build.file}"
        assert (build.arch == "sm_90a") == build.file.startswith("wgmma_")


def test_the_hopper_lists_name_only_hopper_kernels_and_the_others_none():
    generic = all_builds(False)
    assert not [b for b in generic if b.arch is not None]
    assert {b.name for b in planned_builds("fp32", True)} - {b.name for b in planned_builds("fp32", False)} >= {
        "wg_split_weight",
        "wg_pack_weight16",
        "wg_gemm_3x_v",
    }


def test_a_build_selects_its_kernel_alone():
    build = KernelBuild("tc_gemm.cu", "conv_3x_n64", ("-std=c++17", "-DXG_BK=16"))
    text = build.source()
    assert text.startswith("#define XM_SELECT 1\n#define XM_WANT_conv_3x_n64 ~, 1\n")
    assert text.count("#define XM_WANT_") == 1
    other = KernelBuild("tc_gemm.cu", "conv_3x_n32", ("-std=c++17", "-DXG_BK=16"))
    assert other.source() != text  # so the two never share a cache file


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="precision='fp8'"):
        planned_builds("fp8", True)


def test_the_first_compilation_says_what_and_where(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("XMESH_KERNEL_CACHE_DIR", str(tmp_path))
    bar = cuda_kernels._announce(23, "sm_90a")
    if bar is not None:
        bar.close()
    err = capsys.readouterr().err
    assert f"xmesh: compiling 23 GPU kernels for sm_90a (first use on this machine; cached in {tmp_path})" in err


# ------------------------------------------------------------------ GPU
@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize(
    "mode,hopper", [("fp32", True), ("tf32", True), ("fp16", True), ("bf16", True), ("fp32", False), ("fp16", False)]
)
def test_a_reconstruction_runs_only_listed_kernels(mode, hopper, monkeypatch, demo_dir, golden_dir):
    """A reconstruction (batch 1, then 3 and 8: each batch size once eagerly, once captured) asks for
    no kernel outside its mode's list: nothing is built alone, on demand."""
    from xmesh.backends.cupy_backend import CupyBackend
    from xmesh.io.cameras import load_cameras
    from xmesh.io.images import load_images
    from xmesh.io.template import load_template
    from xmesh.io.weights import synthetic_weights
    from xmesh.reconstruct import Reconstructor

    monkeypatch.setenv("XMESH_HOPPER_GEMM", "1" if hopper else "0")
    backend = CupyBackend(precision=mode)
    if hopper and backend.hopper is None:
        pytest.skip("the Hopper kernels need compute capability 9.0 (H100/H200)")
    cuda_kernels.forget_loaded()
    try:
        backend = CupyBackend(precision=mode)
        model = Reconstructor(
            synthetic_weights(1), template=load_template(golden_dir / "template.dat"), backend=backend
        )
        images = load_images([demo_dir / f"plane{i}.png" for i in (1, 2, 3)])
        cameras = load_cameras(demo_dir / "cameras.txt")
        for batch in (1, 1, 3, 3, 8, 8):
            model.run(np.repeat(images[None], batch, axis=0), np.repeat(cameras[None], batch, axis=0))
        on_demand = sorted(
            (b.file, b.name, b.options, b.arch, len(b.prelude)) for b in cuda_kernels.builds_made_on_demand()
        )
        assert not on_demand, "built on demand, not in the mode's list:\n" + "\n".join(map(str, on_demand))
    finally:
        cuda_kernels.forget_loaded()
