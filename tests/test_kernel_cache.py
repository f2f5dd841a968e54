"""The disk cache of NVRTC-built cubins (xmesh/backends/kernel_cache.py). The cache itself runs
without a GPU (a stand-in compiler); the last test loads a real Hopper kernel through it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from conftest import requires_cuda
from xmesh.backends import kernel_cache
from xmesh.backends.kernel_cache import cache_folder, cached_cubin, cubin_key, read_cubin


class Compiler:
    """A stand-in for NVRTC: counts its calls and returns bytes that depend on the source."""

    def __init__(self, source: str):
        self.calls = 0
        self.source = source

    def __call__(self) -> bytes:
        self.calls += 1
        return b"\x7fELF\n" + self.source.encode() + bytes(range(256))


@pytest.fixture
def folder(tmp_path, monkeypatch):
    target = tmp_path / "cache"
    monkeypatch.setenv("XMESH_KERNEL_CACHE_DIR", str(target))
    return target


def build(source="__global__ void k() {}", arch="sm_90a", options=("-std=c++17",), version=(13, 0)):
    compiler = Compiler(source)
    cubin = cached_cubin("k.cu", source, arch, options, version, compiler)
    return cubin, compiler.calls


def test_the_second_build_is_read_from_disk(folder):
    first, calls_first = build()
    second, calls_second = build()
    assert (calls_first, calls_second) == (1, 0)
    assert second == first
    files = sorted(p.name for p in folder.iterdir())
    assert len(files) == 1 and files[0].startswith("k-sm_90a-") and files[0].endswith(".cubin")


@pytest.mark.parametrize(
    "change",
    [
        {"source": "__global__ void k() { }"},
        {"arch": "sm_100a"},
        {"options": ("-std=c++20",)},
        {"version": (13, 1)},
    ],
)
def test_anything_that_decides_the_bits_is_a_new_build(folder, change):
    build()
    _, calls = build(**change)
    assert calls == 1
    assert len(list(folder.iterdir())) == 2


def test_the_key_separates_its_parts():
    """Parts are length-prefixed: moving text from the options into the source changes the key."""
    assert cubin_key("ab", "sm_90a", ("c",), (13, 0)) != cubin_key("a", "sm_90a", ("bc",), (13, 0))
    assert cubin_key("ab", "sm_90a", ("c",), (13, 0)) == cubin_key("ab", "sm_90a", ("c",), (13, 0))


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_a_damaged_file_is_compiled_again_and_replaced(folder, damage):
    good, _ = build()
    (path,) = folder.iterdir()
    data = path.read_bytes()
    broken = {
        "truncate": data[:-7],
        "flip": data[:-1] + bytes([data[-1] ^ 1]),
        "garbage": b"not a cubin at all",
        "empty": b"",
    }[damage]
    path.write_bytes(broken)
    assert read_cubin(path, warn=False) is None
    with pytest.warns(RuntimeWarning, match="damaged"):
        again, calls = build()
    assert calls == 1 and again == good
    assert read_cubin(path) == good


def test_no_temporary_file_is_left_behind(folder):
    for i in range(3):
        build(source=f"__global__ void k{i}() {{}}")
    names = [p.name for p in folder.iterdir()]
    assert len(names) == 3 and not [n for n in names if n.endswith(".tmp") or n.startswith(".")]


def test_an_empty_setting_turns_the_disk_cache_off(tmp_path, monkeypatch):
    monkeypatch.setenv("XMESH_KERNEL_CACHE_DIR", "")
    monkeypatch.chdir(tmp_path)
    assert cache_folder() is None
    assert [build()[1], build()[1]] == [1, 1]
    assert list(tmp_path.iterdir()) == []


def test_the_default_folder_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("XMESH_KERNEL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_folder() == tmp_path / "xmesh" / "kernels"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_folder() == tmp_path / "home" / ".cache" / "xmesh" / "kernels"


def test_an_unwritable_folder_warns_once_and_still_builds(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("the cache folder would have to be made inside this file")
    monkeypatch.setenv("XMESH_KERNEL_CACHE_DIR", str(blocker / "kernels"))
    monkeypatch.setattr(kernel_cache, "_warned_folders", set())
    with pytest.warns(RuntimeWarning, match="XMESH_KERNEL_CACHE_DIR"):
        cubin, calls = build()
    assert calls == 1 and cubin.startswith(b"\x7fELF")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert build(source="other")[1] == 1  # no second warning for the same folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def _write_concurrently(folder: str, worker: int, start_at: float) -> bytes:
    """One of several processes building the same kernel into one cache folder at the same moment."""
    import os
    import time

    os.environ["XMESH_KERNEL_CACHE_DIR"] = folder
    time.sleep(max(0.0, start_at - time.time()))
    source = "__global__ void shared_kernel() {}" + " " * 100_000  # a large file: the writes overlap
    return cached_cubin("k.cu", source, "sm_90a", ("-std=c++17",), (13, 0), Compiler(source))


def test_processes_that_build_the_same_kernel_at_once_all_succeed(folder):
    """Four processes write the same cache file at once: each gets the whole binary, the file ends whole
    and no temporary file is left."""
    import multiprocessing
    import time

    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        start_at = time.time() + 1.0
        results = pool.starmap(_write_concurrently, [(str(folder), i, start_at) for i in range(4)])
    expected = Compiler("__global__ void shared_kernel() {}" + " " * 100_000)()
    assert results == [expected] * 4
    (path,) = folder.iterdir()
    assert read_cubin(path) == expected


def test_threads_that_build_different_kernels_at_once_all_succeed(folder):
    from concurrent.futures import ThreadPoolExecutor

    sources = [f"__global__ void k{i}() {{}}" for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda s: build(source=s), sources))
    assert [calls for _, calls in results] == [1] * 16
    assert len(list(folder.iterdir())) == 16
    assert [build(source=s) for s in sources] == [(cubin, 0) for cubin, _ in results]


@requires_cuda
@pytest.mark.usefixtures("hopper")
def test_a_cached_hopper_kernel_is_loaded_without_compiling(tmp_path, monkeypatch):
    """On an H100/H200: a fresh process view builds the weight-preparing kernels (wgmma_gemm.cu) and
    stores their cubins; a second fresh one must find them on disk without calling NVRTC, and its
    kernels prepare a weight to the same bits."""
    import cupy

    from xmesh.backends import cuda_kernels
    from xmesh.backends.cupy_backend.hopper import HopperGemm

    monkeypatch.setenv("XMESH_KERNEL_CACHE_DIR", str(tmp_path))
    w = cupy.asarray(np.random.default_rng(7).standard_normal((339, 384), dtype=np.float32))

    def prepared(operands):
        weight = HopperGemm(cupy).prepare(w, operands)
        return [part.get() for part in (weight.big, weight.small) if part is not None]

    cuda_kernels.forget_loaded()
    try:
        compiled = prepared("3xtf32") + prepared("fp16")
        assert sorted(p.name.split("-sm_90a-")[0] for p in tmp_path.iterdir()) == [
            "wgmma_gemm-wg_pack_weight16",
            "wgmma_gemm-wg_split_weight",
        ]

        def no_compiler(*_):
            raise AssertionError("NVRTC was called although the cubin is on disk")

        monkeypatch.setattr(cuda_kernels, "_nvrtc_compile", no_compiler)
        cuda_kernels.forget_loaded()
        loaded = prepared("3xtf32") + prepared("fp16")
        assert len(loaded) == len(compiled) == 3
        assert all(np.array_equal(a, b) for a, b in zip(loaded, compiled))
    finally:
        cuda_kernels.forget_loaded()
